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
    k, v: [L, B, S_max, K, H] keys (after RoPE) and values, in the compute dtype.
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
    return self.k.shape[2]

  @property
  def batch_size(self) -> int:
    return self.k.shape[1]


def init_cache(
  config: ModelConfig, batch_size: int, max_len: int, dtype: str | jnp.dtype | None = None
) -> KVCache:
  """An empty cache: zeros for k/v, all positions -1, index 0."""
  dtype = jnp.dtype(config.dtype if dtype is None else dtype)
  shape = (config.num_layers, batch_size, max_len, config.num_kv_heads, config.head_dim)
  return KVCache(
    k=jnp.zeros(shape, dtype),
    v=jnp.zeros(shape, dtype),
    positions=jnp.full((batch_size, max_len), -1, jnp.int32),
    index=jnp.zeros((), jnp.int32),
  )
