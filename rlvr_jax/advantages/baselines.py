"""Baselines from verl's ``core_algos`` advantage estimators that the other parts do not cover. Each
function registers its own ``EstimatorSpec`` right below it, so adding one touches this file, its
tests and the generated table only. Same conventions as the package (group-ordered rows, NaN /
invalid rewards excluded and given A = 0, groups with fewer than 2 valid samples get A = 0 where
verl gives A = R for G = 1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlvr_jax.advantages import common, group
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


def gdpo_advantages(
  rewards: jax.Array,
  reward_components: jax.Array,
  completion_mask: jax.Array,
  *,
  valid: jax.Array | None = None,
  component_weights: tuple[float, ...] | None = None,
  epsilon: float = 1e-6,
) -> jax.Array:
  """GDPO: group reward-decoupled normalisation (arXiv 2601.05242; verl
  ``compute_gdpo_outcome_advantage``). Each reward component is normalised in its group BEFORE
  they are combined, so a dominant component cannot drown the others:

    A_k = GRPO z-score of component k (per group, ddof 1, eps),
    S = sum_k w_k A_k,   A = whiten(S) over the valid completion tokens (token-weighted, verl's
    masked_whiten: mean and ddof-1 variance over tokens, + 1e-8).

  ``rewards`` (the summed reward) only decides validity (NaN = failed). Shapes: rewards [P, G],
  reward_components [P, G, K], completion_mask [B, T] -> [B, T] float32 (token level: the
  whitening weighs rows by their length).
  """
  common.check_rank("reward_components", reward_components, 3, "P, G, K")
  _, mask = common.prepare(rewards, valid)
  num_k = reward_components.shape[-1]
  weights = (1.0,) * num_k if component_weights is None else tuple(component_weights)
  if len(weights) != num_k:
    raise ValueError(f"component_weights has {len(weights)} entries for K = {num_k} components")
  total = sum(
    w * group.grpo_advantages(reward_components[..., k], valid=mask, epsilon=epsilon)
    for k, w in enumerate(weights)
  )
  _row_lengths(completion_mask, total.shape)  # checks [B, T] against [P, G]
  tokens = completion_mask.astype(bool) & mask.reshape(-1)[:, None]
  return common.masked_whiten(jnp.where(tokens, total.reshape(-1)[:, None], 0.0), tokens)


register_estimator(EstimatorSpec(
  "gdpo", gdpo_advantages, level="token", reads=("rewards", "reward_components", "completion_mask"),
  static=("component_weights",), paper="arXiv 2601.05242",
))  # fmt: skip


def _optimal_token_baseline(rewards, completion_mask, old_logp, sum_pi_squared, valid, *,
                            handle_zero_tail, epsilon, compact):  # fmt: skip
  rewards, row_ok = common.prepare(rewards, valid)
  num_p, num_g = rewards.shape
  _row_lengths(completion_mask, rewards.shape)  # checks [B, T] against [P, G]
  common.check_same_shape(("completion_mask", "old_logp", "sum_pi_squared"),
                          (completion_mask, old_logp, sum_pi_squared))  # fmt: skip
  m = completion_mask.astype(bool) & row_ok.reshape(-1)[:, None]
  w = jnp.where(m, 1.0 - 2.0 * jnp.exp(old_logp) + sum_pi_squared, 0.0).astype(jnp.float32)
  if compact:  # step k = the row's k-th valid token (tool / observation tokens skipped)
    order = jnp.argsort(~m, axis=-1, stable=True)
    m, w = jnp.take_along_axis(m, order, -1), jnp.take_along_axis(w, order, -1)
  big_w = jnp.cumsum(w, axis=-1)  # W_t = sum_{j <= t} ||s_j||^2
  ret = jnp.where(m, rewards.reshape(-1)[:, None], 0.0)  # outcome reward-to-go: R on every step
  shape3 = (num_p, num_g, -1)
  mg, wg, rg = m.reshape(shape3), big_w.reshape(shape3), ret.reshape(shape3)
  num = jnp.sum(jnp.where(mg, rg * wg, 0.0), axis=1, keepdims=True)
  den = jnp.sum(jnp.where(mg, wg, 0.0), axis=1, keepdims=True) + epsilon
  baseline = jnp.broadcast_to(num / den, mg.shape)
  if handle_zero_tail:  # the unique longest row gets no baseline past the second-longest length
    length = jnp.sum(mg, axis=-1)  # [P, G]
    top2 = jax.lax.top_k(length, 2)[0]
    longest = (length == top2[:, :1]) & (jnp.sum(length == top2[:, :1], -1, keepdims=True) == 1)
    longest = longest & (top2[:, :1] > top2[:, 1:])
    tail = jnp.arange(mg.shape[-1])[None, None, :] >= top2[:, 1:, None]
    baseline = jnp.where(longest[..., None] & tail, 0.0, baseline)
  enough = (jnp.sum(row_ok, -1) >= 2)[:, None, None]
  adv = jnp.where(mg & enough, rg - baseline, 0.0).reshape(num_p * num_g, -1)
  if compact:
    adv = jnp.take_along_axis(adv, jnp.argsort(order, axis=-1), -1)
  return adv


def optimal_token_baseline_advantages(
  rewards: jax.Array,
  completion_mask: jax.Array,
  old_logp: jax.Array,
  sum_pi_squared: jax.Array,
  *,
  valid: jax.Array | None = None,
  handle_zero_tail: bool = True,
  epsilon: float = 1e-8,
) -> jax.Array:
  """Optimal token baseline (OTB; verl ``compute_optimal_token_baseline_advantage``): a baseline
  per group AND per position, weighted by the path's accumulated score-function variance.

    ||s_j||^2 = 1 - 2 pi_j + sum_v pi(v)^2   (pi_j = e^{old_logp_j}, the sampled token's prob.),
    W_t = sum_{j <= t} m_j ||s_j||^2,   G_t = R (the outcome reward-to-go on every valid token),
    B_{p,t} = sum_g G_{g,t} W_{g,t} m_{g,t} / (sum_g W_{g,t} m_{g,t} + eps),   A = (G - B) m.

  ``handle_zero_tail``: the group's unique longest row gets B = 0 past the second-longest
  length (where B would be its own return). Positions are absolute token indices; with tool /
  observation tokens masked inside a response use ``tir_optimal_token_baseline``. Groups with < 2
  valid samples get A = 0 (verl: no baseline, A = R). Shapes: rewards [P, G]; completion_mask,
  old_logp, sum_pi_squared [B, T] -> [B, T] float32.
  """
  return _optimal_token_baseline(rewards, completion_mask, old_logp, sum_pi_squared, valid,
                                 handle_zero_tail=handle_zero_tail, epsilon=epsilon,
                                 compact=False)  # fmt: skip


_OTB_READS = ("rewards", "completion_mask", "old_logp", "sum_pi_squared")
register_estimator(EstimatorSpec(
  "optimal_token_baseline", optimal_token_baseline_advantages, level="token", reads=_OTB_READS,
  static=("handle_zero_tail",), paper="verl optimal_token_baseline",
))  # fmt: skip


def tir_optimal_token_baseline_advantages(
  rewards: jax.Array,
  completion_mask: jax.Array,
  old_logp: jax.Array,
  sum_pi_squared: jax.Array,
  *,
  valid: jax.Array | None = None,
  handle_zero_tail: bool = True,
  epsilon: float = 1e-8,
) -> jax.Array:
  """Optimal token baseline for tool-integrated responses (verl ``tir_optimal_token_baseline``,
  ``compute_multi_turn_optimal_token_baseline_advantage``): ``optimal_token_baseline_advantages``
  with step t = the row's t-th VALID token, so rows whose tool / observation tokens (masked) sit
  at different places are compared step for step; results go back to the tokens' places. Same
  formula, shapes and conventions; equal to the plain form when every mask is a prefix.
  """
  return _optimal_token_baseline(rewards, completion_mask, old_logp, sum_pi_squared, valid,
                                 handle_zero_tail=handle_zero_tail, epsilon=epsilon,
                                 compact=True)  # fmt: skip


register_estimator(EstimatorSpec(
  "tir_optimal_token_baseline", tir_optimal_token_baseline_advantages, level="token",
  reads=_OTB_READS, static=("handle_zero_tail",), paper="verl tir_optimal_token_baseline",
))  # fmt: skip
