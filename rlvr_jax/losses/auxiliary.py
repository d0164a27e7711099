"""Auxiliary losses of reward-model methods: PRIME's implicit-PRM cross-entropy, LaSeR's MSE.

Each returns ``(partial loss, metrics)`` like the objectives: the loss is normalised by the GLOBAL
number of sequences of the step batch (``num_seqs``), so partials sum exactly over micro-batches
and data-parallel shards; metrics are ``(value, weight)`` pairs for ``merge_metrics``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlvr_jax.losses import aggregation


def _row_mask(valid: jax.Array | None, labels: jax.Array) -> jax.Array:
  ok = jnp.isfinite(labels)
  if valid is not None:
    ok = ok & valid.reshape(labels.shape).astype(bool)
  return ok


def implicit_prm_score(
  prm_logp: jax.Array, ref_logp: jax.Array, completion_mask: jax.Array, *, beta: float = 0.05
) -> jax.Array:
  """Sequence score of PRIME's implicit PRM: s_b = β Σ_t m_{b,t} (log π_φ − log π_ref). [B]."""
  aggregation.check_tokens(prm_logp=prm_logp, ref_logp=ref_logp, completion_mask=completion_mask)
  mask = completion_mask.astype(bool)
  return beta * jnp.sum(jnp.where(mask, prm_logp - ref_logp, 0.0), axis=-1)


def implicit_prm_loss(
  prm_logp: jax.Array,
  ref_logp: jax.Array,
  completion_mask: jax.Array,
  labels: jax.Array,
  *,
  num_seqs: jax.Array | float,
  beta: float = 0.05,
  valid: jax.Array | None = None,
) -> tuple[jax.Array, dict]:
  """PRIME implicit-PRM update loss (arXiv 2502.01456; METHODS.md §5.8).

    s_b = β Σ_t m (log π_φ − log π_ref),   L_φ = (1/N) Σ_b BCE(σ(s_b), y_b)
        = (1/N) Σ_b [softplus(s_b) − y_b s_b],   ∂L/∂ log π_φ(y_t) = β (σ(s_b) − y_b) m_t / N

  with y_b = 𝟙[correct] and N = ``num_seqs`` (global). Only ``prm_logp`` is differentiated (the
  reference is a constant). Rows with a NaN label or ``valid`` False are left out.

  Args:
    prm_logp: [B, T] log-probs of the sampled tokens under π_φ (differentiable).
    ref_logp: [B, T] under π_ref.  completion_mask: [B, T] bool.
    labels: [B] outcomes in {0, 1} (NaN = failed).
    num_seqs: global number of rows in the normaliser.  beta: β_φ.  valid: optional [B] bool.

  Returns:
    (loss, metrics): ``prm/loss``, ``prm/accuracy`` (σ(s) > 1/2 agrees with y), ``prm/score``.
  """
  ref_logp = jax.lax.stop_gradient(ref_logp)
  score = implicit_prm_score(prm_logp, ref_logp, completion_mask, beta=beta)
  ok = _row_mask(valid, labels)
  y = jnp.where(ok, labels, 0.0).astype(jnp.float32)
  per_row = jnp.where(ok, jax.nn.softplus(score) - y * score, 0.0)
  loss = jnp.sum(per_row) / num_seqs
  count = jnp.sum(ok).astype(jnp.float32)
  hit = jnp.where(ok, ((score > 0) == (y > 0.5)).astype(jnp.float32), 0.0)
  metrics = {
    "prm/loss": (jnp.sum(per_row), count),
    "prm/accuracy": (jnp.sum(hit), count),
    "prm/score": (jnp.sum(jnp.where(ok, jax.lax.stop_gradient(score), 0.0)), count),
  }
  return loss, metrics


def laser_self_reward_loss(
  token_logp: jax.Array,
  verifier_rewards: jax.Array,
  *,
  num_seqs: jax.Array | float,
  beta: float = 0.1,
  ref_logp: float | jax.Array = 0.0,
  coef: float = 1.0,
  valid: jax.Array | None = None,
) -> tuple[jax.Array, dict]:
  """LaSeR auxiliary loss (arXiv 2510.14943): align the last-token self-reward with the verifier.

    r_s = β_v (log π_θ(z_c | x, y) − c_ref),   L = (α / N) Σ_b (r_s,b − r_v,b)²

  added to the policy loss; ∂L/∂ log π_θ(z_c) = 2 α β_v (r_s − r_v) / N.

  Args:
    token_logp: [B] log π_θ(z_c | x, y) at the state after the last completion token
      (``logprobs.next_token_logprob``; differentiable).
    verifier_rewards: [B] r_v (NaN = failed: the row is left out).
    num_seqs: global normaliser N.  beta: β_v.  ref_logp: c_ref.  coef: α.
    valid: optional [B] bool.

  Returns:
    (loss, metrics): ``laser/mse``, ``laser/self_reward``, ``laser/sign_accuracy`` (r_s > 1/2
    agrees with r_v > 1/2).
  """
  if jnp.ndim(token_logp) != 1 or token_logp.shape != verifier_rewards.shape:
    raise ValueError(
      f"token_logp {tuple(jnp.shape(token_logp))} and verifier_rewards "
      f"{tuple(jnp.shape(verifier_rewards))} must both be [B]."
    )
  ok = _row_mask(valid, verifier_rewards)
  target = jnp.where(ok, verifier_rewards, 0.0).astype(jnp.float32)
  score = beta * (token_logp - ref_logp)
  sq = jnp.where(ok, jnp.square(score - target), 0.0)
  loss = coef * jnp.sum(sq) / num_seqs
  count = jnp.sum(ok).astype(jnp.float32)
  agree = jnp.where(ok, ((score > 0.5) == (target > 0.5)).astype(jnp.float32), 0.0)
  metrics = {
    "laser/mse": (jnp.sum(sq), count),
    "laser/self_reward": (jnp.sum(jnp.where(ok, jax.lax.stop_gradient(score), 0.0)), count),
    "laser/sign_accuracy": (jnp.sum(agree), count),
  }
  return loss, metrics
