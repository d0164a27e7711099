"""PRNG keys for sampling, derived per (prompt id, sample id, position).

  key(b, t) = fold_in(fold_in(fold_in(base_key, prompt_id_b), sample_id_b), t)

A token's randomness therefore depends only on the base key and the token's own coordinates, never
on the batch size, the row order, or the device layout, so the same prompt gives the same samples in
a batch of 4 or 32 and on 1 or 8 devices. The trainer derives the base key from (seed, step) with
``step_key`` so a resumed run repeats an uninterrupted one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def step_key(seed: int, step: int | jax.Array) -> jax.Array:
  """Base sampling key of RL step ``step``: fold_in(key(seed), step)."""
  return jax.random.fold_in(jax.random.key(seed), step)


def row_keys(base_key: jax.Array, prompt_ids: jax.Array, sample_ids: jax.Array) -> jax.Array:
  """One key per row: base_key [] (typed key), prompt_ids [B], sample_ids [B] -> keys [B]."""
  if prompt_ids.shape != sample_ids.shape or prompt_ids.ndim != 1:
    raise ValueError(
      f"prompt_ids {prompt_ids.shape} and sample_ids {sample_ids.shape} must both be [B]"
    )
  fold = jax.vmap(jax.random.fold_in, in_axes=(None, 0))
  by_prompt = fold(base_key, prompt_ids.astype(jnp.uint32))
  return jax.vmap(jax.random.fold_in)(by_prompt, sample_ids.astype(jnp.uint32))


def position_keys(keys: jax.Array, position: int | jax.Array) -> jax.Array:
  """Keys of completion position ``position`` (0 = first generated token): keys [B] -> [B].

  ``position`` is one position for every row, or [B] positions, one per row (the slots of the
  continuous sampler are at different positions); either gives the same key for the same
  (row key, position).
  """
  axis = 0 if jnp.ndim(position) else None
  return jax.vmap(jax.random.fold_in, in_axes=(0, axis))(keys, position)
