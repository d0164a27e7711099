"""Rewards computed by a forward pass of a model: self-certainty, reference-answer likelihood
(RLPR and its log-likelihood variant), LaSeR's last-token self-reward.

Every function here is pure jax and reads either per-token statistics that the tiled sweep of
``token_stats`` already produces (log-probs, the mean log-softmax μ) or final hidden states with
the unembedding, so no ``[B, T, V]`` array is ever built. The trainer computes them on device in
the same jitted forward as the old log-probs (no gradient) and combines them with host rewards.

Formulas (METHODS.md §5.6-5.7; LaSeR arXiv 2510.14943):

  self-certainty   SC_b = (1/n_b) Σ_t KL(U ‖ π_t) = −(1/n_b) Σ_t μ_t − log V
  reference        q_j = π(y*_j | x, z, y*_<j) on the spliced sequence [x, z, y*]:
                   mean probability p̄ = (1/|y*|) Σ_j q_j, log-likelihood Σ_j log q_j (or its mean)
  RLPR             R = (1 − c_f)·max(0, p̄(x, z, y*) − p̄(x, ∅, y*)) + c_f·r_fmt
  LaSeR            r_s = β_v (log π(z_c | x, y) − c_ref), z_c a pre-specified token read at the
                   position after the last completion token; c_ref ≈ log π_ref(z_c | x, y), a
                   pre-computed constant in the paper.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlvr_jax.logprobs import token_stats


def _check(name: str, x: jax.Array, rank: int, dims: str) -> None:
  if jnp.ndim(x) != rank:
    raise ValueError(f"{name} must have shape [{dims}], got shape {tuple(jnp.shape(x))}.")


def _masked_mean(x: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Row means of [B, T] ``x`` over ``mask`` (0 for empty rows) and the counts [B]."""
  mask = mask.astype(bool)
  count = mask.sum(axis=-1).astype(jnp.float32)
  total = jnp.sum(jnp.where(mask, x, 0.0), axis=-1)
  return jnp.where(count > 0, total / jnp.maximum(count, 1.0), 0.0), count


# ----------------------------------------------------------------------------------------------
# Self-certainty (Intuitor).


def self_certainty(
  mean_log_softmax: jax.Array, completion_mask: jax.Array, *, vocab_size: int, kl_form: bool = True
) -> jax.Array:
  """Self-certainty of each completion (arXiv 2502.18581; RL use: Intuitor, arXiv 2505.19590).

    SC_b = (1/n_b) Σ_t KL(U ‖ π_t) = −(1/n_b) Σ_t μ_t − log V,   μ_t = (1/V) Σ_v log π_t(v)

  ``kl_form=False`` returns the Intuitor reference's quantity (1/n) Σ_t (logsumexp z_t − mean_v
  z_t) = SC + log V (the constant cancels under group centring). Rows without valid tokens get 0.

  Args:
    mean_log_softmax: [B, T] μ from ``token_stats_from_hidden(..., compute_mean_log_softmax=True)``.
    completion_mask: [B, T] bool.
    vocab_size: V.  kl_form: subtract log V (the KL from uniform).

  Returns:
    [B] float32.
  """
  _check("mean_log_softmax", mean_log_softmax, 2, "B, T")
  if mean_log_softmax.shape != completion_mask.shape:
    raise ValueError(
      f"mean_log_softmax {tuple(mean_log_softmax.shape)} and completion_mask "
      f"{tuple(completion_mask.shape)} must both be [B, T]."
    )
  mean, count = _masked_mean(-mean_log_softmax.astype(jnp.float32), completion_mask)
  offset = math.log(vocab_size) if kl_form else 0.0
  return jnp.where(count > 0, mean - offset, 0.0)


def self_certainty_from_hidden(
  hidden: jax.Array,
  unembed: jax.Array,
  tokens: jax.Array,
  completion_mask: jax.Array,
  *,
  temperature: float | jax.Array = 1.0,
  kl_form: bool = True,
  chunk_size: int = token_stats.DEFAULT_CHUNK_SIZE,
  vocab_chunk_size: int | None = token_stats.DEFAULT_VOCAB_CHUNK_SIZE,
) -> jax.Array:
  """``self_certainty`` from completion-aligned hidden states [B, T, D] and unembed [D, V].

  ``hidden[:, t]`` must be the state that predicts ``tokens[:, t]`` (as for the log-probs). μ
  comes from the tiled sweep (no [B, T, V] array). Returns [B] float32.
  """
  stats = token_stats.token_stats_from_hidden(
    hidden,
    unembed,
    tokens,
    temperature=temperature,
    chunk_size=chunk_size,
    vocab_chunk_size=vocab_chunk_size,
    compute_entropy=False,
    compute_mean_log_softmax=True,
  )
  return self_certainty(
    stats.mean_log_softmax, completion_mask, vocab_size=unembed.shape[-1], kl_form=kl_form
  )


# ----------------------------------------------------------------------------------------------
# Reference-answer likelihood (RLPR, log-likelihood reward).


def find_marker(
  tokens: jax.Array, completion_mask: jax.Array, marker: tuple[int, ...]
) -> jax.Array:
  """Index of the first occurrence of the id sequence ``marker`` inside each row's valid tokens.

  Rows without the marker give their length (so "reasoning before the answer" is the whole
  completion). Pure; ``marker`` is static.

  Args:
    tokens: [B, T] int.  completion_mask: [B, T] bool (a prefix of each row).  marker: ids.

  Returns:
    [B] int32.
  """
  _check("tokens", tokens, 2, "B, T")
  if not marker:
    raise ValueError("find_marker: the marker is empty.")
  num_tokens, width = tokens.shape[1], len(marker)
  mask = completion_mask.astype(bool)
  lengths = mask.sum(axis=1).astype(jnp.int32)
  if width > num_tokens:
    return lengths
  hit = jnp.ones((tokens.shape[0], num_tokens - width + 1), bool)
  for k, token_id in enumerate(marker):
    window = slice(k, num_tokens - width + 1 + k)
    hit = hit & (tokens[:, window] == token_id) & mask[:, window]
  first = jnp.argmax(hit, axis=1).astype(jnp.int32)
  return jnp.where(hit.any(axis=1), first, lengths)


class Spliced(NamedTuple):
  """A completion spliced with a reference answer: [z_b[:k_b], y*_b, pad...].

  Attributes:
    tokens: [B, T + A] int ids, right padded with ``pad_id``.
    completion_mask: [B, T + A] bool, True on the kept reasoning and the reference tokens.
    score_mask: [B, T + A] bool, True on the reference tokens that are scored.
  """

  tokens: jax.Array
  completion_mask: jax.Array
  score_mask: jax.Array


def splice_reference(
  tokens: jax.Array,
  keep_lengths: jax.Array,
  reference: jax.Array,
  reference_mask: jax.Array,
  *,
  score_mask: jax.Array | None = None,
  pad_id: int = 0,
) -> Spliced:
  """Builds [x, z, y*] from ids (never strings): the first ``keep_lengths[b]`` completion tokens,
  then the reference answer (METHODS.md §5.7 "Splice and score"). The prompt is unchanged, so
  the result replaces the completion of a rollout and is scored by the usual teacher-forced pass.

  Args:
    tokens: [B, T] int completion ids.
    keep_lengths: [B] int, reasoning tokens to keep (0: no reasoning, for p̄ without z).
    reference: [B, A] int reference ids, valid on a prefix given by ``reference_mask``.
    reference_mask: [B, A] bool.
    score_mask: optional [B, A] bool, the reference tokens to score (default: all valid ones;
      give False on a leading "<answer>" marker that is part of the splice but not of y*).
    pad_id: id written after the end.

  Returns:
    :class:`Spliced` of width T + A.
  """
  _check("tokens", tokens, 2, "B, T")
  _check("reference", reference, 2, "B, A")
  if reference_mask.shape != reference.shape:
    raise ValueError(
      f"reference_mask {tuple(reference_mask.shape)} must match reference {tuple(reference.shape)}."
    )
  if score_mask is None:
    score_mask = reference_mask
  num_rows, num_tokens = tokens.shape
  width = num_tokens + reference.shape[1]
  keep = jnp.clip(keep_lengths.astype(jnp.int32), 0, num_tokens)[:, None]
  ref_len = reference_mask.astype(bool).sum(axis=1).astype(jnp.int32)[:, None]
  pos = jnp.arange(width)[None, :]
  in_reasoning = pos < keep
  ref_pos = jnp.clip(pos - keep, 0, reference.shape[1] - 1)
  in_reference = (pos >= keep) & (pos - keep < ref_len)
  from_tokens = jnp.take_along_axis(tokens, jnp.clip(pos, 0, num_tokens - 1), axis=1)
  from_ref = jnp.take_along_axis(reference, ref_pos, axis=1)
  out = jnp.where(in_reasoning, from_tokens, jnp.where(in_reference, from_ref, pad_id))
  scored = in_reference & jnp.take_along_axis(score_mask.astype(bool), ref_pos, axis=1)
  return Spliced(out.astype(tokens.dtype), in_reasoning | in_reference, scored)


class ReferenceLikelihood(NamedTuple):
  """Per-row likelihood of the scored reference tokens (each [B] float32).

  Attributes:
    mean_prob: p̄ = (1/|y*|) Σ_j q_j (RLPR's reward; a mean of probabilities, not log-probs).
    sum_logp: Σ_j log q_j (the log-likelihood reward).
    mean_logp: (1/|y*|) Σ_j log q_j.
    num_tokens: |y*|.
  """

  mean_prob: jax.Array
  sum_logp: jax.Array
  mean_logp: jax.Array
  num_tokens: jax.Array


def reference_likelihood(logp: jax.Array, score_mask: jax.Array) -> ReferenceLikelihood:
  """Reference-answer likelihood statistics from the log-probs of a spliced sequence.

  Args:
    logp: [B, T'] log q of the spliced tokens (teacher forced).
    score_mask: [B, T'] bool, the reference positions (``Spliced.score_mask``).

  Returns:
    :class:`ReferenceLikelihood`; rows without scored tokens get 0 everywhere.
  """
  _check("logp", logp, 2, "B, T")
  logp = logp.astype(jnp.float32)
  mask = score_mask.astype(bool)
  mean_prob, count = _masked_mean(jnp.exp(jnp.where(mask, logp, 0.0)), mask)
  mean_logp, _ = _masked_mean(logp, mask)
  return ReferenceLikelihood(mean_prob, jnp.sum(jnp.where(mask, logp, 0.0), -1), mean_logp, count)


def rlpr_reward(
  mean_prob: jax.Array,
  mean_prob_without_reasoning: jax.Array,
  *,
  format_reward: jax.Array | None = None,
  format_coef: float = 0.1,
) -> jax.Array:
  """RLPR probability reward (arXiv 2506.18254; METHODS.md §5.7).

    Δ = max(0, p̄(x, z, y*) − p̄(x, ∅, y*)),   R = (1 − c_f) Δ + c_f r_fmt   (c_f = 0.1)

  Without ``format_reward`` R = Δ (no format term and no (1 − c_f) scaling).

  Args:
    mean_prob: [B] p̄ with the policy's reasoning.
    mean_prob_without_reasoning: [B] p̄ with empty reasoning (per prompt, broadcast to rows).
    format_reward: optional [B] r_fmt.  format_coef: c_f.

  Returns:
    [B] float32.
  """
  delta = jnp.maximum(0.0, mean_prob - mean_prob_without_reasoning).astype(jnp.float32)
  if format_reward is None:
    return delta
  return (1.0 - format_coef) * delta + format_coef * format_reward.astype(jnp.float32)


# ----------------------------------------------------------------------------------------------
# LaSeR: last-token self-reward.


def last_token_hidden(hidden: jax.Array, completion_mask: jax.Array) -> jax.Array:
  """[B, D] hidden state at each row's last valid completion token (from [B, T, D]).

  Pass the states AT the completion tokens (full-sequence states at positions S_prompt + t), not
  the completion-aligned states that predict them: the selected state is then the one that
  predicts the token after the completion, where LaSeR reads its self-reward. Rows without valid
  tokens select position 0.
  """
  _check("hidden", hidden, 3, "B, T, D")
  mask = completion_mask.astype(bool)
  num_tokens = mask.shape[1]
  last = num_tokens - 1 - jnp.argmax(jnp.flip(mask, axis=1), axis=1)
  last = jnp.where(mask.any(axis=1), last, 0)
  return jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]


def next_token_logprob(
  last_hidden: jax.Array,
  unembed: jax.Array,
  token_id: int,
  *,
  temperature: float | jax.Array = 1.0,
  vocab_chunk_size: int | None = token_stats.DEFAULT_VOCAB_CHUNK_SIZE,
) -> jax.Array:
  """log π(z | state) of one fixed token z for each row: [B, D] states -> [B] float32.

  Differentiable (LaSeR's auxiliary loss trains it); runs through the tiled sweep.
  """
  _check("last_hidden", last_hidden, 2, "B, D")
  tokens = jnp.full((last_hidden.shape[0], 1), token_id, jnp.int32)
  stats = token_stats.token_stats_from_hidden(
    last_hidden[:, None, :],
    unembed,
    tokens,
    temperature=temperature,
    vocab_chunk_size=vocab_chunk_size,
    compute_entropy=False,
  )
  return stats.logp[:, 0]


def last_token_self_reward(
  token_logp: jax.Array, *, beta: float = 0.1, ref_logp: float | jax.Array = 0.0
) -> jax.Array:
  """LaSeR last-token self-rewarding score (arXiv 2510.14943).

    r_s = β_v (log π_θ(z_c | x, y) − c_ref)

  ``ref_logp`` is c_ref = log π_ref(z_c | x, y): a per-row array, or (as the paper) a constant
  pre-computed once as its average, since the reference barely varies with y.

  Args:
    token_logp: [B] log π_θ(z_c | x, y) (``next_token_logprob``).
    beta: β_v (the verification KL coefficient).  ref_logp: c_ref.

  Returns:
    [B] float32.
  """
  return (beta * (token_logp - ref_logp)).astype(jnp.float32)
