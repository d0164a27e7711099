"""Objectives of the PPO family and its ratio variants (the uniform signature: ``rlvr_jax.losses``).

Each recipe picks a surrogate, its token weights / selection and an aggregation; the KL, entropy,
mismatch and metric machinery is shared (``engine.run_objective``). Every recipe also accepts
the ``CommonOptions`` keywords (kl_coef, entropy_coef, mismatch, group_size, seq_norm_constant...).

Scope: recipes with a batch statistic take ``scope`` ('step' by default, METHODS.md §1.3). At
'step' scope the statistic is a required keyword computed once over the whole step batch
(``losses.step_statistics``); at 'micro' scope it is computed from the micro-batch (reference
behaviour, depends on micro-batching).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlvr_jax.losses import surrogates as sur
from rlvr_jax.losses.aggregation import as_mask, check_choice, mean_metric
from rlvr_jax.losses.engine import clean_input, common_options, make_batch, require, run_objective

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
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
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
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
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
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
                 sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  return _ppo("dr_grpo_objective", b, options, mode=loss_agg_mode, clip_low=clip_low,
              clip_high=clip_high, dual_clip=dual_clip)  # fmt: skip


def dapo_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                   ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                   clip_low=0.2, clip_high=0.28, dual_clip=10.0, loss_agg_mode="token_mean",
                   **options):  # fmt: skip
  """DAPO (arXiv 2503.14476): clip-higher eps 0.2/0.28, dual clip c = 10, ``token_mean``."""
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
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
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
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
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
                 sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  return _ppo("riskpo_objective", b, options, mode=loss_agg_mode, clip_low=clip_low,
              clip_high=clip_high, dual_clip=dual_clip)  # fmt: skip


def gppo_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                   ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                   clip_low=0.2, clip_high=0.28, dual_clip=3.0, loss_agg_mode="token_mean",
                   **options):  # fmt: skip
  """GPPO gradient-preserving clipping (Klear-Reasoner, arXiv 2508.07629), ``token_mean``."""
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
                 sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  return _ppo("gppo_objective", b, options, mode=loss_agg_mode, clip_low=clip_low,
              clip_high=clip_high, dual_clip=dual_clip, gradient_preserving=True)  # fmt: skip


def gspo_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                   ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                   clip_low=3e-4, clip_high=4e-4, max_log_ratio=10.0,
                   loss_agg_mode="seq_mean_token_mean", **options):  # fmt: skip
  """GSPO sequence-level ratio (arXiv 2507.18071), eps 3e-4/4e-4, ``seq_mean_token_mean``."""
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
                 sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  policy = lambda lp: sur.gspo_loss(lp, b.old_logp, b.advantages, b.completion_mask, clip_low=clip_low,
                                    clip_high=clip_high, max_log_ratio=max_log_ratio)  # fmt: skip
  opts = common_options("gspo_objective", options)
  return run_objective("gspo_objective", policy, b, mode=loss_agg_mode, opts=opts)


def gmpo_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                   ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                   clip_low=0.4, clip_high=0.4, loss_agg_mode="seq_mean_token_mean",
                   **options):  # fmt: skip
  """GMPO geometric-mean ratio (arXiv 2507.20673); LOG-space clip 0.4/0.4; mean over rows."""
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
                 sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  policy = lambda lp: sur.gmpo_loss(lp, b.old_logp, b.advantages, b.completion_mask, clip_low=clip_low,
                                    clip_high=clip_high)  # fmt: skip
  opts = common_options("gmpo_objective", options)
  return run_objective("gmpo_objective", policy, b, mode=loss_agg_mode, opts=opts)


def cispo_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                    ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                    weight_min=None, weight_max=5.0, loss_agg_mode="token_mean",
                    **options):  # fmt: skip
  """CISPO (MiniMax-M1, arXiv 2506.13585): -sg(clip(r, w_min, w_max)) A logp, absolute bounds."""
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
                 sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  policy = lambda lp: sur.cispo_loss(lp, b.old_logp, b.advantages, weight_min=weight_min,
                                     weight_max=weight_max)  # fmt: skip
  opts = common_options("cispo_objective", options)
  return run_objective("cispo_objective", policy, b, mode=loss_agg_mode, opts=opts)


def sapo_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                   ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                   tau_pos=1.0, tau_neg=1.05, loss_agg_mode="seq_mean_token_mean",
                   **options):  # fmt: skip
  """SAPO soft gate (arXiv 2511.20347): tau 1.0 / 1.05, ``seq_mean_token_mean``."""
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
                 sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  policy = lambda lp: sur.sapo_loss(lp, b.old_logp, b.advantages, tau_pos=tau_pos, tau_neg=tau_neg)
  opts = common_options("sapo_objective", options)
  return run_objective("sapo_objective", policy, b, mode=loss_agg_mode, opts=opts)


def copo_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                   ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                   global_advantages=None, local_weight=None, clip_low=0.2, clip_high=0.2,
                   dual_clip=3.0, loss_agg_mode="seq_mean_token_mean", **options):  # fmt: skip
  """COPO blend (arXiv 2508.04138, METHODS.md §2.9): l = (1 - w) l_PPO(A_glob) + w l_PPO(A_loc).

  ``advantages`` is the local (GRPO) advantage A_loc; extra inputs ``global_advantages`` A_glob and
  ``local_weight`` w ([B, T] or [B]; ``advantages.copo_advantages`` fields, rows group-ordered).
  Both terms share the ratio: eps 0.2/0.2, dual clip c = 3, ``seq_mean_token_mean``. Clip metrics
  are those of the dominant term (w >= 0.5: local).
  """
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
                 sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  name = "copo_objective"
  a_glob = clean_input(
    b, require(global_advantages, "global_advantages", name), "global_advantages"
  )
  w = clean_input(
    b, require(local_weight, "local_weight (w of the local term)", name), "local_weight"
  )
  kw = dict(clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip)

  def policy(x):
    loss_loc, info_loc = sur.ppo_clip_loss(x, b.old_logp, b.advantages, **kw)
    loss_glob, info_glob = sur.ppo_clip_loss(x, b.old_logp, a_glob, **kw)
    info = {k: jnp.where(w >= 0.5, info_loc[k], info_glob[k]) for k in info_loc}
    return (1.0 - sg(w)) * loss_glob + sg(w) * loss_loc, info

  extra = {"copo/local_weight_mean": mean_metric(w, as_mask(b.completion_mask))}
  opts = common_options(name, options)
  return run_objective(name, policy, b, mode=loss_agg_mode, opts=opts, extra_metrics=extra)
