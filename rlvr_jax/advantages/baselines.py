"""Baselines from verl's ``core_algos`` advantage estimators that the other parts do not cover. Each
function registers its own ``EstimatorSpec`` right below it, so adding one touches this file, its
tests and the generated table only. Same conventions as the package (group-ordered rows, NaN /
invalid rewards excluded and given A = 0, groups with fewer than 2 valid samples get A = 0 where
verl gives A = R for G = 1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlvr_jax.advantages import common
from rlvr_jax.advantages.registry import EstimatorSpec, register_estimator


def _row_lengths(completion_mask: jax.Array, shape: tuple[int, int]) -> jax.Array:
  """[P, G] number of completion tokens of each row (checks [B, T] against [P, G])."""
  common.check_rank("completion_mask", completion_mask, 2, "B, T")
  common.check_grouped("completion_mask", completion_mask, shape[0] * shape[1], shape[1], "B, T")
  return jnp.sum(completion_mask.astype(jnp.float32), axis=-1).reshape(shape)


def opo_advantages(
  rewards: jax.Array, completion_mask: jax.Array, *, valid: jax.Array | None = None
) -> jax.Array:
  """OPO: the length-weighted group mean as baseline (On-Policy RL with Optimal Reward Baseline,
  arXiv 2505.23585; verl ``compute_opo_outcome_advantage``).

    b_p = sum_g L_{p,g} R_{p,g} / sum_g L_{p,g},   A_{p,g} = R_{p,g} - b_p,

  L = number of completion tokens (the variance-optimal baseline when the gradient norm grows with
  the length). Valid samples only; groups with < 2 valid samples get A = 0 (verl: b = 0, A = R).
  Shapes: rewards [P, G], completion_mask [B, T] (B = P G) -> [P, G] float32.
  """
  rewards, mask = common.prepare(rewards, valid)
  length = jnp.where(mask, _row_lengths(completion_mask, rewards.shape), 0.0)
  baseline = common.safe_div(
    jnp.sum(length * rewards, -1, keepdims=True), jnp.sum(length, -1, keepdims=True)
  )
  enough = jnp.sum(mask, -1, keepdims=True) >= 2
  return jnp.where(mask & enough, rewards - baseline, 0.0)


register_estimator(EstimatorSpec("opo", opo_advantages, reads=("rewards", "completion_mask"),
                                 paper="arXiv 2505.23585"))  # fmt: skip


def gpg_advantages(
  rewards: jax.Array, *, valid: jax.Array | None = None, f_norm: float = 1.0
) -> jax.Array:
  """GPG group baseline with batch re-scaling (Group Policy Gradient, arXiv 2504.02546; verl
  ``compute_gpg_outcome_advantage``).

    alpha = n_valid / max(1, #{valid samples with R != 0}),
    A_{p,g} = alpha (R_{p,g} - mean_g R_{p,.}) / f_norm.

  alpha (over the whole batch passed in: rollout scope) compensates for the samples whose reward is
  0, which carry no gradient of their own. No std division. Groups with < 2 valid samples get
  A = 0 (verl: mean 0, A = alpha R). Pair with the ``gpg`` objective. [P, G] -> [P, G].
  """
  rewards, mask = common.prepare(rewards, valid)
  mean, _, count = common.group_mean_std(rewards, mask, ddof=0)
  nonzero = jnp.sum(mask & (rewards != 0)).astype(jnp.float32)
  alpha = jnp.sum(mask).astype(jnp.float32) / jnp.maximum(nonzero, 1.0)
  return jnp.where(mask & (count >= 2), alpha * (rewards - mean) / f_norm, 0.0)


register_estimator(EstimatorSpec("gpg", gpg_advantages, paper="arXiv 2504.02546"))
