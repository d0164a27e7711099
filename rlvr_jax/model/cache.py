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
  """The keys / values of the continuous sampler's decode slots, one buffer pair per layer.

  Each slot (row) decodes whichever (prompt, sample) the queue gave it, with a fill of its own
  (unlike ``KVCache``, whose rows share one write index): its prompt's keys / values are copied
  in when the slot is refilled (``fill_slot_prompts``, from a prompt cache that holds each prompt
  once), and its completion's are written at column t - 1 when token t is sampled.

  Attributes:
    prompt_k, prompt_v: tuples of L arrays [N, K, S, H]: the prompt of each slot's row.
    prompt_positions: [N, S] int32 positions of those prompt tokens, -1 on padding.
    k, v: tuples of L arrays [N, K, T_c, H]: the completion so far (``KVCache`` layout).
    positions: [N, T_c] int32 position of the token in each completion column; -1 = empty (a
      refilled slot has its row reset to -1, so its previous occupant is never read).
  """

  prompt_k: tuple[jax.Array, ...]
  prompt_v: tuple[jax.Array, ...]
  prompt_positions: jax.Array
  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  positions: jax.Array

  @property
  def max_len(self) -> int:
    return self.positions.shape[1]


def init_slot_cache(prompt_cache: KVCache, prompt_index: jax.Array, max_len: int) -> SlotCache:
  """N slots holding the prompts ``prompt_index`` [N] of ``prompt_cache`` (P prompts) and an
  empty completion buffer of ``max_len`` columns."""
  take = lambda a: jnp.take(a, prompt_index, axis=0)
  N = prompt_index.shape[0]
  shape = (N, *prompt_cache.k[0].shape[1:2], max_len, prompt_cache.k[0].shape[3])
  dtype = prompt_cache.k[0].dtype
  return SlotCache(
    prompt_k=tuple(map(take, prompt_cache.k)),
    prompt_v=tuple(map(take, prompt_cache.v)),
    prompt_positions=take(prompt_cache.positions),
    k=tuple(jnp.zeros(shape, dtype) for _ in prompt_cache.k),
    v=tuple(jnp.zeros(shape, dtype) for _ in prompt_cache.v),
    positions=jnp.full((N, max_len), -1, jnp.int32),
  )


def _put_row(buffer: jax.Array, row: jax.Array, n) -> jax.Array:
  """``buffer`` with ``row`` (one slot's entry, no leading axis) written at index n of axis 0; a
  16-bit float buffer is updated as its bits (XLA:CPU runs a bfloat16 dynamic-update-slice as a
  float32 update of the whole buffer)."""
  start = (n,) + (0,) * row.ndim
  if jnp.dtype(buffer.dtype).itemsize == 2 and jnp.issubdtype(buffer.dtype, jnp.floating):
    bits = lambda a: jax.lax.bitcast_convert_type(a, jnp.uint16)
    out = jax.lax.dynamic_update_slice(bits(buffer), bits(row)[None], start)
    return jax.lax.bitcast_convert_type(out, buffer.dtype)
  return jax.lax.dynamic_update_slice(buffer, row[None].astype(buffer.dtype), start)


def fill_slot_prompts(
  slots: SlotCache, fill: jax.Array, prompt_index: jax.Array, prompt_cache: KVCache
) -> SlotCache:
  """``slots`` with the slots ``fill`` [N] bool given prompt ``prompt_index`` [N] of
  ``prompt_cache`` and an empty completion (positions -1). Copies one prompt per filled slot (a
  loop over the filled slots only), so a step that refills nothing copies nothing."""
  N = fill.shape[0]
  (order,) = jnp.nonzero(fill, size=N, fill_value=0)
  count = jnp.sum(fill, dtype=jnp.int32)

  def one(i, s: SlotCache) -> SlotCache:
    n = order[i]
    p = prompt_index[n]
    put = lambda buf, src: _put_row(buf, jax.lax.dynamic_index_in_dim(src, p, 0, False), n)
    return SlotCache(
      prompt_k=tuple(map(put, s.prompt_k, prompt_cache.k)),
      prompt_v=tuple(map(put, s.prompt_v, prompt_cache.v)),
      prompt_positions=put(s.prompt_positions, prompt_cache.positions),
      k=s.k,
      v=s.v,
      positions=s.positions,
    )

  slots = jax.lax.fori_loop(0, count, one, slots)
  positions = jnp.where(fill[:, None], -1, slots.positions)
  return SlotCache(
    prompt_k=slots.prompt_k, prompt_v=slots.prompt_v, prompt_positions=slots.prompt_positions,
    k=slots.k, v=slots.v, positions=positions,
  )  # fmt: skip


def grow_slot_cache(cache: SlotCache, max_len: int) -> SlotCache:
  """``cache`` with ``max_len`` completion columns (the new ones empty); one copy of the
  completion buffers."""
  pad = max_len - cache.max_len
  if pad < 0:
    raise ValueError(f"cannot shrink a slot cache of length {cache.max_len} to {max_len}")
  widths = ((0, 0), (0, 0), (0, pad), (0, 0))
  return SlotCache(
    prompt_k=cache.prompt_k,
    prompt_v=cache.prompt_v,
    prompt_positions=cache.prompt_positions,
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
