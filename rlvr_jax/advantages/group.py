"""Group (outcome) advantage estimators: GRPO family, RLOO, ReMax, CANON, COPO.

Part of :mod:`rlvr_jax.advantages` (import from there). All functions take rewards ``[P, G]``
(row b of the flat batch = prompt b // G, sample b % G), exclude NaN / invalid samples from every
statistic, give them advantage 0, and return float32 ``[P, G]``. Advantages are constants for the
loss: the trainer applies ``jax.lax.stop_gradient`` (they are differentiable only in principle).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlvr_jax.advantages import common

_SCOPES = ("group", "rollout", "none")


def _constant_groups(rewards: jax.Array, mask: jax.Array) -> jax.Array:
  """[P, 1] bool: every valid reward of the group is equal (or the group has < 2 valid)."""
  hi = jnp.max(jnp.where(mask, rewards, -jnp.inf), axis=-1, keepdims=True)
  lo = jnp.min(jnp.where(mask, rewards, jnp.inf), axis=-1, keepdims=True)
  return (jnp.sum(mask, axis=-1, keepdims=True) < 2) | (hi == lo)


def _masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
  """[P, 1] mean of the masked entries of each row (0 for an empty row)."""
  total = jnp.sum(jnp.where(mask, values, 0.0), axis=-1, keepdims=True)
  return common.safe_div(total, jnp.sum(mask, axis=-1, keepdims=True).astype(jnp.float32))


def group_normalized_advantages(
  rewards: jax.Array,
  *,
  valid: jax.Array | None = None,
  mean_scope: str = "group",
  std_scope: str = "group",
  std_ddof: int = 1,
  epsilon: float = 1e-6,
  axis_name: str | None = None,
) -> jax.Array:
  """Baseline-and-scale advantages; GRPO, Dr.GRPO and Lite PPO are presets of it.

    A_{p,g} = (R_{p,g} - mean_{scope_m}(R)) / (std_{scope_s}(R) + epsilon)

  after alibaba/ROLL's ``reward_norm`` (arXiv 2508.08221). Scopes (METHODS.md §1.3):
  ``group`` = the valid samples of prompt p; ``rollout`` = every valid reward passed in (the whole
  rollout batch; inside ``shard_map`` pass ``axis_name`` to reduce over shards); ``none`` = mean 0
  / no division. With either scope ``group``, a group whose valid rewards are all equal (or that
  has fewer than 2 valid samples) gets exactly A = 0, not round-off (or R - mean) over epsilon.

  Constant for the loss: differentiable in principle, the trainer stop-gradients it.

  Args:
    rewards: [P, G] float32 rewards, NaN where the reward computation failed.
    valid: optional [P, G] bool; False samples are excluded like NaN ones.
    mean_scope: "group" | "rollout" | "none".
    std_scope: "group" | "rollout" | "none".
    std_ddof: degrees of freedom of the std (1 = unbiased, verl's default).
    epsilon: denominator guard ε.
    axis_name: mesh axis for ``rollout``-scope sums inside ``jax.shard_map``.

  Returns:
    [P, G] float32 advantages, 0 on invalid samples.
  """
  common.check_choice("mean_scope", mean_scope, _SCOPES)
  common.check_choice("std_scope", std_scope, _SCOPES)
  rewards, mask = common.prepare(rewards, valid)
  group_mean, group_std, _ = common.group_mean_std(rewards, mask, ddof=std_ddof)
  if mean_scope == "rollout" or std_scope == "rollout":
    batch_mean, batch_std, _ = common.batch_mean_std(
      rewards, mask, ddof=std_ddof, axis_name=axis_name
    )
  centred = rewards
  if mean_scope == "group":
    centred = rewards - group_mean
  elif mean_scope == "rollout":
    centred = rewards - batch_mean
  if std_scope == "group":
    centred = centred / (group_std + epsilon)
  elif std_scope == "rollout":
    centred = centred / (batch_std + epsilon)
  if mean_scope == "group" or std_scope == "group":
    # Constant or single-sample groups: exactly 0, instead of round-off (or R - mean) over ε.
    centred = jnp.where(_constant_groups(rewards, mask), 0.0, centred)
  return jnp.where(mask, centred, 0.0)


def grpo_advantages(
  rewards: jax.Array, *, valid: jax.Array | None = None, std_ddof: int = 1, epsilon: float = 1e-6
) -> jax.Array:
  """GRPO group z-score (DeepSeekMath, arXiv 2402.03300).

    A_{p,g} = (R_{p,g} - mean_g R_{p,.}) / (std_g R_{p,.} + ε),   ε = 1e-6, ddof = 1.

  Zero-variance and single-valid-sample groups get A = 0 (verl gives A = R for G = 1).
  Shapes: rewards, valid [P, G] -> [P, G] float32. verl ``grpo``; TRL ``scale_rewards="group"``.

  ε: 1e-6 as verl (``compute_grpo_outcome_advantage``) and the paper's code; TRL adds 1e-4. Kept:
  groups of equal rewards are already exactly 0 here (no ε needed), and for a non-constant group
  ε only matters when std_g < ~1e-3, where TRL's 1e-4 shrinks |A| by up to 10 % at std 1e-3
  (binary rewards never get there: std_g >= 1/sqrt(G), 0.25 at G = 16). Pass ``epsilon=1e-4``
  for TRL.
  Constant for the loss: differentiable in principle, the trainer stop-gradients it.
  """
  return group_normalized_advantages(
    rewards, valid=valid, mean_scope="group", std_scope="group", std_ddof=std_ddof,
    epsilon=epsilon,
  )  # fmt: skip


def dr_grpo_advantages(rewards: jax.Array, *, valid: jax.Array | None = None) -> jax.Array:
  """Dr.GRPO: group mean baseline, no std division (arXiv 2503.20783).

    A_{p,g} = R_{p,g} - mean_g R_{p,.}

  Pair it with ``seq_mean_token_sum_norm`` aggregation and a constant C = L_max; either half
  without the other is a different method. Shapes: [P, G] -> [P, G] float32.
  verl ``grpo`` + ``norm_adv_by_std_in_grpo=False``; TRL ``scale_rewards="none"``.
  Constant for the loss: differentiable in principle, the trainer stop-gradients it.
  """
  return group_normalized_advantages(rewards, valid=valid, mean_scope="group", std_scope="none")


def lite_ppo_advantages(
  rewards: jax.Array,
  *,
  valid: jax.Array | None = None,
  std_ddof: int = 1,
  epsilon: float = 1e-6,
  axis_name: str | None = None,
) -> jax.Array:
  """Lite PPO: group mean, rollout-batch std (arXiv 2508.08221, alibaba/ROLL).

    A_{p,g} = (R_{p,g} - mean_g R_{p,.}) / (std_rollout(R) + ε)

  std_rollout is the ddof = 1 std over all valid raw rewards passed in, so pass the whole rollout
  batch (or shards with ``axis_name`` inside ``shard_map``). Shapes: [P, G] -> [P, G] float32.
  TRL ``scale_rewards="batch"``; ROLL ``reward_norm`` with mean group / std batch.
  Constant for the loss: differentiable in principle, the trainer stop-gradients it.
  """
  return group_normalized_advantages(
    rewards, valid=valid, mean_scope="group", std_scope="rollout", std_ddof=std_ddof,
    epsilon=epsilon, axis_name=axis_name,
  )  # fmt: skip


def rloo_advantages(rewards: jax.Array, *, valid: jax.Array | None = None) -> jax.Array:
  """RLOO leave-one-out baseline (arXiv 2402.14740).

    A_{p,g} = R_{p,g} - (1/(n-1)) Σ_{j≠g} R_{p,j} = n/(n-1) (R_{p,g} - mean_g R_{p,.})

  n = number of valid samples of the group; groups with n < 2 get A = 0 (verl: A = R for G = 1).
  Unbiased, no std. Shapes: [P, G] -> [P, G] float32. verl ``rloo``; TRL ``RLOOTrainer``.
  Constant for the loss: differentiable in principle, the trainer stop-gradients it.
  """
  rewards, mask = common.prepare(rewards, valid)
  mean, _, count = common.group_mean_std(rewards, mask, ddof=0)
  scale = common.safe_div(count, count - 1.0)  # 0 when n = 1; n = 0 rows are masked below.
  return jnp.where(mask & (count > 1), scale * (rewards - mean), 0.0)


def remax_advantages(
  rewards: jax.Array, greedy_rewards: jax.Array, *, valid: jax.Array | None = None
) -> jax.Array:
  """ReMax: the greedy response's reward as baseline (arXiv 2310.10505).

    A_{p,g} = R_{p,g} - R(x_p, ȳ_p),   ȳ_p = greedy (τ = 0) response to prompt p.

  Works with G = 1. A NaN greedy reward invalidates the whole group (A = 0).
  Shapes: rewards [P, G], greedy_rewards [P] -> [P, G] float32. verl ``remax``.
  Constant for the loss: differentiable in principle, the trainer stop-gradients it.
  """
  common.check_rank("rewards", rewards, 2, "P, G")
  common.check_rank("greedy_rewards", greedy_rewards, 1, "P")
  if greedy_rewards.shape[0] != rewards.shape[0]:
    raise ValueError(
      f"greedy_rewards has shape {tuple(greedy_rewards.shape)} [P] but rewards have shape "
      f"{tuple(rewards.shape)} [P, G]."
    )
  rewards, mask = common.prepare(rewards, valid)
  greedy_ok = jnp.isfinite(greedy_rewards)[:, None]
  baseline = jnp.where(greedy_ok, greedy_rewards[:, None], 0.0).astype(jnp.float32)
  return jnp.where(mask & greedy_ok, rewards - baseline, 0.0)


def canon_advantages(
  rewards: jax.Array,
  metric: jax.Array,
  *,
  valid: jax.Array | None = None,
  alpha: float = 1.0,
  beta: float = 0.0,
  lam: float = 1.0,
  max_length: float = 8192.0,
) -> jax.Array:
  """CANON conditional advantage (arXiv 2509.23962, biuboomc/CANON).

  Per group, stable-sort the valid samples by ``metric`` ascending; the first ⌊n/2⌋ form the low
  half L, the rest the high half H; μ_L, μ_H are their mean rewards. Then

    b ∈ H:  A_b = [λ(R_b - α μ_L + β) + (1 - λ)(R_b - μ_H)] / L_max
    b ∈ L:  A_b = [λ(α R_b - μ_H - β) + (1 - λ)(R_b - μ_L)] / L_max

  The first term compares with the other half (inter), the second within the half (intra).
  Groups with fewer than 2 valid samples get A = 0. Use with ``seq_mean_token_sum``.

  Constant for the loss: differentiable in principle, the trainer stop-gradients it.

  Args:
    rewards: [P, G] rewards (NaN = failed).
    metric: [P, G] per-response metric M_b (default in the paper: masked mean of rollout-time
      token entropy; a variant uses the length). Non-finite metric -> sample excluded.
    valid: optional [P, G] bool.
    alpha: α.  beta: β.  lam: λ (1 = pure inter-group).  max_length: L_max.

  Returns:
    [P, G] float32 advantages.
  """
  common.check_rank("metric", metric, 2, "P, G")
  common.check_same_shape(("rewards", "metric"), (rewards, metric))
  rewards, mask = common.prepare(rewards, valid)
  mask = mask & jnp.isfinite(metric)
  key = jnp.where(mask, metric, jnp.inf).astype(jnp.float32)
  order = jnp.argsort(key, axis=-1, stable=True)  # valid samples first, by metric, ties by index
  rank = jnp.argsort(order, axis=-1, stable=True)
  count = jnp.sum(mask, axis=-1, keepdims=True)
  low = mask & (rank < count // 2)
  high = mask & ~low
  mu_low = _masked_mean(rewards, low)
  mu_high = _masked_mean(rewards, high)
  a_high = lam * (rewards - alpha * mu_low + beta) + (1.0 - lam) * (rewards - mu_high)
  a_low = lam * (alpha * rewards - mu_high - beta) + (1.0 - lam) * (rewards - mu_low)
  advantages = jnp.where(low, a_low, a_high) / max_length
  return jnp.where(mask & (count >= 2), advantages, 0.0)


class CopoAdvantages(NamedTuple):
  """Outputs of :func:`copo_advantages`, all float32 and 0 on invalid samples.

  Attributes:
    global_advantages: [P, G] A^glob_p broadcast over the group.
    local_advantages: [P, G] A^loc (GRPO z-score).
    local_weight: [P, G] w_b, the weight of the local PPO term.
    answer_entropy: [P] H_p in bits.
  """

  global_advantages: jax.Array
  local_advantages: jax.Array
  local_weight: jax.Array
  answer_entropy: jax.Array


def copo_advantages(
  rewards: jax.Array,
  answer_ids: jax.Array,
  *,
  valid: jax.Array | None = None,
  sharpness: float = 20.0,
  entropy_threshold: float = 0.5,
  entropy_penalty: bool = False,
  std_ddof: int = 1,
  epsilon: float = 1e-6,
  axis_name: str | None = None,
) -> CopoAdvantages:
  """COPO consistency-aware global + local advantages (arXiv 2508.04138, hijih/copo-code).

    H_p = -Σ_c f_c log2 f_c                       (answer entropy in bits over valid samples)
    R^glob_p = mean_g R_{p,g} [· (1 - λ H_p), λ = (1 - 1/G)/log2 G, only if entropy_penalty]
    A^glob_p = (R^glob_p - mean_p' R^glob) / (std_p' R^glob + ε)     (rollout scope, ddof 1)
    A^loc = GRPO z-score;   w_b = σ(k (H_p - b0)) · 𝟙[A^loc_b ≠ 0]

  The loss blends two PPO terms with the same ratio: ℓ = (1 - w)·ℓ(A^glob) + w·ℓ(A^loc); that
  lives in `losses` because the clipped surrogate is not linear in A. Answers are compared as
  integer ids: the host canonicalises extracted answers and maps them to ids per group (decide
  there whether "1/2" equals "0.5", and how to encode "no answer"). Prompts without valid samples
  do not enter the global statistics.

  Constant for the loss: differentiable in principle, the trainer stop-gradients it.

  Args:
    rewards: [P, G] rewards (NaN = failed).
    answer_ids: [P, G] int ids of the extracted answers; equal id = same answer.
    valid: optional [P, G] bool.
    sharpness: k (released scripts: 20; the function default there is 1).
    entropy_threshold: b0.
    entropy_penalty: multiply R^glob by (1 - λH) (off in every released script).
    std_ddof, epsilon: of the global std.
    axis_name: mesh axis for the rollout-scope statistics inside ``shard_map``.

  Returns:
    A :class:`CopoAdvantages`.
  """
  common.check_rank("answer_ids", answer_ids, 2, "P, G")
  common.check_same_shape(("rewards", "answer_ids"), (rewards, answer_ids))
  local = grpo_advantages(rewards, valid=valid, std_ddof=std_ddof, epsilon=epsilon)
  rewards, mask = common.prepare(rewards, valid)
  group_size = rewards.shape[1]
  same = (answer_ids[:, :, None] == answer_ids[:, None, :]) & mask[:, None, :]
  count = jnp.sum(mask, axis=-1).astype(jnp.float32)
  freq = common.safe_div(jnp.sum(same, axis=-1).astype(jnp.float32), count[:, None])
  log_freq = jnp.log2(jnp.where(mask, freq, 1.0))
  entropy = -common.safe_div(jnp.sum(jnp.where(mask, log_freq, 0.0), axis=-1), count)
  glob = common.safe_div(jnp.sum(rewards, axis=-1), count)
  if entropy_penalty and group_size > 1:
    lam = (1.0 - 1.0 / group_size) / jnp.log2(float(group_size))
    glob = glob * (1.0 - lam * entropy)
  has_valid = count > 0
  mean, std, _ = common.batch_mean_std(glob, has_valid, ddof=std_ddof, axis_name=axis_name)
  glob_adv = jnp.where(has_valid, (glob - mean) / (std + epsilon), 0.0)
  weight = jax.nn.sigmoid(sharpness * (entropy - entropy_threshold))[:, None]
  weight = jnp.where(mask & (local != 0), weight, 0.0)
  return CopoAdvantages(
    global_advantages=jnp.where(mask, glob_adv[:, None], 0.0),
    local_advantages=local,
    local_weight=weight,
    answer_entropy=entropy,
  )
