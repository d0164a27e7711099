"""Objectives with token selection or entropy terms (Clip-Cov, KL-Cov, 80/20, STEER, Lp-Reg, SIREN).

Same uniform signature and ``CommonOptions`` as every objective (see ``rlvr_jax.losses``). Each has a
batch statistic with a ``scope`` ('step' default: the statistic is a required keyword computed once
over the whole step batch by ``losses.step_statistics``; 'micro': computed per micro-batch, like the
references).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlvr_jax import regularizers as reg
from rlvr_jax.losses import selection as sel
from rlvr_jax.losses import surrogates as sur
from rlvr_jax.losses.aggregation import (
  as_mask,
  check_choice,
  log_ratio,
  mean_metric,
  token_advantages,
)
from rlvr_jax.losses.engine import clean_input, common_options, make_batch, require, run_objective
from rlvr_jax.losses.recipes import _ppo, _stat

sg = jax.lax.stop_gradient


def clip_cov_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                       ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                       clip_low=0.2, clip_high=0.28, clip_cov_ratio=2e-4, cov_low=1.0,
                       cov_high=5.0, scope="step", cov_stats=None, noise=None, key=None,
                       loss_agg_mode="token_mean", **options):  # fmt: skip
  """Clip-Cov (The Entropy Mechanism of RL for Reasoning LMs, arXiv 2505.22617; §3.7).

  PPO-clip without dual clip, except that k = max(1, floor(kappa N)) random tokens among those with
  cov_low < (A - mean A)(logp - mean logp) < cov_high (and not PPO-clipped) get loss 0 (they stay
  in N_tok). Extra inputs: ``noise`` [B, T] uniform (one draw per token of the step batch; at
  'micro' scope a ``key`` may be given instead) and, at 'step' scope, ``cov_stats`` =
  ``losses.clip_cov_stats`` over the step batch.
  """
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
                 sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  name = "clip_cov_objective"
  if noise is None and key is not None and scope == "micro":
    noise = jax.random.uniform(key, jnp.shape(b.logp))
  noise = require(noise, "noise [B, T] (uniform per token) or, at scope='micro', a key", name)
  noise = clean_input(b, noise, "noise")
  kw = dict(clip_low=clip_low, clip_high=clip_high, cov_low=cov_low, cov_high=cov_high)
  lp = sg(b.logp)
  stats = _stat(
    name,
    scope,
    cov_stats,
    "cov_stats",
    lambda: sel.clip_cov_stats(
      lp, b.old_logp, b.advantages, b.completion_mask, noise, clip_cov_ratio=clip_cov_ratio, **kw
    ),
  )
  zeroed = sel.clip_cov_mask(lp, b.old_logp, b.advantages, b.completion_mask, noise, stats, **kw)
  extra = {"select/frac": mean_metric(zeroed.astype(jnp.float32), as_mask(b.completion_mask))}
  return _ppo(name, b, options, mode=loss_agg_mode, token_weights=1.0 - zeroed, extra=extra,
              clip_low=clip_low, clip_high=clip_high)  # fmt: skip


def kl_cov_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                     ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                     kl_cov_ratio=2e-4, kl_cov_coef=1.0, scope="step", cov_stats=None,
                     loss_agg_mode="token_mean", **options):  # fmt: skip
  """KL-Cov (arXiv 2505.22617; §3.7): unclipped -A r everywhere, plus beta |logp - old_logp| on the
  top-k covariance tokens (k = max(1, floor(kappa N))). The subgradient of |.| at 0 is pinned to 0.
  At 'step' scope pass ``cov_stats`` = ``losses.kl_cov_stats`` over the step batch.
  """
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
                 sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  name = "kl_cov_objective"
  lp = sg(b.logp)
  stats = _stat(
    name,
    scope,
    cov_stats,
    "cov_stats",
    lambda: sel.kl_cov_stats(lp, b.advantages, b.completion_mask, kl_cov_ratio=kl_cov_ratio),
  )
  chosen = sel.kl_cov_mask(lp, b.advantages, b.completion_mask, stats)

  def policy(x):
    loss, info = sur.policy_gradient_loss(x, b.old_logp, b.advantages)
    delta = log_ratio(x, b.old_logp)
    return jnp.where(chosen, loss + kl_cov_coef * delta * sg(jnp.sign(delta)), loss), info

  extra = {"select/frac": mean_metric(chosen.astype(jnp.float32), as_mask(b.completion_mask))}
  opts = common_options(name, options)
  return run_objective(name, policy, b, mode=loss_agg_mode, opts=opts, extra_metrics=extra)


def high_entropy_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                           ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                           top_entropy_frac=0.2, clip_low=0.2, clip_high=0.28, dual_clip=10.0,
                           normalize_by="selected", top_entropy_rule="top_k", scope="step",
                           entropy_threshold=None, loss_agg_mode="token_mean",
                           **options):  # fmt: skip
  """80/20 high-entropy token selection (arXiv 2506.01939; §3.8): the PPO loss on the top
  rho = ``top_entropy_frac`` tokens by sg(entropy). ``normalize_by='selected'`` (official code)
  divides by ceil(rho N_tok) (the number selected by an exact top-k), ``'all'`` (TRL) by N_tok.
  ``top_entropy_rule``: 'top_k' (official, k = ceil(rho N)) or 'quantile' (TRL's (1 - rho)
  quantile, one token fewer when rho N is not an integer; ``losses.high_entropy_threshold``).
  At 'step' scope pass ``entropy_threshold`` = ``losses.high_entropy_threshold`` over the step.
  """
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
                 sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  name = "high_entropy_objective"
  check_choice("normalize_by", normalize_by, ("selected", "all"))
  h = require(b.entropy, "entropy [B, T] to select high-entropy tokens", name)
  thr = _stat(name, scope, entropy_threshold, "entropy_threshold", lambda: sel.high_entropy_threshold(
    h, b.completion_mask, top_entropy_frac=top_entropy_frac,
    top_entropy_rule=top_entropy_rule))  # fmt: skip
  chosen = sel.high_entropy_mask(h, b.completion_mask, thr)
  n_policy = None
  if normalize_by == "selected":
    n_policy = jnp.ceil(top_entropy_frac * jnp.asarray(num_tokens, jnp.float32))
  extra = {"select/frac": mean_metric(chosen.astype(jnp.float32), as_mask(b.completion_mask))}
  return _ppo(name, b, options, mode=loss_agg_mode, token_weights=chosen.astype(jnp.float32),
              policy_num_tokens=n_policy, extra=extra, clip_low=clip_low, clip_high=clip_high,
              dual_clip=dual_clip)  # fmt: skip


def steer_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                    ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                    steer_mode="exp", weight_min=0.8, weight_max=1.2, clip_low=0.2,
                    clip_high=0.28, dual_clip=10.0, scope="step", omega_range=None,
                    loss_agg_mode="token_mean", **options):  # fmt: skip
  """STEER entropy-change-aware reweighting (arXiv 2510.10150; §3.9): PPO loss times w(Omega).
  At 'step' scope pass ``omega_range`` = (min, max) of Omega over the step batch
  (``losses.steer_omega_range`` of ``losses.steer_omega``).
  """
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
                 sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  name = "steer_objective"
  h = require(b.entropy, "entropy [B, T] for the entropy-change weights", name)
  omega = sel.steer_omega(sg(b.logp), b.old_logp, b.advantages, h)
  lo, hi = _stat(name, scope, omega_range, "omega_range", lambda: sel.steer_omega_range(
    omega, b.completion_mask))  # fmt: skip
  w = sel.steer_weights(omega, omega_min=lo, omega_max=hi, mode=steer_mode,
                        weight_min=weight_min, weight_max=weight_max)  # fmt: skip
  extra = {"steer/weight_mean": mean_metric(w, as_mask(b.completion_mask))}
  return _ppo(name, b, options, mode=loss_agg_mode, token_weights=w, extra=extra,
              clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip)  # fmt: skip


def lp_reg_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                     ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                     proxy_logp=None, lp_reg_frac=0.01, lp_reg_coef=1.0, lp_reg_clamp=10.0,
                     clip_low=1.0, clip_high=9.0, scope="step", lp_threshold=None,
                     loss_agg_mode="token_mean", **options):  # fmt: skip
  """Lp-Reg (arXiv 2510.03222; §4.5): on the selected low-probability negative tokens S,
  l = -A r + beta k3(logp, proxy_logp) (no clip); elsewhere PPO-clip without dual clip
  (script defaults eps 1.0/9.0, i.e. r in [0, 10]). Extra inputs: ``proxy_logp`` [B, T]
  (``regularizers.min_p_proxy_logp``) and, at 'step' scope, ``lp_threshold`` =
  ``regularizers.lp_reg_threshold`` over the step batch.
  """
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
                 sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  name = "lp_reg_objective"
  proxy = require(proxy_logp, "proxy_logp [B, T] (regularizers.min_p_proxy_logp)", name)
  proxy = clean_input(b, proxy, "proxy_logp")
  thr = _stat(name, scope, lp_threshold, "lp_threshold", lambda: reg.lp_reg_threshold(
    sg(b.logp), b.advantages, b.completion_mask, lp_reg_frac=lp_reg_frac))  # fmt: skip
  chosen = reg.lp_reg_mask(sg(b.logp), proxy, b.advantages, b.completion_mask, thr)
  adv = token_advantages(b.advantages, jnp.shape(b.logp))

  def policy(x):
    clipped, info = sur.ppo_clip_loss(x, b.old_logp, adv, clip_low=clip_low, clip_high=clip_high)
    pulled = -adv * jnp.exp(log_ratio(x, b.old_logp))
    pulled = pulled + lp_reg_coef * reg.lp_reg_penalty(x, proxy, clamp=lp_reg_clamp)
    info = {k: v & ~chosen for k, v in info.items()}
    return jnp.where(chosen, pulled, clipped), info

  extra = {"select/frac": mean_metric(chosen.astype(jnp.float32), as_mask(b.completion_mask))}
  opts = common_options(name, options)
  return run_objective(name, policy, b, mode=loss_agg_mode, opts=opts, extra_metrics=extra)


def siren_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                    ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                    siren_anchor=None, siren_coef=0.005, siren_quantile=0.8,
                    siren_selected_entropy=None, nucleus_entropy=None, clip_low=0.28,
                    clip_high=0.28, loss_agg_mode="seq_mean_token_sum_norm",
                    **options):  # fmt: skip
  """SIREN (arXiv 2509.25133; §4.4): PPO-clip 0.28/0.28 (Dr.GRPO aggregation, needs
  ``seq_norm_constant``) plus lambda (H_sel - anchor)^2 over per-sequence peak-entropy tokens.
  ``nucleus_entropy`` (differentiable top-p entropy; defaults to ``entropy``), ``siren_anchor``
  (frozen at step 1) and, with micro-batching, ``siren_selected_entropy`` (the step's H_sel).
  """
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
                 sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  name = "siren_objective"
  h = require(b.entropy if nucleus_entropy is None else nucleus_entropy, "nucleus_entropy", name)
  h = clean_input(b, h, "nucleus_entropy")
  anchor = require(siren_anchor, "siren_anchor (H_sel of the first rollout batch)", name)
  penalty, h_sel = reg.siren_penalty(
    h, b.completion_mask, anchor=anchor, num_tokens=num_tokens, num_seqs=num_seqs, coef=siren_coef,
    quantile=siren_quantile, selected_entropy=siren_selected_entropy,
  )  # fmt: skip
  n_valid = jnp.sum(as_mask(b.completion_mask))
  num = jnp.asarray(num_tokens, jnp.float32)
  extra = {"siren/selected_entropy": (sg(h_sel) * num, n_valid),
           "loss/siren": (sg(penalty) * num, n_valid)}  # fmt: skip
  loss, metrics = _ppo(name, b, options, mode=loss_agg_mode, extra=extra, clip_low=clip_low,
                       clip_high=clip_high)  # fmt: skip
  metrics["loss/total"] = (metrics["loss/total"][0] + sg(penalty) * num, n_valid)
  return loss + penalty, metrics
