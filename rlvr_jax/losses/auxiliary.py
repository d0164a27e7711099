"""Auxiliary losses of reward-model methods: PRIME's implicit-PRM cross-entropy, LaSeR's MSE.

Each returns ``(partial loss, metrics)`` like the objectives: the loss is normalised by the GLOBAL
number of sequences of the step batch (``num_seqs``), so partials sum exactly over micro-batches
and data-parallel shards; metrics are ``(value, weight)`` pairs for ``merge_metrics``.

Auxiliary losses the trainer adds to the policy loss in its own train step are values in one
table, ``AUXILIARY_LOSSES`` (``AuxiliarySpec``; ``config.auxiliary_loss.name``): the trainer reads
the spec (the per-row inputs it needs, whether it takes a token id) and names no method.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from rlvr_jax import logprobs
from rlvr_jax.losses import aggregation

# What the trainer can give an auxiliary loss per row (``AuxiliarySpec.reads``).
AUX_READS = {
  "rewards": "[B] float32 the rollout's training rewards (NaN = failed reward: row left out)",
}


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


def last_token_self_reward_loss(
  states: jax.Array,
  unembed: jax.Array,
  completion_mask: jax.Array,
  *,
  rewards: jax.Array,
  num_seqs: jax.Array | float,
  token_id: int,
  beta: float = 0.1,
  ref_logp: float = -10.0,
  coef: float = 1.0,
) -> tuple[jax.Array, dict]:
  """LaSeR's auxiliary loss from the policy's own final hidden states (arXiv 2510.14943).

    h_b = the state at row b's last completion token,  log π_θ(z_c | x, y) = log softmax(h_b U)[z_c]
    r_s = β_v (log π_θ(z_c | x, y) − c_ref),   L = (α / N) Σ_b (r_s,b − r_v,b)²

  ``laser_self_reward_loss`` on ``logprobs.next_token_logprob`` of the last state, at
  temperature 1 (the model's own distribution; the tiled sweep, no [B, V] logits kept). The
  gradient reaches the policy through h_b and U. Rows without completion tokens are left out.

  Args:
    states: [B, T, D] final hidden states AT the completion tokens (position S_prompt + t).
    unembed: [D, V].  completion_mask: [B, T] bool.
    rewards: [B] verifier rewards r_v (NaN = left out).  num_seqs: global N.
    token_id: z_c, the pre-specified token.  beta: β_v.  ref_logp: c_ref, the constant
      log π_ref(z_c | x, y) (the paper pre-computes it: an unused token is far below 0).
    coef: α.

  Returns:
    (loss, metrics) as ``laser_self_reward_loss``, plus ``laser/token_logp``.
  """
  last = logprobs.last_token_hidden(states, completion_mask)
  token_logp = logprobs.next_token_logprob(last, unembed, token_id)
  valid = completion_mask.astype(bool).any(axis=1)
  loss, metrics = laser_self_reward_loss(
    token_logp, rewards, num_seqs=num_seqs, beta=beta, ref_logp=ref_logp, coef=coef, valid=valid
  )
  ok = valid & jnp.isfinite(rewards)
  metrics = dict(metrics)
  metrics["laser/token_logp"] = (
    jnp.sum(jnp.where(ok, jax.lax.stop_gradient(token_logp), 0.0)),
    jnp.sum(ok).astype(jnp.float32),
  )
  return loss, metrics


@dataclasses.dataclass(frozen=True)
class AuxiliarySpec:
  """An auxiliary loss the trainer adds to the policy loss, as a value (hashable: a static
  argument of the jitted step).

  Attributes:
    name: the config name (``auxiliary_loss.name``).
    fn: ``fn(states, unembed, completion_mask, *, num_seqs, **reads, **hp) -> (loss, metrics)``
      with ``states`` [B, T, D] the final hidden states at the completion tokens; the loss is
      normalised by the global ``num_seqs`` (partials sum over micro-batches).
    reads: keys of ``AUX_READS`` passed by keyword.
    takes_token: ``fn`` takes ``token_id``: the trainer encodes ``auxiliary_loss.token`` (one
      token of the tokenizer) into it.
    paper: the reference.
  """

  name: str
  fn: Callable
  reads: tuple[str, ...] = ()
  takes_token: bool = False
  paper: str = ""

  def __post_init__(self):
    unknown = [r for r in self.reads if r not in AUX_READS]
    if unknown:
      raise ValueError(f"auxiliary loss {self.name!r}: reads {unknown} not in {sorted(AUX_READS)}")

  def hyperparameters(self) -> dict:
    """Name -> default of ``fn``'s keyword settings (the reads, ``num_seqs``, ``token_id`` out)."""
    skip = {*AUX_READS, "num_seqs", "token_id"}
    return {k: v for k, v in (self.fn.__kwdefaults__ or {}).items() if k not in skip}


AUXILIARY_LOSSES: dict[str, AuxiliarySpec] = {}


def register_auxiliary(spec: AuxiliarySpec, *, replace: bool = False) -> AuxiliarySpec:
  """Adds ``spec`` to ``AUXILIARY_LOSSES`` (selectable as ``auxiliary_loss.name``)."""
  old = AUXILIARY_LOSSES.get(spec.name)
  if old is not None and old != spec and not replace:
    raise ValueError(f"auxiliary loss {spec.name!r} is already registered")
  AUXILIARY_LOSSES[spec.name] = spec
  return spec


register_auxiliary(
  AuxiliarySpec(
    "last_token_self_reward",
    last_token_self_reward_loss,
    reads=("rewards",),
    takes_token=True,
    paper="arXiv 2510.14943 (LaSeR)",
  )
)
