"""The key/value cache of the decoder, a pytree dataclass."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlvr_jax.model.config import ModelConfig
from rlvr_jax.types import pytree_dataclass


@pytree_dataclass
class KVCache:
  """Keys, values and positions of every filled slot, for all layers.

  Attributes:
    k, v: [L, B, K, S_max, H] keys (after RoPE) and values, in the compute dtype. Head-major
      (slots inside each kv head) so that a decode step's attention reads each head's
      [S_max, H] block in place; a slot-major [L, B, S_max, K, H] layout made XLA transpose the
      whole cache of every layer at every decode step.
    positions: [B, S_max] int32 position of the token stored in each slot; -1 marks an empty slot
      (never written, or written by a padding token).
    index: int32 scalar, the next slot to write (shared by all rows).
  """

  k: jax.Array
  v: jax.Array
  positions: jax.Array
  index: jax.Array

  @property
  def max_len(self) -> int:
    return self.k.shape[3]

  @property
  def batch_size(self) -> int:
    return self.k.shape[1]


def init_cache(
  config: ModelConfig, batch_size: int, max_len: int, dtype: str | jnp.dtype | None = None
) -> KVCache:
  """An empty cache: zeros for k/v, all positions -1, index 0."""
  dtype = jnp.dtype(config.dtype if dtype is None else dtype)
  shape = (config.num_layers, batch_size, config.num_kv_heads, max_len, config.head_dim)
  return KVCache(
    k=jnp.zeros(shape, dtype),
    v=jnp.zeros(shape, dtype),
    positions=jnp.full((batch_size, max_len), -1, jnp.int32),
    index=jnp.zeros((), jnp.int32),
  )


def cache_logical_axes() -> KVCache:
  """Logical axes of each cache field (for ``rlvr_jax.sharding`` rules)."""
  kv = ("layers", "batch", "kv_heads", "seq", "head_dim")
  return KVCache(k=kv, v=kv, positions=("batch", "seq"), index=())


def cache_shardings(cache: KVCache, mesh, rules) -> KVCache:
  """``NamedSharding`` per cache field on ``mesh`` (rows over the ``batch`` rule)."""
  from rlvr_jax import sharding as sharding_lib

  axes = cache_logical_axes()
  return KVCache(
    **{
      name: sharding_lib.logical_to_sharding(
        getattr(axes, name), mesh, rules, shape=getattr(cache, name).shape
      )
      for name in ("k", "v", "positions", "index")
    }
  )
