"""Objectives whose hyperparameters adapt between steps: they carry a ``MethodState`` that the
trainer threads through the run (``ObjectiveSpec.state``). Each registers its own spec.
"""

from __future__ import annotations

from rlvr_jax import regularizers as reg
from rlvr_jax.losses.engine import make_batch, require
from rlvr_jax.losses.recipes import _ppo
from rlvr_jax.losses.registry import MethodState, ObjectiveSpec, register_objective


def adaptive_entropy_objective(logp, old_logp, advantages, completion_mask, *, num_tokens,
                               num_seqs, ref_logp=None, sampler_logp=None, entropy=None,
                               mean_log_softmax=None, adaptive_entropy_coef=None,
                               target_entropy=0.2, entropy_coef_init=0.005,
                               entropy_coef_delta=0.005, entropy_coef_max=1.0, clip_low=0.2,
                               clip_high=0.28, dual_clip=10.0, loss_agg_mode="token_mean",
                               **options):  # fmt: skip
  """PPO-clip (DAPO's eps 0.2/0.28, c = 10, ``token_mean``) plus an entropy bonus whose coefficient
  adapts between steps (Skywork-OR1, arXiv 2505.22312; METHODS.md §4.3):

    during step k:  c_k = c if H_{k-1} <= H_target else 0,   L = L_PPO - c_k mean_t H,
    after step k:   c <- min(c + delta, c_max) if H_k <= H_target else max(c - delta, 0).

  The state (c, H_last) starts at (``entropy_coef_init``, 0) and lives in the trainer's state
  (``ObjectiveSpec.state``: the trainer passes ``adaptive_entropy_coef`` each step and updates the
  state from the step's exact ``entropy/mean``). Needs a differentiable ``entropy``.
  """
  b = make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
                 sampler_logp, entropy, mean_log_softmax)  # fmt: skip
  name = "adaptive_entropy_objective"
  coef = require(adaptive_entropy_coef, "adaptive_entropy_coef (from its MethodState)", name)
  return _ppo(name, b, {**options, "entropy_coef": coef}, mode=loss_agg_mode, clip_low=clip_low,
              clip_high=clip_high, dual_clip=dual_clip)  # fmt: skip


def _target(hp):
  return hp.get("target_entropy", 0.2)


ADAPTIVE_ENTROPY_STATE = MethodState(
  init=lambda hp: reg.init_adaptive_entropy(hp.get("entropy_coef_init", 0.005)),
  step_kwargs=lambda state, stats, hp: {
    "adaptive_entropy_coef": reg.adaptive_entropy_coef(state, target=_target(hp))
  },
  update=lambda state, stats, metrics, hp: reg.update_adaptive_entropy(
    state,
    metrics["entropy/mean"],
    target=_target(hp),
    delta=hp.get("entropy_coef_delta", 0.005),
    coef_max=hp.get("entropy_coef_max", 1.0),
  ),  # fmt: skip
  kwargs=("adaptive_entropy_coef",),
)
register_objective(ObjectiveSpec(
  "adaptive_entropy", adaptive_entropy_objective, token_local=True, state=ADAPTIVE_ENTROPY_STATE,
  paper="arXiv 2505.22312",
))  # fmt: skip
