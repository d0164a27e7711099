"""Pass@k advantage estimators and the unbiased pass@k metric.

Part of :mod:`rlvr_jax.advantages` (import from there). Rewards are ``[P, G]``; NaN or invalid
samples are excluded and n below is the number of VALID samples of a group. Binomial ratios are
computed as products of k static factors (exact in float32 for the sizes used in RLVR, unlike
``exp(lgamma(.))`` differences). Outputs are constants for the loss (the trainer stop-gradients).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlvr_jax.advantages import common, group


def _check_k(k: int, group_size: int) -> None:
  if not isinstance(k, int) or k < 1 or k > group_size:
    raise ValueError(f"k must be an int in [1, G = {group_size}], got {k!r}.")


def _comb_ratio(a: jax.Array, n: jax.Array, r: int) -> jax.Array:
  """C(a, r) / C(n, r) for integer-valued float arrays a <= n; 0 where a < r (incl. a < 0)."""
  out = jnp.ones(jnp.broadcast_shapes(jnp.shape(a), jnp.shape(n)), jnp.float32)
  for i in range(r):
    out = out * common.safe_div(a - i, n - i)
  return jnp.where((a >= r) & (n >= r), out, 0.0)


def passk_training_advantages(
  rewards: jax.Array,
  *,
  k: int,
  valid: jax.Array | None = None,
  success_threshold: float = 0.5,
) -> jax.Array:
  """Pass@k Training analytic group advantage for binary rewards (arXiv 2508.10751).

  Equals: standardise max-reward over all k-subsets of the group (population std), then give each
  response the mean standardised reward of the subsets containing it. With n valid responses,
  c correct, n⁻ = n - c:

    R̄ = 1 - C(n⁻,k)/C(n,k),  σ = sqrt(R̄(1 - R̄)),
    A_pos = (1 - R̄)/σ,  A_neg = (1 - R̄ - C(n⁻-1,k-1)/C(n-1,k-1))/σ,  A = 0 when σ = 0.

  k = 1 is GRPO with the population std. Groups with n < k get A = 0.

  Constant for the loss: differentiable in principle, the trainer stop-gradients it.

  Args:
    rewards: [P, G] binary rewards (NaN = failed); correct means reward > success_threshold.
    k: subset size (static int, 1 <= k <= G).
    valid: optional [P, G] bool.
    success_threshold: threshold for "correct".

  Returns:
    [P, G] float32 advantages.
  """
  rewards, mask = common.prepare(rewards, valid)
  _check_k(k, rewards.shape[1])
  correct = mask & (rewards > success_threshold)
  n = jnp.sum(mask, axis=-1, keepdims=True).astype(jnp.float32)
  n_neg = n - jnp.sum(correct, axis=-1, keepdims=True).astype(jnp.float32)
  mean = 1.0 - _comb_ratio(n_neg, n, k)
  sigma = common.safe_sqrt(mean * (1.0 - mean))
  a_pos = common.safe_div(1.0 - mean, sigma)
  a_neg = common.safe_div(1.0 - mean - _comb_ratio(n_neg - 1.0, n - 1.0, k - 1), sigma)
  advantages = jnp.where(correct, a_pos, a_neg)
  return jnp.where(mask & (n >= k), advantages, 0.0)


def pkpo_rewards(rewards: jax.Array, *, k: int, valid: jax.Array | None = None) -> jax.Array:
  """PKPO unbiased pass@k reward transform, any real rewards (arXiv 2505.15201).

    s_i = (1/C(n,k)) Σ_{S ∋ i, |S| = k} max_{j ∈ S} R_j

  so that Σ_i s_i ∇log π(y_i) is unbiased for ∇E[max of k samples]. Computed in closed form
  with the valid rewards sorted ascending R_(1) <= ... <= R_(n):

    s_(i) = [C(i-1,k-1) R_(i) + Σ_{j>i} C(j-2,k-2) R_(j)] / C(n,k),   C(., -1) = 0.

  Binary rewards: s = k/n if correct, (k/n)(1 - C(n-1-c,k-1)/C(n-1,k-1)) otherwise.
  Groups with n < k get s = 0. Shapes: [P, G] -> [P, G] float32.
  Constant for the loss: differentiable in principle, the trainer stop-gradients it.
  """
  rewards, mask = common.prepare(rewards, valid)
  _check_k(k, rewards.shape[1])
  n = jnp.sum(mask, axis=-1, keepdims=True).astype(jnp.float32)
  key = jnp.where(mask, rewards, jnp.inf)
  order = jnp.argsort(key, axis=-1, stable=True)
  sorted_rewards = jnp.take_along_axis(rewards, order, axis=-1)
  pos = jnp.arange(1, rewards.shape[1] + 1, dtype=jnp.float32)[None, :]  # 1-based rank i
  in_range = pos <= n
  # C(i-1, k-1)/C(n, k) = [C(i-1, k-1)/C(n, k-1)] * k/(n-k+1).
  w_self = _comb_ratio(pos - 1.0, n, k - 1) * common.safe_div(jnp.float32(k), n - k + 1.0)
  if k >= 2:
    # C(j-2, k-2)/C(n, k) = [C(j-2, k-2)/C(n, k-2)] * k(k-1)/((n-k+2)(n-k+1)).
    scale = common.safe_div(jnp.float32(k * (k - 1)), (n - k + 2.0) * (n - k + 1.0))
    w_other = _comb_ratio(pos - 2.0, n, k - 2) * scale
  else:
    w_other = jnp.zeros_like(pos)
  term = jnp.where(in_range, w_other * sorted_rewards, 0.0)
  after = jnp.flip(jnp.cumsum(jnp.flip(term, -1), axis=-1), -1) - term  # Σ_{j > i}
  s_sorted = jnp.where(in_range, w_self * sorted_rewards + after, 0.0)
  s = jnp.take_along_axis(s_sorted, jnp.argsort(order, axis=-1), axis=-1)
  return jnp.where(mask & (n >= k), s, 0.0)


def pkpo_advantages(rewards: jax.Array, *, k: int, valid: jax.Array | None = None) -> jax.Array:
  """PKPO: the pass@k transform :func:`pkpo_rewards`, then the RLOO baseline (arXiv 2505.15201).

    A = n/(n-1) (s - mean_g s)

  Shapes: [P, G] -> [P, G] float32. Groups with n < max(k, 2) get A = 0.
  Constant for the loss: differentiable in principle, the trainer stop-gradients it.
  """
  s = pkpo_rewards(rewards, k=k, valid=valid)
  mask = common.valid_mask(rewards, valid)
  n = jnp.sum(mask, axis=-1, keepdims=True)
  return jnp.where(n >= k, group.rloo_advantages(s, valid=mask), 0.0)


def max_at_g_advantages(
  rewards: jax.Array,
  *,
  valid: jax.Array | None = None,
  std_ddof: int = 1,
  epsilon: float = 1e-6,
) -> jax.Array:
  """verl's ``grpo_passk``: only the group's best response gets an advantage (arXiv 2503.19595).

    A_best = (R_max - R_second) / (std_g R + ε),   A = 0 for every other response.

  The best response is the first valid argmax; ties give 0. This is a max@G estimator, NOT an
  unbiased pass@k for k < G. Groups with fewer than 2 valid samples get 0.
  Shapes: [P, G] -> [P, G] float32.
  Constant for the loss: differentiable in principle, the trainer stop-gradients it.
  """
  rewards, mask = common.prepare(rewards, valid)
  _, std, count = common.group_mean_std(rewards, mask, ddof=std_ddof)
  masked = jnp.where(mask, rewards, -jnp.inf)
  best = jnp.argmax(masked, axis=-1)
  is_best = jax.nn.one_hot(best, rewards.shape[1], dtype=bool) & mask
  r_max = jnp.max(masked, axis=-1, keepdims=True)
  r_second = jnp.max(jnp.where(is_best, -jnp.inf, masked), axis=-1, keepdims=True)
  gap = jnp.where(count >= 2, r_max - r_second, 0.0)
  return jnp.where(is_best & (count >= 2), gap / (std + epsilon), 0.0)


def pass_at_k(
  rewards: jax.Array,
  *,
  k: int,
  valid: jax.Array | None = None,
  success_threshold: float = 0.5,
) -> jax.Array:
  """Unbiased pass@k estimate per group (evaluation metric, not an advantage).

    pass@k = 1 - C(n - c, k) / C(n, k)      (Chen et al. 2021, arXiv 2107.03374)

  Args:
    rewards: [P, G] binary rewards (NaN = failed, excluded); correct = reward > success_threshold.
    k: static int, 1 <= k <= G.

  Returns:
    [P] float32; NaN for groups with fewer than k valid samples (undefined), so average with
    ``jnp.nanmean``.
  """
  rewards, mask = common.prepare(rewards, valid)
  _check_k(k, rewards.shape[1])
  n = jnp.sum(mask, axis=-1).astype(jnp.float32)
  c = jnp.sum(mask & (rewards > success_threshold), axis=-1).astype(jnp.float32)
  return jnp.where(n >= k, 1.0 - _comb_ratio(n - c, n, k), jnp.nan)
