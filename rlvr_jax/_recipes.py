"""One ``*_objective`` per named recipe, all with the uniform signature (see ``rlvr_jax.losses``).

Each recipe picks a surrogate, its token weights / selection and an aggregation; the KL, entropy,
mismatch and metric machinery is shared (``_objectives.run_objective``). Every recipe also accepts
the ``CommonOptions`` keywords (kl_coef, entropy_coef, mismatch, group_size, seq_norm_constant...).

Scope: recipes with a batch statistic take ``scope`` ('step' by default, METHODS.md §1.3). At
'step' scope the statistic is a required keyword computed once over the whole step batch
(``losses.step_statistics``); at 'micro' scope it is computed from the micro-batch (reference
behaviour, depends on micro-batching).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlvr_jax import _selection as sel
from rlvr_jax import _surrogates as sur
from rlvr_jax import regularizers as reg
from rlvr_jax._aggregation import as_mask, check_choice, log_ratio, mean_metric, token_advantages
from rlvr_jax._objectives import Batch, common_options, require, run_objective

sg = jax.lax.stop_gradient
SCOPES = ("step", "micro")


def _stat(name, scope, given, argname, compute):
  """The scope statistic: ``given`` (step scope) or ``compute()`` on the micro-batch."""
  check_choice("scope", scope, SCOPES)
  if scope == "micro":
    if given is not None:
      raise ValueError(f"{name}: {argname} is only used at scope='step', got scope='micro'")
    return compute()
  if given is None:
    raise ValueError(
      f"{name}(scope='step') needs {argname}, computed once over the whole step batch with "
      "losses.step_statistics(...) (or use scope='micro')"
    )
  return given


def _ppo(name, batch, options, *, mode, token_weights=None, policy_num_tokens=None, extra=None,
         **ppo_kwargs):  # fmt: skip
  policy = lambda lp: sur.ppo_clip_loss(lp, batch.old_logp, batch.advantages, **ppo_kwargs)
  return run_objective(
    name, policy, batch, mode=mode, opts=common_options(name, options),
    token_weights=token_weights, policy_num_tokens=policy_num_tokens, extra_metrics=extra,
  )  # fmt: skip


# The uniform signature, spelled out on every recipe:
#   (logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs, ref_logp=None,
#    sampler_logp=None, entropy=None, mean_log_softmax=None, <recipe hyperparameters>, **options)


def ppo_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                  ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                  clip_low=0.2, clip_high=0.2, dual_clip=None, ratio_cap=None,
                  loss_agg_mode="token_mean", **options):  # fmt: skip
  """Generic PPO-clip (arXiv 1707.06347) with optional clip-higher, dual clip and ratio cap."""
  b = Batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
            sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  return _ppo("ppo_objective", b, options, mode=loss_agg_mode, clip_low=clip_low,
              clip_high=clip_high, dual_clip=dual_clip, ratio_cap=ratio_cap)  # fmt: skip


def grpo_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                   ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                   clip_low=0.2, clip_high=0.2, dual_clip=None,
                   loss_agg_mode="seq_mean_token_mean", **options):  # fmt: skip
  """GRPO (DeepSeekMath, arXiv 2402.03300): PPO-clip eps 0.2/0.2, ``seq_mean_token_mean``.

  The paper's KL (beta = 0.04) is off by default (``kl_coef=0``, as in TRL and DAPO); when on, the
  default KL estimator has the correct gradient (value k3, gradient k2).
  """
  b = Batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
            sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  return _ppo("grpo_objective", b, options, mode=loss_agg_mode, clip_low=clip_low,
              clip_high=clip_high, dual_clip=dual_clip)  # fmt: skip


def dr_grpo_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                      ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                      clip_low=0.2, clip_high=0.2, dual_clip=None,
                      loss_agg_mode="seq_mean_token_sum_norm", **options):  # fmt: skip
  """Dr.GRPO (arXiv 2503.20783): PPO-clip with the constant normaliser N_seq * C.

  Requires ``seq_norm_constant`` = C (the maximum response length, a run constant). Pair with the
  Dr.GRPO advantage (no std division).
  """
  b = Batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
            sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  return _ppo("dr_grpo_objective", b, options, mode=loss_agg_mode, clip_low=clip_low,
              clip_high=clip_high, dual_clip=dual_clip)  # fmt: skip


def dapo_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                   ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                   clip_low=0.2, clip_high=0.28, dual_clip=10.0, loss_agg_mode="token_mean",
                   **options):  # fmt: skip
  """DAPO (arXiv 2503.14476): clip-higher eps 0.2/0.28, dual clip c = 10, ``token_mean``."""
  b = Batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
            sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  return _ppo("dapo_objective", b, options, mode=loss_agg_mode, clip_low=clip_low,
              clip_high=clip_high, dual_clip=dual_clip)  # fmt: skip


def lite_ppo_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                       ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                       clip_low=0.2, clip_high=0.2, dual_clip=3.0, loss_agg_mode="token_mean",
                       **options):  # fmt: skip
  """Lite PPO (arXiv 2508.08221): plain clip 0.2 with dual clip c = 3, ``token_mean``.

  Its advantage (group mean, batch std) comes from ``advantages``.
  """
  b = Batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
            sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  return _ppo("lite_ppo_objective", b, options, mode=loss_agg_mode, clip_low=clip_low,
              clip_high=clip_high, dual_clip=dual_clip)  # fmt: skip


def riskpo_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                     ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                     clip_low=0.2, clip_high=0.2, dual_clip=3.0, loss_agg_mode="token_mean",
                     **options):  # fmt: skip
  """RiskPO policy loss (arXiv 2510.00911): the standard clipped surrogate (eps 0.2, c = 3,
  ``token_mean``, no KL, no entropy) applied to the mixed value-at-risk advantages computed by
  ``advantages`` (bundles, quantile tracker)."""
  b = Batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
            sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  return _ppo("riskpo_objective", b, options, mode=loss_agg_mode, clip_low=clip_low,
              clip_high=clip_high, dual_clip=dual_clip)  # fmt: skip


def gppo_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                   ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                   clip_low=0.2, clip_high=0.28, dual_clip=3.0, loss_agg_mode="token_mean",
                   **options):  # fmt: skip
  """GPPO gradient-preserving clipping (Klear-Reasoner, arXiv 2508.07629), ``token_mean``."""
  b = Batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
            sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  return _ppo("gppo_objective", b, options, mode=loss_agg_mode, clip_low=clip_low,
              clip_high=clip_high, dual_clip=dual_clip, gradient_preserving=True)  # fmt: skip


def gspo_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                   ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                   clip_low=3e-4, clip_high=4e-4, max_log_ratio=10.0,
                   loss_agg_mode="seq_mean_token_mean", **options):  # fmt: skip
  """GSPO sequence-level ratio (arXiv 2507.18071), eps 3e-4/4e-4, ``seq_mean_token_mean``."""
  b = Batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
            sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  policy = lambda lp: sur.gspo_loss(lp, old_logp, advantages, completion_mask, clip_low=clip_low,
                                    clip_high=clip_high, max_log_ratio=max_log_ratio)  # fmt: skip
  opts = common_options("gspo_objective", options)
  return run_objective("gspo_objective", policy, b, mode=loss_agg_mode, opts=opts)


def gmpo_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                   ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                   clip_low=0.4, clip_high=0.4, loss_agg_mode="seq_mean_token_mean",
                   **options):  # fmt: skip
  """GMPO geometric-mean ratio (arXiv 2507.20673); LOG-space clip 0.4/0.4; mean over rows."""
  b = Batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
            sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  policy = lambda lp: sur.gmpo_loss(lp, old_logp, advantages, completion_mask, clip_low=clip_low,
                                    clip_high=clip_high)  # fmt: skip
  opts = common_options("gmpo_objective", options)
  return run_objective("gmpo_objective", policy, b, mode=loss_agg_mode, opts=opts)


def cispo_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                    ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                    weight_min=None, weight_max=5.0, loss_agg_mode="token_mean",
                    **options):  # fmt: skip
  """CISPO (MiniMax-M1, arXiv 2506.13585): -sg(clip(r, w_min, w_max)) A logp, absolute bounds."""
  b = Batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
            sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  policy = lambda lp: sur.cispo_loss(lp, old_logp, advantages, weight_min=weight_min,
                                     weight_max=weight_max)  # fmt: skip
  opts = common_options("cispo_objective", options)
  return run_objective("cispo_objective", policy, b, mode=loss_agg_mode, opts=opts)


def sapo_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                   ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                   tau_pos=1.0, tau_neg=1.05, loss_agg_mode="seq_mean_token_mean",
                   **options):  # fmt: skip
  """SAPO soft gate (arXiv 2511.20347): tau 1.0 / 1.05, ``seq_mean_token_mean``."""
  b = Batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
            sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  policy = lambda lp: sur.sapo_loss(lp, old_logp, advantages, tau_pos=tau_pos, tau_neg=tau_neg)
  opts = common_options("sapo_objective", options)
  return run_objective("sapo_objective", policy, b, mode=loss_agg_mode, opts=opts)


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
  b = Batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
            sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  name = "clip_cov_objective"
  if noise is None and key is not None and scope == "micro":
    noise = jax.random.uniform(key, jnp.shape(logp))
  noise = require(noise, "noise [B, T] (uniform per token) or, at scope='micro', a key", name)
  kw = dict(clip_low=clip_low, clip_high=clip_high, cov_low=cov_low, cov_high=cov_high)
  lp = sg(logp)
  stats = _stat(
    name,
    scope,
    cov_stats,
    "cov_stats",
    lambda: sel.clip_cov_stats(
      lp, old_logp, advantages, completion_mask, noise, clip_cov_ratio=clip_cov_ratio, **kw
    ),
  )
  zeroed = sel.clip_cov_mask(lp, old_logp, advantages, completion_mask, noise, stats, **kw)
  extra = {"select/frac": mean_metric(zeroed.astype(jnp.float32), as_mask(completion_mask))}
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
  b = Batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
            sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  name = "kl_cov_objective"
  lp = sg(logp)
  stats = _stat(
    name,
    scope,
    cov_stats,
    "cov_stats",
    lambda: sel.kl_cov_stats(lp, advantages, completion_mask, kl_cov_ratio=kl_cov_ratio),
  )
  chosen = sel.kl_cov_mask(lp, advantages, completion_mask, stats)

  def policy(x):
    loss, info = sur.policy_gradient_loss(x, old_logp, advantages)
    delta = log_ratio(x, old_logp)
    return jnp.where(chosen, loss + kl_cov_coef * delta * sg(jnp.sign(delta)), loss), info

  extra = {"select/frac": mean_metric(chosen.astype(jnp.float32), as_mask(completion_mask))}
  opts = common_options(name, options)
  return run_objective(name, policy, b, mode=loss_agg_mode, opts=opts, extra_metrics=extra)


def high_entropy_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                           ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                           top_entropy_frac=0.2, clip_low=0.2, clip_high=0.28, dual_clip=10.0,
                           normalize_by="selected", scope="step", entropy_threshold=None,
                           loss_agg_mode="token_mean", **options):  # fmt: skip
  """80/20 high-entropy token selection (arXiv 2506.01939; §3.8): the PPO loss on the top
  rho = ``top_entropy_frac`` tokens by sg(entropy). ``normalize_by='selected'`` (official code)
  divides by ceil(rho N_tok) (the number selected by an exact top-k), ``'all'`` (TRL) by N_tok.
  At 'step' scope pass ``entropy_threshold`` = ``losses.high_entropy_threshold`` over the step.
  """
  b = Batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
            sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  name = "high_entropy_objective"
  check_choice("normalize_by", normalize_by, ("selected", "all"))
  h = require(entropy, "entropy [B, T] to select high-entropy tokens", name)
  thr = _stat(name, scope, entropy_threshold, "entropy_threshold", lambda: sel.high_entropy_threshold(
    h, completion_mask, top_entropy_frac=top_entropy_frac))  # fmt: skip
  chosen = sel.high_entropy_mask(h, completion_mask, thr)
  n_policy = None
  if normalize_by == "selected":
    n_policy = jnp.ceil(top_entropy_frac * jnp.asarray(num_tokens, jnp.float32))
  extra = {"select/frac": mean_metric(chosen.astype(jnp.float32), as_mask(completion_mask))}
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
  b = Batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
            sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  name = "steer_objective"
  h = require(entropy, "entropy [B, T] for the entropy-change weights", name)
  omega = sel.steer_omega(sg(logp), old_logp, advantages, h)
  lo, hi = _stat(name, scope, omega_range, "omega_range", lambda: sel.steer_omega_range(
    omega, completion_mask))  # fmt: skip
  w = sel.steer_weights(omega, omega_min=lo, omega_max=hi, mode=steer_mode,
                        weight_min=weight_min, weight_max=weight_max)  # fmt: skip
  extra = {"steer/weight_mean": mean_metric(w, as_mask(completion_mask))}
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
  b = Batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
            sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  name = "lp_reg_objective"
  proxy = require(proxy_logp, "proxy_logp [B, T] (regularizers.min_p_proxy_logp)", name)
  thr = _stat(name, scope, lp_threshold, "lp_threshold", lambda: reg.lp_reg_threshold(
    sg(logp), advantages, completion_mask, lp_reg_frac=lp_reg_frac))  # fmt: skip
  chosen = reg.lp_reg_mask(sg(logp), proxy, advantages, completion_mask, thr)
  adv = token_advantages(advantages, jnp.shape(logp))

  def policy(x):
    clipped, info = sur.ppo_clip_loss(x, old_logp, adv, clip_low=clip_low, clip_high=clip_high)
    pulled = -adv * jnp.exp(log_ratio(x, old_logp))
    pulled = pulled + lp_reg_coef * reg.lp_reg_penalty(x, proxy, clamp=lp_reg_clamp)
    info = {k: v & ~chosen for k, v in info.items()}
    return jnp.where(chosen, pulled, clipped), info

  extra = {"select/frac": mean_metric(chosen.astype(jnp.float32), as_mask(completion_mask))}
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
  b = Batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
            sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  name = "siren_objective"
  h = require(entropy if nucleus_entropy is None else nucleus_entropy, "nucleus_entropy", name)
  anchor = require(siren_anchor, "siren_anchor (H_sel of the first rollout batch)", name)
  penalty, h_sel = reg.siren_penalty(
    h, completion_mask, anchor=anchor, num_tokens=num_tokens, num_seqs=num_seqs, coef=siren_coef,
    quantile=siren_quantile, selected_entropy=siren_selected_entropy,
  )  # fmt: skip
  n_valid = jnp.sum(as_mask(completion_mask))
  num = jnp.asarray(num_tokens, jnp.float32)
  extra = {"siren/selected_entropy": (sg(h_sel) * num, n_valid),
           "loss/siren": (sg(penalty) * num, n_valid)}  # fmt: skip
  loss, metrics = _ppo(name, b, options, mode=loss_agg_mode, extra=extra, clip_low=clip_low,
                       clip_high=clip_high)  # fmt: skip
  metrics["loss/total"] = (metrics["loss/total"][0] + sg(penalty) * num, n_valid)
  return loss + penalty, metrics


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
  "clip_cov": clip_cov_objective,
  "kl_cov": kl_cov_objective,
  "high_entropy": high_entropy_objective,
  "steer": steer_objective,
  "lp_reg": lp_reg_objective,
  "siren": siren_objective,
}


def step_statistics(name, logp, old_logp, advantages, completion_mask, *, num_tokens=None,
                    num_seqs=None, entropy=None, noise=None, proxy_logp=None,
                    **hyperparameters) -> dict:  # fmt: skip
  """The extra keyword arguments objective ``name`` needs at 'step' scope, computed over the WHOLE
  step batch (call it once per step, jitted, before the accumulation loop, with no gradient, and
  pass the result to every micro-batch call). ``logp`` is the current policy's log-prob from that
  pre-pass (old_logp is a rollout-time approximation). Returns {} for objectives without step
  statistics. ``hyperparameters`` are the objective's own (unused ones are ignored).
  """
  hp = hyperparameters
  lp = sg(jnp.asarray(logp, jnp.float32))
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
      sg(h), completion_mask, anchor=0.0, num_tokens=num_tokens, num_seqs=num_seqs,
      quantile=hp.get("siren_quantile", 0.8),
    )  # fmt: skip
    return {"siren_selected_entropy": h_sel}
  if name not in OBJECTIVES:
    raise ValueError(f"unknown objective {name!r}; known: {sorted(OBJECTIVES)}")
  return {}
