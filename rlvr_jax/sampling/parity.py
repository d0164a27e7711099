"""Sampler/trainer log-prob parity: recompute a Rollout's log-probs with one full forward pass.

The trainer scores completions with a single causal forward pass over prompt + completion; the
sampler produced them token by token from a KV cache. Both call ``rlvr_jax.model.forward``, so
the two must agree to float tolerance; ``logprob_parity`` measures the gap (log it every step: a
growing gap means the sampler and trainer no longer compute the same policy, METHODS.md §3.10).

They agree to rounding, not bitwise: a decode step runs every matmul with B rows (one token per
row) and attends over the cache's slots, the full pass with B (S + T) rows over S + T keys, and
XLA picks its dot kernel, hence the summation order, by shape. On SmolLM2-135M in float32 the
per-token gap is max ~3e-5, mean ~4e-6 over 512 tokens, as large as each path's own error against
a float64 evaluation (``rlvr_jax.model.reference``): a few float32 ulps of logits up to |z| ~ 39.
``tests/test_parity_smollm2.py`` bounds it (max 1e-4, mean 1e-5, neither path worse than the other
against float64); tiny test models (|z| of a few units, 2 layers) stay under 1e-5.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rlvr_jax.model import ModelConfig, forward, unembed_matrix
from rlvr_jax.sampling.sampler import prompt_positions
from rlvr_jax.sampling.strategies import Strategy, temperature_scale, truncated_token_logprobs
from rlvr_jax.types import Rollout

try:  # the objective library's chunked log-probs (preferred when present)
  from rlvr_jax.logprobs import token_logprobs_from_hidden as _lib_logprobs_from_hidden
except ImportError:  # pragma: no cover - only while the objective library is being written
  _lib_logprobs_from_hidden = None


def truncated_logprobs_from_hidden(
  hidden: jax.Array,
  unembed: jax.Array,
  tokens: jax.Array,
  threshold: jax.Array | None,
  *,
  temperature: float = 1.0,
  chunk_size: int = 128,
) -> jax.Array:
  """``truncated_token_logprobs`` from final hidden states, chunked over T.

  Only one [B, chunk, V] block of logits exists at a time (also in the backward pass: each chunk
  is rematerialised), so a [B, T, V] array is never materialised.

  Args:
    hidden: [B, T, D] final hidden states predicting ``tokens``; unembed: [D, V].
    tokens: [B, T] ids; threshold: [B, T] float32 (``Rollout.sampler_threshold``) or None.
    temperature: the strategy's temperature tau, or [B] per-row scales (``temperature_scale``);
      chunk_size: tokens per chunk along T.
  Returns:
    [B, T] float32 log-probs.
  """
  B, T, D = hidden.shape
  if unembed.shape[0] != D or tokens.shape != (B, T):
    raise ValueError(
      f"hidden {hidden.shape}, unembed {unembed.shape}, tokens {tokens.shape} mismatch"
    )
  if threshold is None:
    threshold = jnp.full((B, T), jnp.finfo(jnp.float32).min, jnp.float32)
  tau = jnp.asarray(temperature, jnp.float32)
  if tau.ndim:
    if tau.shape != (B,):
      raise ValueError(f"temperature {tau.shape} must be a scalar or per-row [B] = ({B},)")
    tau = tau[:, None]  # broadcasts over each chunk's tokens [B, c]
  c = max(1, min(chunk_size, T))
  pad = (-T) % c
  padded = [
    jnp.pad(a, [(0, 0), (0, pad)] + [(0, 0)] * (a.ndim - 2)) for a in (hidden, tokens, threshold)
  ]
  split = lambda a: jnp.moveaxis(a.reshape(B, (T + pad) // c, c, *a.shape[2:]), 1, 0)

  @jax.checkpoint
  def one_chunk(args):
    h, y, thr = args
    logits = jnp.einsum(
      "bcd,dv->bcv", h, unembed.astype(h.dtype), preferred_element_type=jnp.float32
    )
    return truncated_token_logprobs(logits, y, thr, temperature=tau)

  out = jax.lax.map(one_chunk, tuple(split(a) for a in padded))  # [T/c, B, c]
  return jnp.moveaxis(out, 0, 1).reshape(B, T + pad)[:, :T]


def completion_hidden(params, rollout: Rollout, *, config: ModelConfig) -> jax.Array:
  """Final hidden states [B, T, D] predicting each completion token, from one full forward pass.

  Sequence = prompt [B, S] ++ completion [B, T]; completion token t sits at position
  prompt_length + t; tokens after the end are marked as padding (position -1).
  """
  prompt_pos = prompt_positions(rollout.prompt_mask)
  T = rollout.tokens.shape[1]
  start = jnp.max(prompt_pos, axis=1, keepdims=True) + 1
  completion_pos = jnp.where(rollout.completion_mask, start + jnp.arange(T)[None, :], -1)
  tokens = jnp.concatenate([rollout.prompt_tokens, rollout.tokens], axis=1)
  positions = jnp.concatenate([prompt_pos, completion_pos], axis=1)
  hidden, _ = forward(params, tokens, positions, config=config)
  S = rollout.prompt_tokens.shape[1]
  return hidden[:, S - 1 : S + T - 1]


@functools.partial(jax.jit, static_argnames=("config", "strategy", "chunk_size"))
def recompute_logprobs(
  params,
  rollout: Rollout,
  *,
  config: ModelConfig,
  strategy: Strategy,
  temperatures: jax.Array | None = None,
  chunk_size: int = 128,
) -> tuple[jax.Array, jax.Array]:
  """Trainer-side log-probs of a Rollout's tokens: (sampler-distribution logp, model logp).

  The first is under the strategy's distribution (temperature tau, and the sampler's truncation
  re-applied from ``rollout.sampler_threshold``); the second under softmax(logits) (tau = 1).
  Both [B, T] float32 (zeros are not forced on masked tokens: use ``completion_mask``).
  ``temperatures``: the per-row [B] temperatures the rollout was sampled with (0 = greedy row;
  ``sampler.row_temperatures``), if any.
  """
  hidden = completion_hidden(params, rollout, config=config)
  unembed = unembed_matrix(params, config)
  tokens = rollout.tokens

  def untruncated(temperature):
    if _lib_logprobs_from_hidden is not None:
      logp, _ = _lib_logprobs_from_hidden(
        hidden, unembed, tokens, temperature=temperature, compute_entropy=False
      )
      return logp.astype(jnp.float32)
    return truncated_logprobs_from_hidden(
      hidden, unembed, tokens, None, temperature=temperature, chunk_size=chunk_size
    )

  model_logp = untruncated(1.0)
  # Per-row temperatures always come with the sampler's truncation threshold (greedy rows need it).
  truncated = temperatures is not None or strategy.truncates
  if not truncated:
    return untruncated(strategy.temperature), model_logp
  if rollout.sampler_threshold is None:
    raise ValueError(
      "per-row temperatures need the rollout's sampler_threshold"
      if temperatures is not None
      else f"{strategy} truncates but the rollout has no sampler_threshold"
    )
  temperature = strategy.temperature if temperatures is None else temperature_scale(temperatures)
  sampler_logp = truncated_logprobs_from_hidden(
    hidden, unembed, tokens, rollout.sampler_threshold, temperature=temperature,
    chunk_size=chunk_size,
  )  # fmt: skip
  return sampler_logp, model_logp


def logprob_parity(
  params,
  rollout: Rollout,
  *,
  config: ModelConfig,
  strategy: Strategy,
  temperatures: jax.Array | None = None,
  chunk_size: int = 128,
) -> dict[str, jax.Array]:
  """Max and mean |recomputed - sampler| log-prob gaps over completion tokens (float32 scalars).

  Keys: ``sampler_logp_gap/max``, ``sampler_logp_gap/mean`` (vs ``rollout.sampler_logp``, the
  distribution sampled from) and ``model_logp_gap/max``, ``model_logp_gap/mean`` (vs
  ``rollout.model_logp``, tau = 1). One forward pass over the rollout (same cost as the trainer's
  old-log-prob recompute). ``temperatures``: as in ``recompute_logprobs``.
  """
  sampler_logp, model_logp = recompute_logprobs(
    params,
    rollout,
    config=config,
    strategy=strategy,
    temperatures=temperatures,
    chunk_size=chunk_size,
  )
  mask = rollout.completion_mask
  count = jnp.maximum(jnp.sum(mask), 1)  # empty batch: gaps are 0, not NaN
  out = {}
  for name, ours, theirs in (
    ("sampler_logp_gap", sampler_logp, rollout.sampler_logp),
    ("model_logp_gap", model_logp, rollout.model_logp),
  ):
    gap = jnp.where(mask, jnp.abs(ours - theirs), 0.0)
    out[f"{name}/max"] = jnp.max(gap)
    out[f"{name}/mean"] = jnp.sum(gap) / count
  return out
