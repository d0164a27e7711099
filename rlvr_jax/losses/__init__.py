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
3. ``OBJECTIVES[name]``: one ``ObjectiveSpec`` per recipe (callable: it calls its ``*_objective``),
   all with one signature::

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

Parts (this ``__init__`` is only the public API; the code is in):

* ``aggregation``: shape checks, masked reductions, ``aggregate`` (4 modes, global normalisers),
  order statistics, mergeable ``(value, weight)`` metrics;
* ``surrogates``: the per-token ``[B, T]`` surrogates (level 1);
* ``selection``: selections and constant token weights (Clip-Cov, KL-Cov, 80/20, STEER, mismatch);
* ``engine``: ``run_objective``, the machinery every recipe shares (mismatch weights -> policy term
  -> KL / entropy terms -> metrics) and ``CommonOptions``;
* ``recipes`` (PPO family and ratio variants), ``recipes_entropy`` (Clip-Cov, KL-Cov, 80/20, STEER,
  Lp-Reg, SIREN), ``recipes_peers`` (verl / TRL losses: GPG, DPPO, DRO, VESPO, sequence-level
  CISPO / SAPO, LUSPO), ``recipes_adaptive`` (stateful: adaptive entropy), each registering its
  own spec: one ``*_objective`` each;
* ``registry``: ``OBJECTIVES`` (name -> ``ObjectiveSpec``, the one table: the loss function, whether
  it is token-local, its step statistics, the extra arrays it reads, its state between steps),
  ``register_objective``, and the views ``TOKEN_LOCAL_OBJECTIVES``, ``STEP_STAT_OBJECTIVES``,
  ``is_token_local``, ``step_statistics``.
* ``auxiliary``: losses added next to the policy loss by reward-model methods: PRIME's implicit
  PRM cross-entropy (``implicit_prm_loss``, ``implicit_prm_score``; for a second parameter tree)
  and LaSeR's self-reward MSE (``laser_self_reward_loss``; from hidden states:
  ``last_token_self_reward_loss``), and ``AUXILIARY_LOSSES``, the table of auxiliary losses the
  trainer adds to the policy loss (``AuxiliarySpec``, ``register_auxiliary``).

The package imports only jax (and ``rlvr_jax.regularizers`` / ``rlvr_jax.types``);
``tests/test_import_rules.py`` checks it.
"""

from rlvr_jax.losses import recipes_adaptive, recipes_peers  # noqa: F401  (they register specs)
from rlvr_jax.losses.aggregation import (
  AGGREGATION_MODES,
  aggregate,
  finalize_metrics,
  log_ratio,
  masked_mean,
  masked_sum,
  merge_metrics,
)
from rlvr_jax.losses.auxiliary import (
  AUX_READS,
  AUXILIARY_LOSSES,
  AuxiliarySpec,
  implicit_prm_loss,
  implicit_prm_score,
  laser_self_reward_loss,
  last_token_self_reward_loss,
  register_auxiliary,
)
from rlvr_jax.losses.engine import CommonOptions
from rlvr_jax.losses.recipes import (
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
from rlvr_jax.losses.recipes_entropy import (
  clip_cov_objective,
  high_entropy_objective,
  kl_cov_objective,
  lp_reg_objective,
  siren_objective,
  steer_objective,
)
from rlvr_jax.losses.registry import (
  DEFAULT_OBJECTIVE,
  INPUT_SOURCES,
  OBJECTIVES,
  STEP_STAT_OBJECTIVES,
  TOKEN_LOCAL_OBJECTIVES,
  Input,
  MethodState,
  ObjectiveSpec,
  get_objective,
  is_token_local,
  register_objective,
  step_statistics,
)
from rlvr_jax.losses.selection import (
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
from rlvr_jax.losses.surrogates import (
  cispo_loss,
  gmpo_loss,
  gppo_loss,
  gspo_loss,
  policy_gradient_loss,
  ppo_clip_loss,
  sapo_loss,
)

__all__ = [
  "AGGREGATION_MODES",
  "DEFAULT_OBJECTIVE",
  "INPUT_SOURCES",
  "MISMATCH_MODES",
  "OBJECTIVES",
  "Input",
  "MethodState",
  "ObjectiveSpec",
  "get_objective",
  "register_objective",
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
  "implicit_prm_loss",
  "implicit_prm_score",
  "laser_self_reward_loss",
  "AUX_READS",
  "AUXILIARY_LOSSES",
  "AuxiliarySpec",
  "last_token_self_reward_loss",
  "register_auxiliary",
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
