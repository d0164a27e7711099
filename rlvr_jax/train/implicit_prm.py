"""The implicit process reward model (PRM) as a second parameter tree, trained in the RL step.

Config section ``config.implicit_prm``::

  enabled        train an implicit PRM π_φ (initialised from the policy after the warm start)
  beta           β_φ of r_t = β (log π_φ − log π_ref) and of the PRM score (0.05)
  learning_rate  of the PRM's own Adam (the release: 1e-6 for 7B models)

Estimators that read ``prm_token_rewards`` (``advantages.ESTIMATORS``: the implicit-PRM method of
arXiv 2502.01456) get the PRM's token rewards; the config requires the section and such an
estimator together.

Per RL step (the paper's Algorithm 1 order): the collector scores the rollout with π_φ and π_ref (no
grad) and turns the token rewards into advantages with the verifier outcome; then the PRM tree is
updated by one cross-entropy step on that rollout's outcome labels
(``losses.implicit_prm_loss``) in the same RL step as the policy update. The PRM params and its
optimiser state live in ``TrainState.extra`` (``prm_params``, ``prm_opt_state``), so they are
checkpointed and restored with the run.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from ml_collections import ConfigDict

from rlvr_jax import losses
from rlvr_jax.train import step as step_lib


def implicit_prm_section() -> ConfigDict:
  return ConfigDict(dict(enabled=False, beta=0.05, learning_rate=1e-4))


def prm_optimizer(c) -> optax.GradientTransformation:
  return optax.adam(c.implicit_prm.learning_rate)


def init_prm_extra(params, optimizer: optax.GradientTransformation) -> dict:
  """``TrainState.extra`` entries of the PRM: a copy of ``params`` and its optimiser state."""
  prm = jax.tree.map(jnp.copy, params)
  return {"prm_params": prm, "prm_opt_state": optimizer.init(prm)}


@functools.lru_cache(maxsize=8)
def make_prm_step(
  *,
  model_config,
  optimizer: optax.GradientTransformation,
  beta: float,
  temperature: float,
  chunk_size: int = 128,
):
  """Jitted ``prm_step(prm_params, prm_opt_state, tokens, positions, completion_mask, ref_logp,
  labels) -> (prm_params, prm_opt_state, metrics)``: one optimiser step on

    L_φ = (1/N) Σ_b BCE(σ(β Σ_t m (log π_φ − log π_ref)), y_b),   N = rows with a finite label

  at the sampling temperature (the same log-probs as the policy's). Rows with NaN labels are
  left out; a non-finite loss or gradient skips the update (``prm/skipped``).
  """

  def loss_fn(prm, tokens, positions, mask, ref_logp, labels, num_seqs):
    logp, _ = step_lib.completion_logprobs(
      prm,
      tokens,
      positions,
      num_completion=mask.shape[1],
      model_config=model_config,
      temperature=temperature,
      chunk_size=chunk_size,
    )
    return losses.implicit_prm_loss(logp, ref_logp, mask, labels, num_seqs=num_seqs, beta=beta)

  def prm_step(prm, opt_state, tokens, positions, mask, ref_logp, labels):
    num_seqs = jnp.maximum(jnp.sum(jnp.isfinite(labels)), 1).astype(jnp.float32)
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      prm, tokens, positions, mask, ref_logp, labels, num_seqs
    )
    finite = jnp.isfinite(loss) & jnp.isfinite(optax.global_norm(grads))
    grads = jax.tree.map(lambda g: jnp.where(finite, g, 0.0), grads)
    updates, new_opt = optimizer.update(grads, opt_state, prm)
    new_prm = optax.apply_updates(prm, updates)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
    out = dict(losses.finalize_metrics(metrics))
    out["prm/skipped"] = (~finite).astype(jnp.float32)
    return keep(new_prm, prm), keep(new_opt, opt_state), out

  return jax.jit(prm_step, donate_argnums=(0, 1))
