"""Per-token policy surrogates (METHODS.md §3.1-3.6). Re-exported by :mod:`rlvr_jax.losses`.

Every function returns the UNREDUCED per-token loss ``l [B, T]`` (to be minimised; J = -L) and a
dict of ``[B, T]`` bool masks saying where a clip is active (``"low"``, ``"high"``, ``"dual"``).
Masking and aggregation happen later (``losses.aggregate``). Advantages are treated as constants
(``stop_gradient``), and so are the old / sampler log-probs.

Symbols: delta = clip(logp - old_logp, -20, 20), r = exp(delta), A = advantage, m = mask.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlvr_jax.losses.aggregation import check_tokens, log_ratio, sequence_mean, token_advantages

sg = jax.lax.stop_gradient
ClipInfo = dict[str, jax.Array]


def _inputs(logp, old_logp, advantages):
  shape = check_tokens(logp=logp, old_logp=old_logp)
  adv = sg(token_advantages(advantages, shape))
  return log_ratio(logp, sg(old_logp)), adv


def _no_clip(shape) -> ClipInfo:
  false = jnp.zeros(shape, bool)
  return {"low": false, "high": false, "dual": false}


def ppo_clip_loss(
  logp: jax.Array,
  old_logp: jax.Array,
  advantages: jax.Array,
  *,
  clip_low: float = 0.2,
  clip_high: float = 0.28,
  dual_clip: float | None = None,
  ratio_cap: float | None = None,
  gradient_preserving: bool = False,
) -> tuple[jax.Array, ClipInfo]:
  """PPO clipped surrogate with asymmetric clip-higher and optional dual clip (METHODS.md §3.1).

    l = max(-A r, -A clip(r, 1 - eps_lo, 1 + eps_hi));  if A < 0: l <- min(l, -A c).

  PPO arXiv 1707.06347; dual clip arXiv 1912.09729 (c = ``dual_clip``, > 1); clip-higher from DAPO
  arXiv 2503.14476 (eps_lo = ``clip_low``, eps_hi = ``clip_high``). ``ratio_cap`` caps r in the
  unclipped branch (TRL ``delta``, INTELLECT-2 arXiv 2505.07291).

  ``gradient_preserving=True`` is GPPO (Klear-Reasoner, arXiv 2508.07629, §3.2): the clip bounds
  are written (1 -/+ eps) r / sg(r), so the value is unchanged but a clipped token keeps the
  gradient -A (1 -/+ eps) instead of 0. Dual-clipped tokens still get 0.

  Args:
    logp: [B, T] current log-probs (differentiable).
    old_logp: [B, T] proximal-policy log-probs (constant).
    advantages: [B, T] or [B] (constant).

  Returns:
    ``(l [B, T], {"low", "high", "dual"} -> [B, T] bool)``: where the lower clip (A < 0,
    r < 1 - eps_lo), the upper clip (A > 0, r > 1 + eps_hi) or the dual clip (A < 0,
    max(r, clip(r)) > c, i.e. the clipped loss exceeds -A c: verl's ``pg_clipfrac_lower``) sets the
    value; the fractions are the same for every |A|.
  """
  if dual_clip is not None and not dual_clip > 1.0:
    raise ValueError(f"dual_clip c must be > 1 (or None), got {dual_clip}")
  delta, adv = _inputs(logp, old_logp, advantages)
  ratio = jnp.exp(delta)
  unclipped_ratio = ratio if ratio_cap is None else jnp.minimum(ratio, ratio_cap)
  scale = ratio / sg(ratio) if gradient_preserving else 1.0
  lo, hi = (1.0 - clip_low) * scale, (1.0 + clip_high) * scale
  loss = jnp.maximum(-adv * unclipped_ratio, -adv * jnp.clip(ratio, lo, hi))
  info = {
    "low": (adv < 0) & (sg(ratio) < 1.0 - clip_low),
    "high": (adv > 0) & (sg(ratio) > 1.0 + clip_high),
    "dual": jnp.zeros(ratio.shape, bool),
  }
  if dual_clip is not None:
    # verl's pg_clipfrac_lower: the clipped loss exceeds the bound -A c (for A < 0 that is
    # max(r, clip(r)) > c). The loss already carries -A: comparing -A * loss with -A c (as this
    # function once did) tested loss > c, right only for |A| = 1.
    info["dual"] = (adv < 0) & (sg(loss) > -adv * dual_clip)
    loss = jnp.where(adv < 0, jnp.minimum(loss, -adv * dual_clip), loss)
  return loss, info


def gppo_loss(
  logp: jax.Array,
  old_logp: jax.Array,
  advantages: jax.Array,
  *,
  clip_low: float = 0.2,
  clip_high: float = 0.28,
  dual_clip: float | None = 3.0,
) -> tuple[jax.Array, ClipInfo]:
  """GPPO gradient-preserving clipping (arXiv 2508.07629, METHODS.md §3.2).

  ``ppo_clip_loss(..., gradient_preserving=True)``: same value as PPO-clip; a clipped token's
  gradient is -A (1 + eps_hi) (A > 0, r > 1 + eps_hi) or -A (1 - eps_lo) (A < 0, r < 1 - eps_lo).
  """
  return ppo_clip_loss(
    logp,
    old_logp,
    advantages,
    clip_low=clip_low,
    clip_high=clip_high,
    dual_clip=dual_clip,
    gradient_preserving=True,
  )


def gspo_loss(
  logp: jax.Array,
  old_logp: jax.Array,
  advantages: jax.Array,
  completion_mask: jax.Array,
  *,
  clip_low: float = 3e-4,
  clip_high: float = 4e-4,
  max_log_ratio: float = 10.0,
) -> tuple[jax.Array, ClipInfo]:
  """GSPO sequence-level ratio (Group Sequence Policy Optimization, arXiv 2507.18071, §3.3).

    log s_b = sum_t m delta / n_b,
    s_bt = exp(min(sg(log s_b) + logp_bt - sg(logp_bt), max_log_ratio))   (value min(s_b, e^10)),
    l = max(-A s_bt, -A clip(s_bt, 1 - eps_lo, 1 + eps_hi))   (no dual clip).

  The clip decision is shared by every token of a row; unclipped, dl/dlogp_bt = -A_bt s_b
  (A may vary per token: "GSPO-token"). Use ``seq_mean_token_mean`` aggregation.

  The bound ``max_log_ratio`` clamps the value AND the gradient, as verl's ``compute_policy_loss_gspo``
  (``torch.clamp`` of the combined log-ratio): a row whose log-ratio exceeds it gets no gradient.
  (This library once clamped only the value, so such a row still pushed with -A e^10 per token, the
  largest step of the batch on its most off-policy row; verl's convention is adopted.)

  Args:
    logp, old_logp: [B, T]; advantages: [B, T] or [B]; completion_mask: [B, T] (n_b, row means).
  """
  check_tokens(logp=logp, completion_mask=completion_mask)
  delta, adv = _inputs(logp, old_logp, advantages)
  m = jnp.asarray(completion_mask).astype(jnp.float32)
  seq_log_ratio = sequence_mean(sg(delta), m)
  logp = jnp.asarray(logp, jnp.float32)
  # Clamp value AND gradient (verl): a row past the bound carries no gradient.
  ratio = jnp.exp(jnp.minimum(seq_log_ratio[:, None] + logp - sg(logp), max_log_ratio))
  loss = jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high))
  info = _no_clip(ratio.shape)
  info["low"] = (adv < 0) & (sg(ratio) < 1.0 - clip_low)
  info["high"] = (adv > 0) & (sg(ratio) > 1.0 + clip_high)
  return loss, info


def gmpo_loss(
  logp: jax.Array,
  old_logp: jax.Array,
  advantages: jax.Array,
  completion_mask: jax.Array,
  *,
  clip_low: float = 0.4,
  clip_high: float = 0.4,
) -> tuple[jax.Array, ClipInfo]:
  """GMPO geometric-mean ratio with sign-dependent log-space clipping (arXiv 2507.20673, §3.4).

    A_b = masked mean of A over the row;  A_b > 0: d~_t = min(delta_t, eps_hi);
    A_b < 0: d~_t = max(delta_t, -eps_lo);   rho_b = exp(sum_t m d~_t / n_b);   l_b = -A_b rho_b.

  ``clip_low`` / ``clip_high`` are LOG-space bounds (the ratio stays in e^{+-0.4}), not the PPO
  ratio bounds. The per-row loss l_b is broadcast over the row, so ``seq_mean_token_mean``
  aggregation gives L = mean_b l_b.
  """
  check_tokens(logp=logp, completion_mask=completion_mask)
  delta, adv = _inputs(logp, old_logp, advantages)
  m = jnp.asarray(completion_mask).astype(jnp.float32)
  seq_adv = sequence_mean(adv, m)[:, None]
  high = (seq_adv > 0) & (delta > clip_high)
  low = (seq_adv < 0) & (delta < -clip_low)
  # where (not min/max) so that a clipped token's gradient is exactly 0 and an unclipped one 1.
  clipped = jnp.where(high, clip_high, jnp.where(low, -clip_low, delta))
  rho = jnp.exp(sequence_mean(clipped, m))[:, None]
  loss = jnp.broadcast_to(-seq_adv * rho, delta.shape)
  info = _no_clip(delta.shape)
  info["low"], info["high"] = low, high
  return loss, info


def cispo_loss(
  logp: jax.Array,
  old_logp: jax.Array,
  advantages: jax.Array,
  *,
  weight_min: float | None = None,
  weight_max: float | None = 5.0,
) -> tuple[jax.Array, ClipInfo]:
  """CISPO clipped importance-sampling weight (MiniMax-M1, arXiv 2506.13585, §3.5).

    w = sg(clip(r, w_min, w_max));   l = -w A logp;   dl/dlogp = -w A.

  Both bounds are ABSOLUTE (verl's eps_lo = 10, eps_hi = 0.2 is ``weight_min=None,
  weight_max=1.2``; TRL's cap 5 is ``weight_max=5``). No token is ever dropped. The value of l
  is not a surrogate of J. The info masks say where a bound truncates the weight.
  """
  delta, adv = _inputs(logp, old_logp, advantages)
  ratio = jnp.exp(delta)
  weight = sg(jnp.clip(ratio, weight_min, weight_max))
  info = _no_clip(ratio.shape)
  if weight_min is not None:
    info["low"] = ratio < weight_min
  if weight_max is not None:
    info["high"] = ratio > weight_max
  return -weight * adv * jnp.asarray(logp, jnp.float32), info


def sapo_loss(
  logp: jax.Array,
  old_logp: jax.Array,
  advantages: jax.Array,
  *,
  tau_pos: float = 1.0,
  tau_neg: float = 1.05,
) -> tuple[jax.Array, ClipInfo]:
  """SAPO soft gate instead of a hard clip (Soft Adaptive Policy Optimization, arXiv 2511.20347).

    f_tau(r) = (4 / tau) sigmoid(tau (r - 1)),   l = -A f_tau(r),   tau = tau_pos if A > 0 else tau_neg.

  dl/dlogp = -A 4 sigma (1 - sigma) r, which is -A at r = 1 and decays smoothly away from it.
  Nothing is clipped (the info masks are all False).
  """
  delta, adv = _inputs(logp, old_logp, advantages)
  ratio = jnp.exp(delta)
  tau = jnp.where(adv > 0, tau_pos, tau_neg)
  return -adv * (4.0 / tau) * jax.nn.sigmoid(tau * (ratio - 1.0)), _no_clip(ratio.shape)


def policy_gradient_loss(
  logp: jax.Array, old_logp: jax.Array, advantages: jax.Array
) -> tuple[jax.Array, ClipInfo]:
  """Unclipped importance-weighted policy gradient: l = -A r, dl/dlogp = -A r (KL-Cov base)."""
  delta, adv = _inputs(logp, old_logp, advantages)
  ratio = jnp.exp(delta)
  return -adv * ratio, _no_clip(ratio.shape)
