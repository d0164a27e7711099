"""The objective registry: recipe name -> ``*_objective``, which recipes are token-local (fusable
into the log-prob sweep), and the step-scope batch statistics (``step_statistics``) of the recipes
that have them. This is the ONE place a new recipe is registered (``WORKSPACE.md``, "How to add
things"); ``rlvr_jax.losses`` re-exports it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlvr_jax import regularizers as reg
from rlvr_jax.losses import selection as sel
from rlvr_jax.losses.engine import require
from rlvr_jax.losses.recipes import (
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
