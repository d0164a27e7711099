"""Per-token log-probs, entropy and mean log-softmax, float32, chunked over tokens.

For each position the statistics of the tempered distribution π = softmax(z), z = logits / τ, are

  logp = z_y − logsumexp(z)                                   log-prob of the given token y
  H    = logsumexp(z) − Σ_v π_v z_v = −Σ_v π_v log π_v         full-vocabulary entropy
  μ    = (1/V) Σ_v log π_v = mean_v(z_v) − logsumexp(z)        mean log-softmax (METHODS.md §1.1)

Temperature rule (METHODS.md §1.1): the trainer must divide by the sampling temperature τ, otherwise the
on-policy ratio is not 1. Gradients (custom VJP, with z' = ∂/∂z):

  ∂logp/∂z_v = 𝟙[v = y] − π_v,   ∂H/∂z_v = −π_v (log π_v + H),   ∂μ/∂z_v = 1/V − π_v.

Memory. A whole [N, V] float32 array (N = B·T flattened tokens) is never built: from hidden states, the
forward and the backward pass both walk over [chunk_size, vocab_chunk_size] tiles of the logits (an online
logsumexp over vocabulary blocks), and the backward pass recomputes each tile from (hidden, unembed)
instead of saving it. The largest buffers are a few tiles plus the [D, V] float32 gradient of the
unembedding; the memory does not grow with N. (The vocabulary blocks are unrolled, ``tiles``; XLA:CPU
does not reuse their buffers within a token chunk, so there the peak is about two [chunk_size, V]
float32 arrays.) From logits, the [N, V] input and its [N, V] gradient (in the input
dtype) exist anyway; only the float32 upcast is chunked (over tokens). This is the "fused linear
cross-entropy" idea (Liger-Kernel, arXiv 2410.10989) extended to entropy and μ; GRPO is arXiv 2402.03300.

Inputs may be bfloat16; logits, reductions and gradients are accumulated in float32 and the gradients are
cast back to the input dtypes. `temperature` is treated as a constant (its cotangent is zero). Token ids
outside [0, V) (e.g. a −1 padding id) are clipped into range, so padded positions give finite values and
gradients; mask them out downstream.

Shapes use the glossary of `rlvr_jax.types`: hidden [B, T, D], unembed [D, V], tokens [B, T], logits
[B, T, V]; any leading shape works in place of [B, T].
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlvr_jax.logprobs import tiles

DEFAULT_CHUNK_SIZE = 1024
DEFAULT_VOCAB_CHUNK_SIZE = tiles.DEFAULT_VOCAB_CHUNK_SIZE

__all__ = [
  "DEFAULT_CHUNK_SIZE",
  "DEFAULT_VOCAB_CHUNK_SIZE",
  "TokenStats",
  "token_logprobs_from_hidden",
  "token_logprobs_from_logits",
  "token_stats_from_hidden",
  "token_stats_from_logits",
]


class TokenStats(NamedTuple):
  """Per-token statistics, float32, each with the leading shape of `tokens` (None where not computed).

  Attributes:
    logp: log π(y) of the given tokens.
    entropy: full-vocabulary entropy H.
    mean_log_softmax: μ = (1/V) Σ_v log π_v.
  """

  logp: jax.Array
  entropy: jax.Array | None
  mean_log_softmax: jax.Array | None


# ----------------------------------------------------------------------------------------------
# From hidden states: custom VJP with per-chunk recomputation. Tokens are split into chunks of C
# rows and the vocabulary into blocks of Vb columns; the forward pass folds blocks into running
# (max, Σe, Σe·(z − max)) statistics (online logsumexp), the backward pass recomputes each
# [C, Vb] block and adds its contribution to dhidden and, in place, to its columns of dunembed.


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _hidden_stats(h, w, y, inv_tau, vblock, want_entropy, want_mean):
  """h [n, C, D], w [D, V], y [n, C] -> (logp, entropy, mu), each [n, C] float32."""
  out, _ = _hidden_stats_fwd(h, w, y, inv_tau, vblock, want_entropy, want_mean)
  return out


def _hidden_stats_fwd(h, w, y, inv_tau, vblock, want_entropy, want_mean):
  vocab_size = w.shape[1]

  def one_chunk(args):
    h_c, y_c = args
    online, _ = tiles.forward_tile(h_c, w, y_c, inv_tau, vblock, want_entropy, want_mean)
    return online.finish(vocab_size, want_entropy, want_mean)

  logp, lse, entropy, mu = jax.lax.map(one_chunk, (h, y))
  return (logp, entropy, mu), (h, w, y, inv_tau, lse, entropy)


def _hidden_stats_bwd(vblock, want_entropy, want_mean, residuals, cotangents):
  h, w, y, inv_tau, lse, entropy = residuals
  g_logp, g_entropy, g_mu = cotangents
  if not want_entropy:
    g_entropy = jnp.zeros_like(g_logp)
  if not want_mean:
    g_mu = jnp.zeros_like(g_logp)

  def one_chunk(dw, args):
    h_c, h_t, y_c, lse_c, ent_c, gl_c, ge_c, gm_c = args
    cotangents = (gl_c, ge_c, gm_c)
    return tiles.backward_tile(dw, h_c, h_t, w, w_t, y_c, lse_c, ent_c, cotangents, inv_tau, vblock)

  w_t = tiles.transposed(w)
  xs = (h, tiles.transposed(h), y, lse, entropy, g_logp, g_entropy, g_mu)
  dw, dh = jax.lax.scan(one_chunk, tiles.zero_dw(w, vblock), xs)
  return dh, tiles.joined_dw(dw).astype(w.dtype), None, jnp.zeros_like(inv_tau)


_hidden_stats.defvjp(_hidden_stats_fwd, _hidden_stats_bwd)


# ----------------------------------------------------------------------------------------------
# From logits: the [N, V] input exists; chunk the float32 upcast and the softmax temporaries.


def _chunk_starts(n, chunk):
  """Start rows of ceil(n / chunk) windows of `chunk` rows; the last one is shifted back to fit."""
  return jnp.minimum(jnp.arange(-(-n // chunk)) * chunk, n - chunk)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _logits_stats(logits, y, inv_tau, chunk, want_entropy, want_mean):
  """logits [N, V], y [N] -> (logp, entropy, mu), each [N] float32."""
  out, _ = _logits_stats_fwd(logits, y, inv_tau, chunk, want_entropy, want_mean)
  return out


def _logits_stats_fwd(logits, y, inv_tau, chunk, want_entropy, want_mean):
  n = logits.shape[0]

  def one_chunk(outs, start):
    z = jax.lax.dynamic_slice_in_dim(logits, start, chunk).astype(jnp.float32) * inv_tau
    y_c = jax.lax.dynamic_slice_in_dim(y, start, chunk)
    stats = tiles.chunk_stats(z, y_c, want_entropy, want_mean)
    # Overlapping rows of the shifted last window are rewritten with identical values.
    outs = tuple(
      jax.lax.dynamic_update_slice_in_dim(o, s, start, 0) for o, s in zip(outs, stats, strict=True)
    )
    return outs, None

  zeros = jnp.zeros((n,), jnp.float32)
  (logp, lse, entropy, mu), _ = jax.lax.scan(one_chunk, (zeros,) * 4, _chunk_starts(n, chunk))
  return (logp, entropy, mu), (logits, y, inv_tau, lse, entropy)


def _logits_stats_bwd(chunk, want_entropy, want_mean, residuals, cotangents):
  logits, y, inv_tau, lse, entropy = residuals
  g_logp, g_entropy, g_mu = cotangents
  if not want_entropy:
    g_entropy = jnp.zeros_like(g_logp)
  if not want_mean:
    g_mu = jnp.zeros_like(g_logp)
  n = logits.shape[0]

  def one_chunk(dlogits, start):
    sl = lambda a: jax.lax.dynamic_slice_in_dim(a, start, chunk)
    z = sl(logits).astype(jnp.float32) * inv_tau
    cols = jnp.arange(z.shape[-1])
    dz = tiles.chunk_dz(
      z, cols, sl(y), sl(lse), sl(entropy), sl(g_logp), sl(g_entropy), sl(g_mu), z.shape[-1]
    )
    dz = (dz * inv_tau).astype(logits.dtype)
    return jax.lax.dynamic_update_slice_in_dim(dlogits, dz, start, 0), None

  dlogits, _ = jax.lax.scan(one_chunk, jnp.zeros_like(logits), _chunk_starts(n, chunk))
  return dlogits, None, jnp.zeros_like(inv_tau)


_logits_stats.defvjp(_logits_stats_fwd, _logits_stats_bwd)


# ----------------------------------------------------------------------------------------------
# Public API.


def token_stats_from_hidden(
  hidden: jax.Array,
  unembed: jax.Array,
  tokens: jax.Array,
  *,
  temperature: float | jax.Array = 1.0,
  chunk_size: int = DEFAULT_CHUNK_SIZE,
  vocab_chunk_size: int | None = DEFAULT_VOCAB_CHUNK_SIZE,
  compute_entropy: bool = True,
  compute_mean_log_softmax: bool = False,
) -> TokenStats:
  """logp, entropy H and mean log-softmax μ of π = softmax(hidden @ unembed / τ), chunked.

  Args:
    hidden: [B, T, D] final hidden states (after the final norm), any float dtype.
    unembed: [D, V] unembedding matrix (the transposed HF `lm_head.weight`).
    tokens: [B, T] integer ids y whose log-prob is wanted (the next tokens).
    temperature: τ > 0, the sampling temperature (a constant: no gradient flows to it).
    chunk_size: tokens per chunk (C).
    vocab_chunk_size: vocabulary columns per block (Vb; None: the whole vocabulary). The largest
      temporaries are a few [C, Vb] float32 blocks plus the [D, V] float32 gradient of `unembed`.
    compute_entropy: also return H (differentiable).
    compute_mean_log_softmax: also return μ (differentiable).

  Returns:
    `TokenStats` of [B, T] float32 arrays, differentiable w.r.t. `hidden` and `unembed`.
  """
  tiles.check_common("hidden", hidden, tokens, temperature, chunk_size)
  tiles.check_unembed(hidden, unembed)
  tiles.check_positive_int("vocab_chunk_size", vocab_chunk_size, allow_none=True)
  lead, v = tokens.shape, unembed.shape[-1]
  h, y, n = tiles.token_tiles(hidden, tokens, v, chunk_size)
  inv_tau = tiles.inv_temperature(temperature)
  vblock = v if vocab_chunk_size is None else min(vocab_chunk_size, v)
  logp, entropy, mu = _hidden_stats(
    h, unembed, y, inv_tau, vblock, compute_entropy, compute_mean_log_softmax
  )
  unpad = lambda a: a.reshape(-1)[:n].reshape(lead)
  return TokenStats(
    unpad(logp),
    unpad(entropy) if compute_entropy else None,
    unpad(mu) if compute_mean_log_softmax else None,
  )


def token_stats_from_logits(
  logits: jax.Array,
  tokens: jax.Array,
  *,
  temperature: float | jax.Array = 1.0,
  chunk_size: int = DEFAULT_CHUNK_SIZE,
  compute_entropy: bool = True,
  compute_mean_log_softmax: bool = False,
) -> TokenStats:
  """logp, entropy H and mean log-softmax μ of π = softmax(logits / τ), float32, chunked over tokens.

  Args:
    logits: [B, T, V] any float dtype.
    tokens: [B, T] integer ids y.
    temperature: τ > 0 (a constant: no gradient flows to it).
    chunk_size: tokens per chunk for the float32 temporaries.
    compute_entropy: also return H (differentiable).
    compute_mean_log_softmax: also return μ (differentiable).

  Returns:
    `TokenStats` of [B, T] float32 arrays, differentiable w.r.t. `logits` (gradient in its dtype).
  """
  tiles.check_common("logits", logits, tokens, temperature, chunk_size)
  lead, v = tokens.shape, logits.shape[-1]
  flat = logits.reshape(-1, v)
  y = jnp.clip(tokens.reshape(-1), 0, v - 1).astype(jnp.int32)
  chunk = max(1, min(chunk_size, flat.shape[0]))
  inv_tau = tiles.inv_temperature(temperature)
  logp, entropy, mu = _logits_stats(
    flat, y, inv_tau, chunk, compute_entropy, compute_mean_log_softmax
  )
  return TokenStats(
    logp.reshape(lead),
    entropy.reshape(lead) if compute_entropy else None,
    mu.reshape(lead) if compute_mean_log_softmax else None,
  )


def token_logprobs_from_hidden(
  hidden: jax.Array,
  unembed: jax.Array,
  tokens: jax.Array,
  *,
  temperature: float | jax.Array = 1.0,
  chunk_size: int = DEFAULT_CHUNK_SIZE,
  vocab_chunk_size: int | None = DEFAULT_VOCAB_CHUNK_SIZE,
  compute_entropy: bool = True,
) -> tuple[jax.Array, jax.Array | None]:
  """(logp [B, T], entropy [B, T] or None) from hidden [B, T, D] and unembed [D, V].

  See `token_stats_from_hidden` for the formulas and arguments.
  """
  stats = token_stats_from_hidden(
    hidden,
    unembed,
    tokens,
    temperature=temperature,
    chunk_size=chunk_size,
    vocab_chunk_size=vocab_chunk_size,
    compute_entropy=compute_entropy,
  )
  return stats.logp, stats.entropy


def token_logprobs_from_logits(
  logits: jax.Array,
  tokens: jax.Array,
  *,
  temperature: float | jax.Array = 1.0,
  chunk_size: int = DEFAULT_CHUNK_SIZE,
  compute_entropy: bool = True,
) -> tuple[jax.Array, jax.Array | None]:
  """(logp [B, T], entropy [B, T] or None) from logits [B, T, V].

  See `token_stats_from_logits` for the formulas and arguments.
  """
  stats = token_stats_from_logits(
    logits, tokens, temperature=temperature, chunk_size=chunk_size, compute_entropy=compute_entropy
  )
  return stats.logp, stats.entropy
