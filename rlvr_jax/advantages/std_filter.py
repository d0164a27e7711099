"""RLPR's adaptive standard-deviation filter (a stateful prompt filter for model-side rewards).

Part of :mod:`rlvr_jax.advantages` (import from there). Returns a ``[P]`` bool ``keep`` mask (drop
a prompt by masking its rows out of the loss, as ``handle_zero_variance(..., "mask")`` does); pure
and jittable. PRIME's accuracy band [0.2, 0.8] is a pass-rate filter on the outcome.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlvr_jax.advantages import common


class StdFilterState(NamedTuple):
  """Carry of ``rlpr_std_filter``: the EMA of the mean group std and the batches seen (int32)."""

  ema: jax.Array
  steps: jax.Array


def std_filter_init() -> StdFilterState:
  return StdFilterState(jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32))


def rlpr_std_filter(
  rewards: jax.Array,
  state: StdFilterState,
  *,
  valid: jax.Array | None = None,
  beta: float = 0.5,
  decay: float = 0.99,
  start_step: int = 11,
  std_ddof: int = 0,
) -> tuple[jax.Array, StdFilterState, dict[str, jax.Array]]:
  """RLPR's adaptive standard-deviation filter (arXiv 2506.18254; METHODS.md §5.7).

    s_p = std_g R_{p,g},   s̄ = mean_p s_p (groups with ≥ 2 valid rows),
    EMA ← s̄ on the first batch, else decay·EMA + (1 − decay)·s̄,
    keep_p = s_p ≥ β·EMA   from batch ``start_step`` on (1-based), every prompt before.

  The EMA is updated with the current batch before thresholding. METHODS.md marks the quantity
  fed into the EMA as uncertain; we take the mean of the per-group stds, as it assumes.
  Groups with fewer than 2 valid rows are dropped once the filter is active.

  Args:
    rewards: [P, G] rewards (NaN = failed).
    state: :class:`StdFilterState` (``std_filter_init()`` to start).
    valid: optional [P, G] bool.  beta: β.  decay: EMA decay.  start_step: first active batch.
    std_ddof: of the group std (0: numpy's default, as the reference).

  Returns:
    (keep [P] bool, new state, metrics {"std_filter/kept_fraction", "std_filter/ema",
    "std_filter/mean_std"}).
  """
  rewards, mask = common.prepare(rewards, valid)
  _, std, count = common.group_mean_std(rewards, mask, ddof=std_ddof)
  std, count = std[:, 0], count[:, 0]
  usable = count >= 2
  mean_std = common.safe_div(jnp.sum(jnp.where(usable, std, 0.0)), jnp.sum(usable))
  steps = state.steps + 1
  ema = jnp.where(state.steps == 0, mean_std, decay * state.ema + (1.0 - decay) * mean_std)
  active = steps >= start_step
  keep = jnp.where(active, usable & (std >= beta * ema), True)
  metrics = {
    "std_filter/kept_fraction": jnp.mean(keep.astype(jnp.float32)),
    "std_filter/ema": ema,
    "std_filter/mean_std": mean_std,
  }
  return keep, StdFilterState(ema.astype(jnp.float32), steps), metrics
