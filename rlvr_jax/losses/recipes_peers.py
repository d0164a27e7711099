"""Objectives from the peers (verl ``core_algos`` policy losses, TRL ``GRPOTrainer`` loss types) that
the other recipe modules do not cover. Each is a pure ``*_objective`` with the uniform signature
(``rlvr_jax.losses``) and registers its own ``ObjectiveSpec`` right below it, so adding one touches
this file, its tests and the generated table only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

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
