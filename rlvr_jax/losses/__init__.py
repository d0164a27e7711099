"""Policy losses: per-token surrogates, selections and weights, aggregation, and one objective per
recipe (METHODS.md §1.2, §1.3, §3).

Three levels:

1. Per-token primitives return UNREDUCED ``[B, T]`` float32 losses (to be minimised) plus clip
   masks: ``ppo_clip_loss`` (clip-higher, dual clip, GPPO), ``gspo_loss``, ``gmpo_loss``,
   ``cispo_loss``, ``sapo_loss``, ``policy_gradient_loss``; selections and constant weights:
   Clip-Cov / KL-Cov (``clip_cov_mask``, ``kl_cov_mask``), 80/20 (``high_entropy_mask``), STEER
   (``steer_weights``), sampler/trainer mismatch (``mismatch_weights``, ``opsm_mask``).
2. ``aggregate(per_token_loss, completion_mask, mode=..., num_tokens=..., num_seqs=...)``: the
   micro-batch's partial loss under the GLOBAL step normalisers, so summing partials over
   micro-batches and shards gives the step loss exactly.
3. ``OBJECTIVES[name]``: one ``*_objective`` per recipe, all with one signature::

     loss, metrics = objective(logp, old_logp, advantages, completion_mask, *,
                               num_tokens, num_seqs, ref_logp=None, sampler_logp=None,
                               entropy=None, mean_log_softmax=None, **hyperparameters)

   logp [B, T] float32 (differentiable); old_logp, ref_logp, sampler_logp [B, T] constants;
   advantages [B, T] (or [B]) constant; completion_mask [B, T] bool; entropy [B, T]
   (differentiable where used as a bonus, under stop_gradient where used to select);
   num_tokens / num_seqs: scalars, the mask's token count and the count of rows with a token
   over the whole step batch. Every objective also takes the ``CommonOptions`` keywords
   (``kl_coef``, ``kl_value``, ``kl_grad``, ``kl_clamp``, ``entropy_coef``, ``mismatch``,
   ``mismatch_low``, ``mismatch_high``, ``opsm_threshold``, ``group_size``,
   ``seq_norm_constant``) and ``loss_agg_mode``. Objectives with a batch statistic take
   ``scope`` ('step' default: pass the statistic computed by ``step_statistics`` over the whole
   step batch; 'micro': computed per micro-batch like the references). Masked entries of every
   float input are zeroed before use, so padding may hold anything (even NaN).
   Recipes: ppo, grpo, dr_grpo, dapo, lite_ppo, riskpo, gppo, gspo, gmpo, cispo, sapo, copo,
   clip_cov, kl_cov, high_entropy (80/20), steer, lp_reg, siren.

``metrics`` is a flat dict of ``(value, weight)`` float32 pairs (sum and count for means; the
extreme and count for keys ending in ``/min`` / ``/max``); merge micro-batches with
``merge_metrics`` and read them with ``finalize_metrics``. Every objective reports ``loss/total``,
``loss/policy`` (and ``loss/kl``, ``loss/entropy`` when active; loss metrics are exact when
num_tokens is the step's mask count), ``ratio/{mean,min,max}``, ``clip_frac/{low,high,dual}``,
``kl_old/{k1,k3}``, ``advantage/mean``, ``grad_frac/tokens`` (tokens whose policy-loss gradient
is nonzero), ``grad_frac/groups`` (with ``group_size``), ``kl/{k1,k2,k3}`` (with ``ref_logp``),
``kl/clamp_frac`` (with ``kl_coef``), ``entropy/mean`` (with ``entropy``) and ``mismatch/*``
(with ``sampler_logp``).
"""

import jax
import jax.numpy as jnp

from rlvr_jax import _selection as sel
from rlvr_jax import regularizers as reg
from rlvr_jax._aggregation import (
  AGGREGATION_MODES,
  aggregate,
  finalize_metrics,
  log_ratio,
  masked_mean,
  masked_sum,
  merge_metrics,
)
from rlvr_jax._objectives import CommonOptions, require
from rlvr_jax._recipes import (
  SCOPES,
  cispo_objective,
  copo_objective,
  dapo_objective,
  dr_grpo_objective,
  gmpo_objective,
  gppo_objective,
  grpo_objective,
  gspo_objective,
  lite_ppo_objective,
  ppo_objective,
  riskpo_objective,
  sapo_objective,
)
from rlvr_jax._recipes_entropy import (
  clip_cov_objective,
  high_entropy_objective,
  kl_cov_objective,
  lp_reg_objective,
  siren_objective,
  steer_objective,
)
from rlvr_jax._selection import (
  MISMATCH_MODES,
  CovStats,
  clip_cov_mask,
  clip_cov_stats,
  covariance_scores,
  high_entropy_mask,
  high_entropy_threshold,
  kl_cov_mask,
  kl_cov_stats,
  mismatch_weights,
  opsm_mask,
  steer_omega,
  steer_omega_range,
  steer_weights,
)
from rlvr_jax._surrogates import (
  cispo_loss,
  gmpo_loss,
  gppo_loss,
  gspo_loss,
  policy_gradient_loss,
  ppo_clip_loss,
  sapo_loss,
)

OBJECTIVES = {
  "ppo": ppo_objective,
  "grpo": grpo_objective,
  "dr_grpo": dr_grpo_objective,
  "dapo": dapo_objective,
  "lite_ppo": lite_ppo_objective,
  "riskpo": riskpo_objective,
  "gppo": gppo_objective,
  "gspo": gspo_objective,
  "gmpo": gmpo_objective,
  "cispo": cispo_objective,
  "sapo": sapo_objective,
  "copo": copo_objective,
  "clip_cov": clip_cov_objective,
  "kl_cov": kl_cov_objective,
  "high_entropy": high_entropy_objective,
  "steer": steer_objective,
  "lp_reg": lp_reg_objective,
  "siren": siren_objective,
}

# Recipes whose gradient w.r.t. (logp_t, H_t) is TOKEN-LOCAL (depends on token t's values and on
# constants only) when their batch statistics come from ``step_statistics``: the trainer may then
# fuse the objective into the log-prob sweep (``logprobs.fused_objective_from_hidden``). GSPO / GMPO
# (sequence-level ratios) are not; tests/test_logprobs_fused.py checks every recipe listed here.
TOKEN_LOCAL_OBJECTIVES = ("ppo", "grpo", "dr_grpo", "dapo", "lite_ppo", "riskpo", "gppo", "cispo",
                          "sapo", "copo", "clip_cov", "kl_cov", "high_entropy", "steer", "lp_reg",
                          "siren")  # fmt: skip


def is_token_local(name: str, options: dict) -> bool:
  """Whether objective ``name`` with keyword ``options`` has a token-local gradient: a listed
  recipe, at 'step' scope (statistics computed beforehand), without off-policy sequence masking."""
  return (
    name in TOKEN_LOCAL_OBJECTIVES
    and options.get("scope", "step") == "step"
    and options.get("opsm_threshold") is None
  )


# Objectives whose batch statistics ``step_statistics`` computes (siren: its selected entropy).
STEP_STAT_OBJECTIVES = ("clip_cov", "kl_cov", "high_entropy", "steer", "lp_reg", "siren")


def step_statistics(name, logp, old_logp, advantages, completion_mask, *, num_tokens=None,
                    num_seqs=None, entropy=None, noise=None, **hyperparameters) -> dict:  # fmt: skip
  """The extra keyword arguments objective ``name`` needs at 'step' scope, computed over the WHOLE
  step batch (call it once per step, jitted, before the accumulation loop, with no gradient, and
  pass the result to every micro-batch call). ``logp`` is the current policy's log-prob from that
  pre-pass (old_logp is a rollout-time approximation). Returns {} for objectives without step
  statistics. ``hyperparameters`` are the objective's own (unused ones are ignored).

  Example (trainer)::

    extra = losses.step_statistics(name, logp_nograd, old_logp, adv, mask, entropy=h, noise=u,
                                   num_tokens=n_tok, num_seqs=n_seq, **hyper)
    for micro in micro_batches:  # slice the [B, T] inputs, keep `extra` whole
      loss, metrics = losses.OBJECTIVES[name](..., **extra, **hyper)
  """
  hp = hyperparameters
  lp = jax.lax.stop_gradient(jnp.asarray(logp, jnp.float32))
  if name == "clip_cov":
    kw = {k: hp[k] for k in ("clip_cov_ratio", "cov_low", "cov_high", "clip_low", "clip_high")
          if k in hp}  # fmt: skip
    noise = require(noise, "noise [B, T]", "step_statistics('clip_cov')")
    return {"cov_stats": sel.clip_cov_stats(lp, old_logp, advantages, completion_mask, noise, **kw)}
  if name == "kl_cov":
    kw = {"kl_cov_ratio": hp.get("kl_cov_ratio", 2e-4)}
    return {"cov_stats": sel.kl_cov_stats(lp, advantages, completion_mask, **kw)}
  if name == "high_entropy":
    h = require(entropy, "entropy", "step_statistics('high_entropy')")
    thr = sel.high_entropy_threshold(
      h, completion_mask, top_entropy_frac=hp.get("top_entropy_frac", 0.2)
    )
    return {"entropy_threshold": thr}
  if name == "steer":
    h = require(entropy, "entropy", "step_statistics('steer')")
    omega = sel.steer_omega(lp, old_logp, advantages, h)
    return {"omega_range": sel.steer_omega_range(omega, completion_mask)}
  if name == "lp_reg":
    thr = reg.lp_reg_threshold(lp, advantages, completion_mask,
                               lp_reg_frac=hp.get("lp_reg_frac", 0.01))  # fmt: skip
    return {"lp_threshold": thr}
  if name == "siren":
    h = require(hp.get("nucleus_entropy", entropy), "nucleus_entropy", "step_statistics('siren')")
    _, h_sel = reg.siren_penalty(
      jax.lax.stop_gradient(h), completion_mask, anchor=0.0, num_tokens=num_tokens, num_seqs=num_seqs,
      quantile=hp.get("siren_quantile", 0.8),
    )  # fmt: skip
    return {"siren_selected_entropy": h_sel}
  if name not in OBJECTIVES:
    raise ValueError(f"unknown objective {name!r}; known: {sorted(OBJECTIVES)}")
  return {}


__all__ = [
  "AGGREGATION_MODES",
  "MISMATCH_MODES",
  "OBJECTIVES",
  "SCOPES",
  "STEP_STAT_OBJECTIVES",
  "TOKEN_LOCAL_OBJECTIVES",
  "CommonOptions",
  "CovStats",
  "aggregate",
  "cispo_loss",
  "cispo_objective",
  "copo_objective",
  "clip_cov_mask",
  "clip_cov_objective",
  "clip_cov_stats",
  "covariance_scores",
  "dapo_objective",
  "dr_grpo_objective",
  "finalize_metrics",
  "gmpo_loss",
  "gmpo_objective",
  "gppo_loss",
  "gppo_objective",
  "grpo_objective",
  "gspo_loss",
  "gspo_objective",
  "high_entropy_mask",
  "high_entropy_objective",
  "high_entropy_threshold",
  "is_token_local",
  "kl_cov_mask",
  "kl_cov_objective",
  "kl_cov_stats",
  "lite_ppo_objective",
  "log_ratio",
  "lp_reg_objective",
  "masked_mean",
  "masked_sum",
  "merge_metrics",
  "mismatch_weights",
  "opsm_mask",
  "policy_gradient_loss",
  "ppo_clip_loss",
  "ppo_objective",
  "riskpo_objective",
  "sapo_loss",
  "sapo_objective",
  "siren_objective",
  "steer_objective",
  "steer_omega",
  "steer_omega_range",
  "steer_weights",
  "step_statistics",
]
