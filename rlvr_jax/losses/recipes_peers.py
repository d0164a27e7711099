"""Objectives from the peers (verl ``core_algos`` policy losses, TRL ``GRPOTrainer`` loss types) that
the other recipe modules do not cover. Each is a pure ``*_objective`` with the uniform signature
(``rlvr_jax.losses``) and registers its own ``ObjectiveSpec`` right below it, so adding one touches
this file, its tests and the generated table only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlvr_jax.losses import surrogates as sur
from rlvr_jax.losses.aggregation import log_ratio
from rlvr_jax.losses.engine import common_options, make_batch, run_objective
from rlvr_jax.losses.registry import ObjectiveSpec, register_objective

sg = jax.lax.stop_gradient


def _no_clip(shape):
  false = jnp.zeros(shape, bool)
  return {"low": false, "high": false, "dual": false}


def gpg_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                  ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                  loss_agg_mode="token_mean", **options):  # fmt: skip
  """GPG (Group Policy Gradient, arXiv 2504.02546): the plain policy gradient, no ratio, no clip.

    l = -A logp,   dl/dlogp = -A,   ``token_mean``.

  verl ``compute_policy_loss_gpg`` (loss_mode 'gpg'); pair it with the ``gpg`` advantage.
  old_logp only feeds the ratio metrics.
  """
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
                 sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  policy = lambda lp: (-b.advantages * lp, _no_clip(jnp.shape(lp)))
  return run_objective("gpg_objective", policy, b, mode=loss_agg_mode,
                       opts=common_options("gpg_objective", options))  # fmt: skip


register_objective(ObjectiveSpec("gpg", gpg_objective, token_local=True, paper="arXiv 2504.02546"))


DPPO_DIVERGENCES = ("tv", "kl")


def _dppo_policy(b, divergence, clip_low, clip_high, ratio_cap):
  """DPPO-Binary per-token loss and masks (see ``dppo_tv_objective``)."""

  def policy(lp):
    ratio = jnp.exp(log_ratio(lp, b.old_logp))
    weight = sg(jnp.minimum(ratio, ratio_cap))
    p, p_old = jnp.exp(sg(lp)), jnp.exp(b.old_logp)
    if divergence == "tv":
      up_ok, down_ok = p - p_old <= clip_high, p - p_old >= -clip_low
    else:
      kl = p_old * (b.old_logp - sg(lp)) + (1.0 - p_old) * jnp.log(
        (1.0 - p_old + 1e-8) / (1.0 - p + 1e-8)
      )
      up_ok, down_ok = (kl <= clip_high) | (p <= p_old), (kl <= clip_low) | (p >= p_old)
    keep = jnp.where(b.advantages > 0, up_ok, down_ok)
    info = {
      "high": (b.advantages > 0) & ~keep,
      "low": (b.advantages <= 0) & ~keep,
      "dual": keep & (ratio > ratio_cap),  # the truncated-IS cap binds
    }
    return -b.advantages * weight * lp * keep, info

  return policy


def _dppo(name, divergence, logp, old_logp, advantages, completion_mask, num_tokens, num_seqs,
          ref_logp, sampler_logp, entropy, mean_log_softmax, clip_low, clip_high, ratio_cap,
          loss_agg_mode, options):  # fmt: skip
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
                 sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  policy = _dppo_policy(b, divergence, clip_low, clip_high, ratio_cap)
  return run_objective(name, policy, b, mode=loss_agg_mode, opts=common_options(name, options))


def dppo_tv_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                      ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                      clip_low=0.2, clip_high=0.2, ratio_cap=20.0, loss_agg_mode="token_mean",
                      **options):  # fmt: skip
  """DPPO-Binary-TV (Rethinking the Trust Region in LLM RL, arXiv 2602.04879): a trust region on
  the token's probability instead of its ratio.

    p = e^logp, p_old = e^old_logp;   keep = (p - p_old <= eps_hi) if A > 0 else (p - p_old >= -eps_lo)
    l = -A sg(min(r, C)) logp keep,   dl/dlogp = -A min(r, C) on kept tokens, 0 elsewhere.

  eps_lo / eps_hi (``clip_low`` / ``clip_high``) bound the total-variation change of the sampled
  token's probability (verl reuses ``clip_ratio``, default 0.2, for them); C = ``ratio_cap`` = 20 is
  the truncated-IS cap that replaces the dual clip. verl ``compute_policy_loss_dppo_tv``. The value
  of l is not a surrogate of J. ``clip_frac/high`` / ``/low``: tokens outside the region (A > 0 /
  A <= 0); ``clip_frac/dual``: kept tokens whose ratio the cap truncates.
  """
  return _dppo("dppo_tv_objective", "tv", logp, old_logp, advantages, completion_mask, num_tokens,
               num_seqs, ref_logp, sampler_logp, entropy, mean_log_softmax, clip_low, clip_high,
               ratio_cap, loss_agg_mode, options)  # fmt: skip


def dppo_kl_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                      ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                      clip_low=0.2, clip_high=0.2, ratio_cap=20.0, loss_agg_mode="token_mean",
                      **options):  # fmt: skip
  """DPPO-Binary-KL (arXiv 2602.04879): ``dppo_tv_objective`` with the binary KL of the token's
  Bernoulli(p_old) -> Bernoulli(p) as the divergence:

    D = p_old log(p_old / p) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8)),
    keep = (D <= eps_hi or p <= p_old) if A > 0 else (D <= eps_lo or p >= p_old),
    l = -A sg(min(r, C)) logp keep.

  Only moves away from the advantage's direction are bounded. verl ``compute_policy_loss_dppo_kl``.
  """
  return _dppo("dppo_kl_objective", "kl", logp, old_logp, advantages, completion_mask, num_tokens,
               num_seqs, ref_logp, sampler_logp, entropy, mean_log_softmax, clip_low, clip_high,
               ratio_cap, loss_agg_mode, options)  # fmt: skip


register_objective(ObjectiveSpec("dppo_tv", dppo_tv_objective, token_local=True,
                                 paper="arXiv 2602.04879"))  # fmt: skip
register_objective(ObjectiveSpec("dppo_kl", dppo_kl_objective, token_local=True,
                                 paper="arXiv 2602.04879"))  # fmt: skip


def dro_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                  ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                  dro_beta=0.1, loss_agg_mode="token_mean", **options):  # fmt: skip
  """DRO (Direct Reward Optimization; verl loss_mode 'dro', docs/algo/dro.md, PR 7245): a
  quadratic proximal penalty on the log-ratio instead of a clip.

    l = -(A logp - beta/2 (logp - old_logp)^2),   dl/dlogp = -A + beta (logp - old_logp).

  beta = ``dro_beta`` > 0 (verl requires it and has no default; 0.1 here, as ModelScope twinkle's
  port). delta is clamped to +-20 like every log-ratio here (verl leaves it unclamped).
  """
  if not dro_beta > 0:
    raise ValueError(f"dro_objective: dro_beta must be > 0, got {dro_beta}")
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
                 sampler_logp, entropy, mean_log_softmax)  # fmt: skip

  def policy(lp):
    delta = log_ratio(lp, b.old_logp)
    return -(b.advantages * lp - 0.5 * dro_beta * delta * delta), _no_clip(jnp.shape(lp))

  return run_objective("dro_objective", policy, b, mode=loss_agg_mode,
                       opts=common_options("dro_objective", options))  # fmt: skip


register_objective(ObjectiveSpec("dro", dro_objective, token_local=True,
                                 paper="verl docs/algo/dro.md (PR 7245)"))  # fmt: skip


def vespo_weights(log_ratio_tokens, advantages, completion_mask, *, k_pos=2.0, lambda_pos=3.0,
                  k_neg=3.0, lambda_neg=2.0):  # fmt: skip
  """VESPO's per-row gamma weight phi_b (constant; see ``vespo_objective``), [B, T] broadcast."""
  m = jnp.asarray(completion_mask, jnp.float32)
  log_w = jnp.clip(jnp.sum(log_ratio_tokens * m, axis=-1, keepdims=True), jnp.log(1e-8), 20.0)
  pos = advantages >= 0
  k, lam = jnp.where(pos, k_pos, k_neg), jnp.where(pos, lambda_pos, lambda_neg)
  return sg(jnp.exp(lam + k * log_w - lam * jnp.exp(log_w)))


def vespo_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                    ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                    k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0,
                    loss_agg_mode="token_mean", **options):  # fmt: skip
  """VESPO (TRL ``loss_type='vespo'``, ``GRPOTrainer.get_gamma_weights``): REINFORCE scaled by a
  smooth, detached gamma-shaped weight of the SEQUENCE ratio instead of a clip.

    log w_b = clip(sum_t m delta_bt, log 1e-8, 20)   (the sequence log-ratio: a SUM, not a mean),
    phi_b = exp(lambda + k log w_b - lambda w_b) = w_b^k e^{lambda (1 - w_b)}   (phi = 1 at w = 1),
    (k, lambda) = (k_pos, lambda_pos) = (2, 3) if A >= 0 else (k_neg, lambda_neg) = (3, 2),
    l = -sg(phi_b) A logp,   ``token_mean`` (TRL's DAPO normaliser).

  phi peaks at w = k / lambda and decays on both sides, so rows far off-policy fade out smoothly.
  Not token-local (phi reads the whole row).
  """
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
                 sampler_logp, entropy, mean_log_softmax)  # fmt: skip

  def policy(lp):
    delta = log_ratio(sg(lp), b.old_logp)
    phi = vespo_weights(delta, b.advantages, b.completion_mask, k_pos=k_pos,
                        lambda_pos=lambda_pos, k_neg=k_neg, lambda_neg=lambda_neg)  # fmt: skip
    return -phi * b.advantages * lp, _no_clip(jnp.shape(lp))

  return run_objective("vespo_objective", policy, b, mode=loss_agg_mode,
                       opts=common_options("vespo_objective", options))  # fmt: skip


register_objective(ObjectiveSpec("vespo", vespo_objective, paper="TRL GRPOTrainer (vespo)"))


def _sequence_log_ratio(lp, old_logp, completion_mask):
  """[B, 1] mean over the row's valid tokens of delta (differentiable in lp; TRL
  ``importance_sampling_level='sequence'``)."""
  m = jnp.asarray(completion_mask, jnp.float32)
  delta = log_ratio(lp, old_logp) * m
  return (jnp.sum(delta, -1) / jnp.maximum(jnp.sum(m, -1), 1.0))[:, None]


def cispo_seq_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                        ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                        weight_max=5.0, loss_agg_mode="token_mean", **options):  # fmt: skip
  """CISPO with a SEQUENCE-level importance weight (TRL ``loss_type='cispo'`` with
  ``importance_sampling_level='sequence'``; CISPO: MiniMax-M1, arXiv 2506.13585).

    s_b = exp(mean_t m delta_bt),   w_b = sg(min(s_b, w_max)),   l = -w_b A logp,   ``token_mean``.

  ``weight_max`` is absolute (TRL's epsilon_high for CISPO, 5). One weight per row, so not
  token-local; the token-level form is ``cispo``.
  """
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
                 sampler_logp, entropy, mean_log_softmax)  # fmt: skip

  def policy(lp):
    s = jnp.exp(_sequence_log_ratio(sg(lp), b.old_logp, b.completion_mask))
    info = _no_clip(jnp.shape(lp))
    info["high"] = jnp.broadcast_to(s > weight_max, jnp.shape(lp))
    return -sg(jnp.minimum(s, weight_max)) * b.advantages * lp, info

  return run_objective("cispo_seq_objective", policy, b, mode=loss_agg_mode,
                       opts=common_options("cispo_seq_objective", options))  # fmt: skip


register_objective(ObjectiveSpec("cispo_seq", cispo_seq_objective, paper="arXiv 2506.13585"))


def sapo_seq_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                       ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                       tau_pos=1.0, tau_neg=1.05, loss_agg_mode="seq_mean_token_mean",
                       **options):  # fmt: skip
  """SAPO's soft gate on the SEQUENCE ratio (TRL ``loss_type='sapo'`` with
  ``importance_sampling_level='sequence'``; SAPO arXiv 2511.20347).

    s_b = exp(mean_t m delta_bt)   (differentiable),
    l_b = -A (4 / tau) sigmoid(tau (s_b - 1)),   tau = tau_pos if A > 0 else tau_neg,

  broadcast over the row and averaged with ``seq_mean_token_mean`` (so L = mean_b l_b):
  dL/dlogp_bt = -A 4 sigma (1 - sigma) s_b / n_b / N_seq. The token-level form is ``sapo``.
  """
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
                 sampler_logp, entropy, mean_log_softmax)  # fmt: skip

  def policy(lp):
    s = jnp.exp(_sequence_log_ratio(lp, b.old_logp, b.completion_mask))
    tau = jnp.where(b.advantages > 0, tau_pos, tau_neg)
    return -b.advantages * (4.0 / tau) * jax.nn.sigmoid(tau * (s - 1.0)), _no_clip(jnp.shape(lp))

  return run_objective("sapo_seq_objective", policy, b, mode=loss_agg_mode,
                       opts=common_options("sapo_seq_objective", options))  # fmt: skip


register_objective(ObjectiveSpec("sapo_seq", sapo_seq_objective, paper="arXiv 2511.20347"))


def luspo_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                    ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                    clip_low=3e-4, clip_high=4e-4, max_log_ratio=10.0,
                    loss_agg_mode="seq_mean_token_sum", **options):  # fmt: skip
  """LUSPO, TRL's normalize-then-sum reduction (``loss_type='luspo'``): the GSPO sequence ratio
  (normalised over the row's tokens) whose clipped row loss is then SUMMED over the row's tokens:

    l_b = max(-A s_b, -A clip(s_b, 1 - eps_lo, 1 + eps_hi)),   L = sum_b n_b l_b / N_seq,

  i.e. ``surrogates.gspo_loss`` with ``seq_mean_token_sum`` aggregation (TRL: mean_b(l_b n_b)), so
  a long response weighs as much as its tokens, unlike GSPO's per-row mean. Clip defaults are
  GSPO's (3e-4 / 4e-4; TRL takes its shared epsilon).
  """
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
                 sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  policy = lambda lp: sur.gspo_loss(lp, b.old_logp, b.advantages, b.completion_mask,
                                    clip_low=clip_low, clip_high=clip_high,
                                    max_log_ratio=max_log_ratio)  # fmt: skip
  return run_objective("luspo_objective", policy, b, mode=loss_agg_mode,
                       opts=common_options("luspo_objective", options))  # fmt: skip


register_objective(ObjectiveSpec("luspo", luspo_objective, paper="TRL GRPOTrainer (luspo)"))
