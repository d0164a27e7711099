"""Token selection and constant token weights (METHODS.md §3.7-3.10). Re-exported by losses.

Scope (METHODS.md §1.3). Every batch statistic here (means, top-k thresholds, min / max) is computed
by a ``*_stats`` / ``*_threshold`` / ``*_range`` function over exactly the arrays it is given:

* ``micro`` scope: the objective calls it on its own micro-batch (reproduces the references, whose
  results depend on the micro-batch size).
* ``step`` scope (default): the trainer calls it ONCE on the whole step batch before the
  accumulation loop (a jitted no-grad pre-pass; sharded inputs give the exact global statistic, the
  sort runs over the global array) and passes the result to every micro-batch, which makes the loss
  and gradient independent of micro-batching, padding and sharding. Statistics that depend on the
  current policy (logp, entropy) then come from that pre-pass (current parameters, no gradient) or,
  as an approximation, from rollout-time quantities (old_logp, sampler entropy).

All outputs are constants (``stop_gradient``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from rlvr_jax.losses.aggregation import (
  as_mask,
  check_choice,
  check_tokens,
  kth_largest,
  kth_smallest,
  log_ratio,
  masked_mean,
  replicated,
  sequence_mean,
  token_advantages,
)
from rlvr_jax.types import pytree_dataclass

sg = jax.lax.stop_gradient


@pytree_dataclass
class CovStats:
  """Scope statistics for Clip-Cov / KL-Cov: masked means of A and logp and a selection threshold.

  For KL-Cov ``threshold`` is the k-th largest covariance score; for Clip-Cov it is the k-th
  smallest selection noise among the candidates.
  """

  adv_mean: jax.Array
  logp_mean: jax.Array
  threshold: jax.Array


def _num_selected(ratio: float, num_valid: jax.Array) -> jax.Array:
  """k = max(1, floor(ratio * N_valid)) as int32 (Clip-Cov / KL-Cov, METHODS.md §3.7)."""
  return jnp.maximum(1, jnp.floor(ratio * num_valid)).astype(jnp.int32)


def covariance_scores(
  logp: jax.Array, advantages: jax.Array, completion_mask: jax.Array, *, adv_mean, logp_mean
) -> jax.Array:
  """c_bt = (A_bt - mean A)(sg(logp_bt) - mean sg(logp))  (Entropy Mechanism, arXiv 2505.22617).

  The means come from the scope (``cov_stats`` or the micro-batch). Returns [B, T] float32, 0 on
  masked tokens.
  """
  shape = check_tokens(logp=logp, completion_mask=completion_mask)
  adv = token_advantages(advantages, shape)
  scores = (adv - adv_mean) * (sg(jnp.asarray(logp, jnp.float32)) - logp_mean)
  return sg(jnp.where(as_mask(completion_mask) > 0, scores, 0.0))


def _cov_means(logp, advantages, completion_mask):
  shape = check_tokens(logp=logp, completion_mask=completion_mask)
  m = as_mask(completion_mask)
  adv = token_advantages(advantages, shape)
  return sg(masked_mean(adv, m)), sg(masked_mean(jnp.asarray(logp, jnp.float32), m))


def kl_cov_stats(
  logp: jax.Array, advantages: jax.Array, completion_mask: jax.Array, *, kl_cov_ratio: float = 2e-4
) -> CovStats:
  """KL-Cov scope statistics: means and the k-th largest score, k = max(1, floor(kappa N_valid))."""
  adv_mean, logp_mean = _cov_means(logp, advantages, completion_mask)
  scores = covariance_scores(
    logp, advantages, completion_mask, adv_mean=adv_mean, logp_mean=logp_mean
  )
  m = as_mask(completion_mask)
  k = _num_selected(kl_cov_ratio, jnp.sum(m))
  return CovStats(adv_mean, logp_mean, sg(kth_largest(scores, m, k)))


def kl_cov_mask(
  logp: jax.Array, advantages: jax.Array, completion_mask: jax.Array, stats: CovStats
) -> jax.Array:
  """[B, T] bool: the valid tokens whose covariance score is >= the KL-Cov threshold (top-k)."""
  scores = covariance_scores(
    logp, advantages, completion_mask, adv_mean=stats.adv_mean, logp_mean=stats.logp_mean
  )
  return (as_mask(completion_mask) > 0) & (scores >= stats.threshold)


def _clip_cov_candidates(
  logp, old_logp, advantages, completion_mask, adv_mean, logp_mean, *, clip_low, clip_high,
  cov_low, cov_high,
):  # fmt: skip
  shape = check_tokens(logp=logp, old_logp=old_logp, completion_mask=completion_mask)
  adv = token_advantages(advantages, shape)
  scores = covariance_scores(
    logp, advantages, completion_mask, adv_mean=adv_mean, logp_mean=logp_mean
  )
  ratio = jnp.exp(sg(log_ratio(logp, old_logp)))
  ppo_clipped = ((adv > 0) & (ratio > 1.0 + clip_high)) | ((adv < 0) & (ratio < 1.0 - clip_low))
  valid = as_mask(completion_mask) > 0
  return valid & (scores > cov_low) & (scores < cov_high) & ~ppo_clipped


def clip_cov_stats(
  logp: jax.Array,
  old_logp: jax.Array,
  advantages: jax.Array,
  completion_mask: jax.Array,
  noise: jax.Array,
  *,
  clip_cov_ratio: float = 2e-4,
  cov_low: float = 1.0,
  cov_high: float = 5.0,
  clip_low: float = 0.2,
  clip_high: float = 0.28,
) -> CovStats:
  """Clip-Cov scope statistics (METHODS.md §3.7).

  Candidates: valid tokens with cov_low < c < cov_high that the PPO clip does not already clip.
  k = max(1, floor(kappa N_valid)) of them are drawn uniformly at random: the ones with the k
  smallest ``noise`` values ([B, T] uniform, one fixed draw per token of the step batch), so the
  same tokens are drawn whatever the micro-batching. ``threshold`` = the k-th smallest candidate
  noise (+inf when there are fewer than k candidates: all are taken).
  """
  adv_mean, logp_mean = _cov_means(logp, advantages, completion_mask)
  cand = _clip_cov_candidates(
    logp, old_logp, advantages, completion_mask, adv_mean, logp_mean, clip_low=clip_low,
    clip_high=clip_high, cov_low=cov_low, cov_high=cov_high,
  )  # fmt: skip
  k = _num_selected(clip_cov_ratio, jnp.sum(as_mask(completion_mask)))
  return CovStats(adv_mean, logp_mean, sg(kth_smallest(noise, cand, k)))


def clip_cov_mask(
  logp: jax.Array,
  old_logp: jax.Array,
  advantages: jax.Array,
  completion_mask: jax.Array,
  noise: jax.Array,
  stats: CovStats,
  *,
  cov_low: float = 1.0,
  cov_high: float = 5.0,
  clip_low: float = 0.2,
  clip_high: float = 0.28,
) -> jax.Array:
  """[B, T] bool: the Clip-Cov tokens whose loss is zeroed (they still count in N_tok)."""
  check_tokens(logp=logp, noise=noise)
  cand = _clip_cov_candidates(
    logp, old_logp, advantages, completion_mask, stats.adv_mean, stats.logp_mean,
    clip_low=clip_low, clip_high=clip_high, cov_low=cov_low, cov_high=cov_high,
  )  # fmt: skip
  return cand & (noise <= stats.threshold)


TOP_ENTROPY_RULES = ("top_k", "quantile")


def high_entropy_threshold(
  entropy: jax.Array,
  completion_mask: jax.Array,
  *,
  top_entropy_frac: float = 0.2,
  top_entropy_rule: str = "top_k",
) -> jax.Array:
  """80/20 threshold over the valid tokens (Beyond the 80/20 Rule, arXiv 2506.01939; rho =
  ``top_entropy_frac``); ``high_entropy_mask`` keeps the tokens with H >= it.

  * ``top_k`` (default, the official code): the k-th largest entropy, k = ceil(rho N): exactly k
    tokens when the values are distinct.
  * ``quantile`` (TRL ``get_high_entropy_mask``): the (1 - rho) quantile with linear
    interpolation (``torch.quantile``), which keeps N - ceil((1 - rho)(N - 1)) tokens: one fewer
    than ``top_k`` when rho N is not an integer (N = 4, rho = 0.3: 1 token, top_k keeps 2).

  The paper's rule is the default; ``top_entropy_rule='quantile'`` reproduces TRL.
  """
  check_tokens(entropy=entropy, completion_mask=completion_mask)
  check_choice("top_entropy_rule", top_entropy_rule, TOP_ENTROPY_RULES)
  m = as_mask(completion_mask)
  h = jnp.asarray(entropy, jnp.float32)
  if top_entropy_rule == "top_k":
    k = jnp.ceil(top_entropy_frac * jnp.sum(m)).astype(jnp.int32)
    return sg(kth_largest(h, m, k))
  n = jnp.sum(m > 0)
  ordered = jnp.sort(replicated(jnp.where(m > 0, h, jnp.inf)).reshape(-1))  # valid values first
  pos = (1.0 - top_entropy_frac) * jnp.maximum(n - 1, 0).astype(jnp.float32)
  lo = jnp.floor(pos).astype(jnp.int32)
  hi = jnp.minimum(lo + 1, jnp.maximum(n - 1, 0))
  q = ordered[lo] + (pos - lo) * (ordered[hi] - ordered[lo])
  return sg(jnp.where(n > 0, q, jnp.inf))


def high_entropy_mask(
  entropy: jax.Array, completion_mask: jax.Array, threshold: jax.Array
) -> jax.Array:
  """[B, T] bool: valid tokens with sg(H) >= threshold."""
  check_tokens(entropy=entropy, completion_mask=completion_mask)
  return (as_mask(completion_mask) > 0) & (sg(entropy) >= threshold)


def steer_omega(
  logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, entropy: jax.Array
) -> jax.Array:
  """STEER first-order entropy change per token (arXiv 2510.10150, METHODS.md §3.9), under sg.

  p = clip(e^logp, 1e-8, 1 - 1e-8), p_old = clip(e^old_logp, 1e-8, 1),
  Omega = |A / p_old * p (1 - p) (ln p + H)|   (non-finite -> 0).
  """
  shape = check_tokens(logp=logp, old_logp=old_logp, entropy=entropy)
  adv = token_advantages(advantages, shape)
  p = jnp.clip(jnp.exp(sg(jnp.asarray(logp, jnp.float32))), 1e-8, 1.0 - 1e-8)
  p_old = jnp.clip(jnp.exp(jnp.asarray(old_logp, jnp.float32)), 1e-8, 1.0)
  omega = jnp.abs(adv / p_old * p * (1.0 - p) * (jnp.log(p) + sg(entropy)))
  return sg(jnp.where(jnp.isfinite(omega), omega, 0.0))


def steer_omega_range(omega: jax.Array, completion_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(min, max) of Omega over valid tokens of the scope (0, 0 when nothing is valid)."""
  valid = as_mask(completion_mask) > 0
  any_valid = jnp.any(valid)
  lo = jnp.where(any_valid, jnp.min(jnp.where(valid, omega, jnp.inf)), 0.0)
  hi = jnp.where(any_valid, jnp.max(jnp.where(valid, omega, -jnp.inf)), 0.0)
  return sg(lo), sg(hi)


def steer_weights(
  omega: jax.Array,
  *,
  omega_min: jax.Array,
  omega_max: jax.Array,
  mode: str = "exp",
  weight_min: float = 0.8,
  weight_max: float = 1.2,
) -> jax.Array:
  """STEER token weights from Omega (constants).

  * ``exp`` (released default): kappa = -ln w_min / max(Omega_max, 0.02), w = clip(e^{-kappa
    Omega}, w_min, 1) (``weight_max`` unused).
  * ``linear``: w = clip(w_max - (Omega - Omega_min)(w_max - w_min)/(Omega_max - Omega_min), w_min,
    w_max); (w_min + w_max)/2 when Omega_max = Omega_min.
  """
  check_choice("steer mode", mode, ("exp", "linear"))
  if mode == "exp":
    kappa = -math.log(weight_min) / jnp.maximum(omega_max, 0.02)
    return sg(jnp.clip(jnp.exp(-kappa * omega), weight_min, 1.0))
  span = omega_max - omega_min
  flat = span <= 0
  lin = weight_max - (omega - omega_min) * (weight_max - weight_min) / jnp.where(flat, 1.0, span)
  mid = jnp.full_like(omega, 0.5 * (weight_min + weight_max))
  return sg(jnp.where(flat, mid, jnp.clip(lin, weight_min, weight_max)))


MISMATCH_MODES = ("none", "token_truncate", "token_mask", "seq_truncate", "seq_mask", "geo_mask")


def mismatch_weights(
  old_logp: jax.Array,
  sampler_logp: jax.Array,
  completion_mask: jax.Array,
  *,
  mode: str = "token_truncate",
  low: float | None = None,
  high: float | None = 2.0,
) -> jax.Array:
  """Sampler/trainer mismatch correction weights (TIS / MIS / sequence masks; METHODS.md §3.10).

  rho_bt = exp(old_logp - sampler_logp) (decoupled mode; in bypass mode old_logp IS the sampler
  log-prob and no correction must be applied). Bounds are ``low`` (None: no lower bound) and
  ``high`` (None: no upper bound). Per mode, the [B, T] constant weight w:

  * ``token_truncate`` (TIS): clip(rho, low, high)
  * ``token_mask`` (MIS / icepop): rho * 1[low <= rho <= high]
  * ``seq_truncate``: clip(rho_seq, low, high) on every token of the row, rho_seq = exp(sum_t m
    log rho)
  * ``seq_mask``: rho_seq * 1[low <= rho_seq <= high]
  * ``geo_mask``: rho_bt * 1[low <= exp(mean_t log rho) <= high]
  * ``none``: 1
  """
  check_choice("mismatch mode", mode, MISMATCH_MODES)
  check_tokens(old_logp=old_logp, sampler_logp=sampler_logp, completion_mask=completion_mask)
  m = as_mask(completion_mask)
  log_rho = sg(log_ratio(old_logp, sampler_logp))
  lo = -jnp.inf if low is None else low
  hi = jnp.inf if high is None else high
  if mode == "none":
    return jnp.ones_like(log_rho)
  if mode in ("token_truncate", "token_mask"):
    rho = jnp.exp(log_rho)
  elif mode == "geo_mask":
    rho = jnp.exp(log_rho)
    geo = jnp.exp(sequence_mean(log_rho, m))[:, None]
    return jnp.where((geo >= lo) & (geo <= hi), rho, 0.0)
  else:
    seq = jnp.clip(jnp.sum(log_rho * m, axis=-1), -20.0, 20.0)
    rho = jnp.broadcast_to(jnp.exp(seq)[:, None], log_rho.shape)
  if mode.endswith("truncate"):
    return jnp.clip(rho, lo, hi)
  return jnp.where((rho >= lo) & (rho <= hi), rho, 0.0)


def opsm_mask(
  logp: jax.Array,
  sampler_logp: jax.Array,
  advantages: jax.Array,
  completion_mask: jax.Array,
  *,
  threshold: float,
) -> jax.Array:
  """Off-policy sequence mask (DeepSeek-V3.2, arXiv 2512.02556): [B, T] bool keep-mask.

  Drops row b iff mean_t A < 0 and mean_t (sampler_logp - sg(logp)) > ``threshold``.
  """
  shape = check_tokens(logp=logp, sampler_logp=sampler_logp, completion_mask=completion_mask)
  m = as_mask(completion_mask)
  adv = sequence_mean(token_advantages(advantages, shape), m)
  gap = sequence_mean(jnp.asarray(sampler_logp, jnp.float32) - sg(logp), m)
  drop = (adv < 0) & (gap > threshold)
  return jnp.broadcast_to(~drop[:, None], shape)
