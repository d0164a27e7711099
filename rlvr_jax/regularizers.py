"""Regularisers: KL to a reference, entropy bonus and adaptive coefficient, SIREN, Lp-Reg.

METHODS.md §4. Pure functions over ``[B, T]`` float32 arrays; per-token terms are unreduced, scalar
terms take explicit global normalisers (as in :func:`rlvr_jax.losses.aggregate`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from rlvr_jax.losses.aggregation import (
  aggregate,
  as_mask,
  check_choice,
  check_tokens,
  kth_smallest,
  log_ratio,
  masked_sum,
  safe_div,
  token_advantages,
)
from rlvr_jax.types import pytree_dataclass

sg = jax.lax.stop_gradient

KL_ESTIMATORS = ("k1", "k2", "k3", "k3_is", "abs")

# ----------------------------------------------------------------------------------------------
# KL to the reference (§4.1).


def kl_estimate(
  logp: jax.Array,
  ref_logp: jax.Array,
  *,
  estimator: str = "k3",
  old_logp: jax.Array | None = None,
) -> jax.Array:
  """One per-token KL estimator, d = clip(logp - ref_logp, -20, 20) (Schulman's k1/k2/k3).

  * ``k1`` = d: unbiased value of KL(pi || ref); as a LOSS its expected on-policy gradient is 0.
  * ``k2`` = d^2 / 2: biased value; gradient d, whose expectation is grad KL(pi || ref).
  * ``k3`` = e^{-d} - 1 + d: unbiased, >= 0; as a loss its expected gradient is grad KL(ref || pi)
    (the forward KL).
  * ``k3_is`` = r k3 with r = exp(logp - sg(old_logp)) (old_logp defaults to sg(logp)): value k3
    on-policy, gradient unbiased for grad KL(pi || ref) (TRL ``use_bias_correction_kl``).
  * ``abs`` = |d|: verl ``kl_penalty='abs'``; not an unbiased KL estimate (its mean is the mean
    absolute log-ratio, >= |KL|), gradient sign(d) (0 at d = 0): an L1 pull towards the
    reference, constant in size however close.

  Returns [B, T] float32, differentiable in ``logp``.
  """
  check_choice("KL estimator", estimator, KL_ESTIMATORS)
  check_tokens(logp=logp, ref_logp=ref_logp, old_logp=old_logp)
  d = log_ratio(logp, sg(ref_logp))
  if estimator == "k1":
    return d
  if estimator == "k2":
    return 0.5 * d * d
  if estimator == "abs":
    return d * sg(jnp.sign(d))  # |d| with the subgradient pinned to 0 at d = 0 (jnp.abs: 1)
  k3 = jnp.exp(-d) - 1.0 + d
  if estimator == "k3":
    return k3
  anchor = sg(jnp.asarray(logp, jnp.float32)) if old_logp is None else sg(old_logp)
  return jnp.exp(log_ratio(logp, anchor)) * k3


def kl_penalty(
  logp: jax.Array,
  ref_logp: jax.Array,
  *,
  value: str = "k3",
  grad: str = "k2",
  clamp: float | None = 10.0,
  old_logp: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Per-token KL penalty whose VALUE and GRADIENT estimators are chosen separately (§4.1).

    out = k_grad - sg(k_grad) + sg(clip(k_value, -clamp, clamp))   (straight-through),

  so the forward value is (clamped) ``value`` and the gradient is that of ``grad``. The default
  (value k3, gradient k2; verl's ``k3+``) reads a low-variance non-negative KL and descends the
  correct reverse-KL gradient. When ``value == grad`` the clamped estimator itself is returned, so
  its gradient is zero where the clamp is active (the references' behaviour, e.g. verl's
  ``low_var_kl``: for k3 that is d < -2.611 or d > 11).

  Args:
    logp: [B, T] (differentiable); ref_logp: [B, T] (constant).
    value, grad: estimator names in ``KL_ESTIMATORS``.
    clamp: bound on the value estimator (None: no clamp).
    old_logp: [B, T], anchor of the ``k3_is`` ratio.

  Returns:
    ``(kl [B, T], clamped [B, T] bool)``: the penalty and where the clamp is active.
  """
  k_value = kl_estimate(logp, ref_logp, estimator=value, old_logp=old_logp)
  if clamp is None:
    clamped = jnp.zeros(k_value.shape, bool)
    k_clamped = k_value
  else:
    clamped = sg(jnp.abs(k_value) > clamp)
    k_clamped = jnp.clip(k_value, -clamp, clamp)
  if value == grad:
    return k_clamped, clamped
  k_grad = kl_estimate(logp, ref_logp, estimator=grad, old_logp=old_logp)
  return k_grad - sg(k_grad) + sg(k_clamped), clamped


def adaptive_kl_coef(
  coef: jax.Array, kl: jax.Array, *, target: float, horizon: float, num_steps: float = 1.0
) -> jax.Array:
  """verl's adaptive KL controller: beta <- beta (1 + clip(KL / target - 1, -0.2, 0.2) n / horizon)."""
  err = jnp.clip(kl / target - 1.0, -0.2, 0.2)
  return coef * (1.0 + err * num_steps / horizon)


# ----------------------------------------------------------------------------------------------
# Entropy bonus and adaptive coefficient (§4.2, §4.3).


def entropy_bonus(
  entropy: jax.Array, completion_mask: jax.Array, *, coef: float | jax.Array, num_tokens
) -> jax.Array:
  """Partial entropy-bonus loss -c_H sum m H / N_tok (token mean whatever the policy aggregation).

  ``entropy`` [B, T] must be differentiable for the bonus to act. Returns a scalar partial loss.
  """
  check_tokens(entropy=entropy, completion_mask=completion_mask)
  mean_h = safe_div(
    masked_sum(jnp.asarray(entropy, jnp.float32), as_mask(completion_mask)), num_tokens
  )
  return -coef * mean_h


@pytree_dataclass
class AdaptiveEntropyState:
  """Skywork-OR1 controller state (arXiv 2505.22312): coefficient c and last step-mean entropy."""

  coef: jax.Array
  last_entropy: jax.Array


def init_adaptive_entropy(coef: float = 0.005) -> AdaptiveEntropyState:
  """Initial state; ``last_entropy`` = 0 so the bonus applies on the first step."""
  return AdaptiveEntropyState(jnp.asarray(coef, jnp.float32), jnp.asarray(0.0, jnp.float32))


def adaptive_entropy_coef(state: AdaptiveEntropyState, *, target: float = 0.2) -> jax.Array:
  """The coefficient applied during a step: c if H_last <= H_target else 0."""
  return jnp.where(state.last_entropy <= target, state.coef, 0.0)


def update_adaptive_entropy(
  state: AdaptiveEntropyState,
  entropy_mean: jax.Array,
  *,
  target: float = 0.2,
  delta: float = 0.005,
  coef_min: float = 0.0,
  coef_max: float = 1.0,
) -> AdaptiveEntropyState:
  """After a step with exact step-mean entropy H: c <- min(c + delta, c_max) if H <= target else
  max(c - delta, c_min); H_last <- H. A pure function the trainer threads through its state."""
  entropy_mean = jnp.asarray(entropy_mean, jnp.float32)
  coef = jnp.where(
    entropy_mean <= target,
    jnp.minimum(state.coef + delta, coef_max),
    jnp.maximum(state.coef - delta, coef_min),
  )
  return dataclasses.replace(state, coef=coef, last_entropy=entropy_mean)


def proportional_entropy_coef(
  coef: jax.Array, entropy_mean: jax.Array, *, target: float, lr: float
) -> jax.Array:
  """Proportional controller: c <- max(0, c + lr (H_target - H))."""
  return jnp.maximum(0.0, coef + lr * (target - entropy_mean))


# ----------------------------------------------------------------------------------------------
# SIREN (§4.4).


def siren_peak_mask(
  entropy: jax.Array, completion_mask: jax.Array, *, quantile: float = 0.8
) -> jax.Array:
  """[B, T] bool: H_bt > the per-SEQUENCE ``quantile`` of H over valid tokens (linear interp.).

  SIREN (arXiv 2509.25133) takes the quantile along the token axis of each sequence, so the mask is
  independent of how rows are split into micro-batches.
  """
  check_tokens(entropy=entropy, completion_mask=completion_mask)
  valid = as_mask(completion_mask) > 0
  h = sg(jnp.asarray(entropy, jnp.float32))
  big = jnp.finfo(jnp.float32).max  # finite, so an empty row gives q = big (selects nothing)
  ordered = jnp.sort(jnp.where(valid, h, big), axis=-1)  # valid values first, ascending
  n = jnp.sum(valid, axis=-1)
  pos = quantile * jnp.maximum(n - 1, 0).astype(jnp.float32)
  lo = jnp.floor(pos).astype(jnp.int32)
  hi = jnp.minimum(lo + 1, jnp.maximum(n - 1, 0))
  take = lambda idx: jnp.take_along_axis(ordered, idx[:, None], axis=-1)[:, 0]
  q = take(lo) + (pos - lo) * (take(hi) - take(lo))
  return valid & (h > q[:, None])


def siren_penalty(
  entropy: jax.Array,
  completion_mask: jax.Array,
  *,
  anchor: jax.Array | float,
  num_tokens,
  num_seqs,
  coef: float = 0.005,
  quantile: float = 0.8,
  mode: str = "seq_mean_token_mean",
  selected_entropy: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """SIREN penalty lambda (H_sel - H_anchor)^2 on peak tokens (arXiv 2509.25133, §4.4).

  H_sel aggregates the (differentiable, nucleus) entropy over m * peak-mask with ``mode`` and the
  global normalisers. The square of a sum does not split over micro-batches, so for accumulation
  pass ``selected_entropy`` = the step's global H_sel (a no-grad pre-pass, e.g. the sum over
  micro-batches of the returned partials): the partial is then

    lambda (H* - a)^2 * share + 2 lambda (H* - a) (H_part - sg(H_part)),

  whose values sum to the penalty and whose gradients sum to the exact gradient (``share`` is the
  micro-batch's fraction of the normaliser). Without it the micro-batch is taken to be the step.

  A batch without valid tokens gives penalty 0 (with ``selected_entropy``, its share is 0).

  Returns:
    ``(partial penalty, H_sel partial)`` scalars.
  """
  mask = siren_peak_mask(entropy, completion_mask, quantile=quantile)
  h = jnp.asarray(entropy, jnp.float32)
  n_valid = as_mask(completion_mask)
  # n_b of the seq_mean_token_mean mode counts the SELECTED tokens of the row.
  part = aggregate(
    h * mask, mask, mode=mode, num_tokens=num_tokens, num_seqs=num_seqs, seq_norm_constant=1.0
  )
  if selected_entropy is None:
    # Nothing to regularise on a batch without valid tokens: 0, not the constant coef * anchor^2.
    # (The release divides by the empty count; this library's other terms are 0 there too.)
    return jnp.where(jnp.sum(n_valid) > 0, coef * (part - anchor) ** 2, 0.0), part
  if mode == "token_mean":
    share = safe_div(jnp.sum(n_valid), num_tokens)
  else:
    share = safe_div(jnp.sum(jnp.any(n_valid > 0, axis=-1)), num_seqs)
  gap = sg(selected_entropy) - anchor
  return coef * gap**2 * share + 2.0 * coef * gap * (part - sg(part)), part


# ----------------------------------------------------------------------------------------------
# Lp-Reg (§4.5).


def min_p_proxy_logp(logits: jax.Array, tokens: jax.Array, *, min_p: float = 0.02) -> jax.Array:
  """Lp-Reg proxy log-prob log pi~(y) of the min-p-filtered old policy (arXiv 2510.03222).

    pi~(v) = pi_old(v) 1[pi_old(v) >= kappa max_u pi_old(u)] / Z,   filtered logits -> -1e4.

  Args:
    logits: [B, T, V] old-policy logits at temperature 1 (for real vocabularies use
      ``min_p_proxy_logp_from_hidden``, which never builds [B, T, V]). tokens: [B, T] int.

  Returns:
    [B, T] float32 (about -1e4 for filtered tokens, which can never be selected).
  """
  if logits.ndim != 3 or logits.shape[:2] != tokens.shape:
    raise ValueError(
      f"logits must be [B, T, V] matching tokens [B, T]; got {logits.shape}, {tokens.shape}"
    )
  logp = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), axis=-1)
  keep = logp >= jnp.max(logp, axis=-1, keepdims=True) + jnp.log(min_p)
  proxy = jax.nn.log_softmax(jnp.where(keep, logp, -1e4), axis=-1)
  return sg(jnp.take_along_axis(proxy, tokens[..., None], axis=-1)[..., 0])


def min_p_proxy_logp_from_hidden(
  hidden: jax.Array,
  unembed: jax.Array,
  tokens: jax.Array,
  *,
  min_p: float = 0.02,
  temperature: float = 1.0,
  chunk_size: int = 128,
) -> jax.Array:
  """``min_p_proxy_logp`` of logits = hidden @ unembed / temperature, chunked over tokens.

  With z the logits of one position, m = max_v z_v and K = {v : z_v >= m + log kappa} (the min-p
  kept set, kappa = ``min_p``): log pi~(y) = z_y - log sum_{v in K} e^{z_v} for y in K, and
  -1e4 - (log sum_{v in K} e^{z_v} - logsumexp(z)) otherwise (as the reference). One matmul pass over
  tiles of ``chunk_size`` tokens x the whole vocabulary (kept as float32 blocks: chunk_size x V x 4
  bytes); never [B, T, V].

  Args:
    hidden: [B, T, D] old-policy final hidden states. unembed: [D, V]. tokens: [B, T] int.

  Returns:
    [B, T] float32, a constant (no gradient).
  """
  from rlvr_jax.logprobs.fused import min_p_proxy_from_hidden

  return sg(
    min_p_proxy_from_hidden(
      hidden, unembed, tokens, min_p=min_p, temperature=temperature, chunk_size=chunk_size
    )
  )


def lp_reg_threshold(
  logp: jax.Array, advantages: jax.Array, completion_mask: jax.Array, *, lp_reg_frac: float = 0.01
) -> jax.Array:
  """Scope threshold of the Lp-Reg selection: the k-th smallest sg(logp) among valid A < 0 tokens.

  k = max(1, floor(eta |N-|)), eta = ``lp_reg_frac``. As in the reference the term is OFF unless
  k > 1; the threshold is then -inf, which selects nothing.
  """
  shape = check_tokens(logp=logp, completion_mask=completion_mask)
  neg = (as_mask(completion_mask) > 0) & (token_advantages(advantages, shape) < 0)
  k = jnp.maximum(1, jnp.floor(lp_reg_frac * jnp.sum(neg))).astype(jnp.int32)
  thr = kth_smallest(sg(jnp.asarray(logp, jnp.float32)), neg, k)
  return sg(jnp.where(k > 1, thr, -jnp.inf))


def lp_reg_mask(
  logp: jax.Array,
  proxy_logp: jax.Array,
  advantages: jax.Array,
  completion_mask: jax.Array,
  threshold: jax.Array,
) -> jax.Array:
  """[B, T] bool S: valid, A < 0, sg(logp) <= threshold (lowest eta) and logp < proxy_logp."""
  shape = check_tokens(logp=logp, proxy_logp=proxy_logp, completion_mask=completion_mask)
  lp = sg(jnp.asarray(logp, jnp.float32))
  neg = (as_mask(completion_mask) > 0) & (token_advantages(advantages, shape) < 0)
  return neg & (lp <= threshold) & (lp < proxy_logp)


def lp_reg_penalty(
  logp: jax.Array, proxy_logp: jax.Array, *, clamp: float | None = 10.0
) -> jax.Array:
  """k3(logp, proxy) = e^{y - x} - (y - x) - 1, x = logp, y = proxy_logp, clamped to <= clamp.

  Its gradient 1 - pi~/pi_theta < 0 where pi_theta < pi~ raises low-probability tokens toward the
  proxy; the clamp zeros that pull where pi~/pi_theta > 13.6 (expose it; None disables).
  """
  check_tokens(logp=logp, proxy_logp=proxy_logp)
  diff = jnp.clip(sg(jnp.asarray(proxy_logp, jnp.float32)) - logp, -20.0, 20.0)
  k3 = jnp.exp(diff) - diff - 1.0
  return k3 if clamp is None else jnp.minimum(k3, clamp)


__all__ = [
  "KL_ESTIMATORS",
  "AdaptiveEntropyState",
  "adaptive_entropy_coef",
  "adaptive_kl_coef",
  "entropy_bonus",
  "init_adaptive_entropy",
  "kl_estimate",
  "kl_penalty",
  "lp_reg_mask",
  "lp_reg_penalty",
  "lp_reg_threshold",
  "min_p_proxy_logp",
  "proportional_entropy_coef",
  "siren_peak_mask",
  "siren_penalty",
  "update_adaptive_entropy",
]
