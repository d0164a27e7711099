"""The key/value cache of the decoder, a pytree dataclass with one buffer per layer."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlvr_jax.model.config import ModelConfig
from rlvr_jax.types import pytree_dataclass


@pytree_dataclass
class KVCache:
  """Keys, values and positions of every filled slot, one buffer per layer.

  Attributes:
    k: tuple of L arrays [B, K, S_max, H]: keys after RoPE, slots inside each kv head, so that
      a decode step writes each (row, kv head)'s new key as one contiguous [H] run.
    v: tuple of L arrays [B, K, S_max, H]: values, the same layout, so that the
      probabilities-times-values product reads each head's [S_max, H] block in place.
    positions: [B, S_max] int32 position of the token stored in each slot; -1 marks an empty slot
      (never written, or written by a padding token).
    index: int32 scalar, the next slot to write (shared by all rows).

  Why per-layer buffers and these layouts (measured on XLA:CPU, SmolLM2-135M shapes, see
  docs/benchmarks.md): a stacked [L, ...] cache read by a layer ``scan`` is copied out layer by
  layer at every decode step; a slot-major [B, S_max, K, H] layout made XLA transpose the whole
  cache every step. Keys were stored transposed, [H, S_max], until session 15: the scores were
  then an ``A B`` matmul, but each step's write of one slot became B K H scattered 2-byte
  stores, about 0.2 ms per layer in a SmolLM2 decode step on the AMD EPYC machine, while the
  ``A B^T`` scores on [S_max, H] keys cost the same as the ``A B`` form there.
  """

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  positions: jax.Array
  index: jax.Array

  @property
  def num_layers(self) -> int:
    return len(self.k)

  @property
  def max_len(self) -> int:
    return self.positions.shape[1]

  @property
  def batch_size(self) -> int:
    return self.positions.shape[0]


@pytree_dataclass
class SlotCache:
  """The completion keys / values of the continuous sampler's decode slots, one buffer per layer.

  Unlike ``KVCache`` each slot (row) has its own fill: a slot holds the completion of whichever
  (prompt, sample) it is decoding, written at column t - 1 when token t is sampled, and its
  prompt's keys / values live once per prompt in a ``KVCache`` (the prompt cache) that every slot
  of that prompt reads (``decoder.decode_slots``).

  Attributes:
    k, v: tuples of L arrays [N, K, T_c, H] (the ``KVCache`` layout, N slots, T_c columns).
    positions: [N, T_c] int32 position of the token in each column; -1 = empty (a refilled slot
      has its row reset to -1, so its previous occupant's keys are never read).
  """

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  positions: jax.Array

  @property
  def max_len(self) -> int:
    return self.positions.shape[1]


def init_slot_cache(config: ModelConfig, num_slots: int, max_len: int, dtype) -> SlotCache:
  """Empty slots: zeros, every position -1."""
  shape, _ = kv_shapes(config, num_slots, max_len)
  return SlotCache(
    k=tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers)),
    v=tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers)),
    positions=jnp.full((num_slots, max_len), -1, jnp.int32),
  )


def grow_slot_cache(cache: SlotCache, max_len: int) -> SlotCache:
  """``cache`` with ``max_len`` columns (the new ones empty); one copy of every buffer."""
  pad = max_len - cache.max_len
  if pad < 0:
    raise ValueError(f"cannot shrink a slot cache of length {cache.max_len} to {max_len}")
  widths = ((0, 0), (0, 0), (0, pad), (0, 0))
  return SlotCache(
    k=tuple(jnp.pad(k, widths) for k in cache.k),
    v=tuple(jnp.pad(v, widths) for v in cache.v),
    positions=jnp.pad(cache.positions, ((0, 0), (0, pad)), constant_values=-1),
  )


def kv_shapes(config: ModelConfig, batch_size: int, max_len: int) -> tuple[tuple, tuple]:
  """Shapes of one layer's key and value buffers: both [B, K, S_max, H]."""
  B, K, H = batch_size, config.num_kv_heads, config.head_dim
  return (B, K, max_len, H), (B, K, max_len, H)


def to_cache_layout(k: jax.Array, v: jax.Array, dtype) -> tuple[jax.Array, jax.Array]:
  """New keys / values [B, S, K, H] -> one layer's buffer layout [B, K, S, H]."""
  return jnp.swapaxes(k, 1, 2).astype(dtype), jnp.swapaxes(v, 1, 2).astype(dtype)


def init_cache(
  config: ModelConfig, batch_size: int, max_len: int, dtype: str | jnp.dtype | None = None
) -> KVCache:
  """An empty cache: zeros for k/v, all positions -1, index 0."""
  dtype = jnp.dtype(config.activation_dtype if dtype is None else dtype)
  k_shape, v_shape = kv_shapes(config, batch_size, max_len)
  return KVCache(
    k=tuple(jnp.zeros(k_shape, dtype) for _ in range(config.num_layers)),
    v=tuple(jnp.zeros(v_shape, dtype) for _ in range(config.num_layers)),
    positions=jnp.full((batch_size, max_len), -1, jnp.int32),
    index=jnp.zeros((), jnp.int32),
  )


def grow_cache(cache: KVCache, max_len: int) -> KVCache:
  """``cache`` with its slots extended to ``max_len`` (new slots empty: zeros, position -1).

  Copies every buffer once; ``sampling.generate`` grows its cache between decode phases so that
  each step attends over the slots filled so far rather than all ``S + T``.
  """
  pad = max_len - cache.max_len
  if pad < 0:
    raise ValueError(f"cannot shrink a cache of length {cache.max_len} to {max_len}")
  return KVCache(
    k=tuple(jnp.pad(k, ((0, 0),) * 2 + ((0, pad), (0, 0))) for k in cache.k),
    v=tuple(jnp.pad(v, ((0, 0),) * 2 + ((0, pad), (0, 0))) for v in cache.v),
    positions=jnp.pad(cache.positions, ((0, 0), (0, pad)), constant_values=-1),
    index=cache.index,
  )


def cache_logical_axes(num_layers: int) -> KVCache:
  """Logical axes of each cache field (for ``rlvr_jax.sharding`` rules)."""
  kv = ("batch", "kv_heads", "seq", "head_dim")
  return KVCache(k=(kv,) * num_layers, v=(kv,) * num_layers, positions=("batch", "seq"), index=())


def cache_shardings(cache: KVCache, mesh, rules) -> KVCache:
  """``NamedSharding`` per cache array on ``mesh`` (rows over the ``batch`` rule)."""
  from rlvr_jax import sharding as sharding_lib

  def one(axes, array):
    return sharding_lib.logical_to_sharding(axes, mesh, rules, shape=array.shape)

  axes = cache_logical_axes(cache.num_layers)
  return KVCache(
    k=tuple(map(one, axes.k, cache.k)),
    v=tuple(map(one, axes.v, cache.v)),
    positions=one(axes.positions, cache.positions),
    index=one(axes.index, cache.index),
  )
