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
unembedding, accumulated in place. From logits, the [N, V] input and its [N, V] gradient (in the input
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

DEFAULT_CHUNK_SIZE = 1024
DEFAULT_VOCAB_CHUNK_SIZE = 8192

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
# Per-chunk math, on float32 tempered logits z [C, V].


def _chunk_stats(z, y, want_entropy, want_mean):
  """(logp, lse, entropy, mu) for one chunk; entropy/mu are zeros when not wanted."""
  zmax = jnp.max(z, axis=-1, keepdims=True)
  shifted = z - zmax
  e = jnp.exp(shifted)
  s = jnp.sum(e, axis=-1)
  log_s = jnp.log(s)
  lse = zmax[:, 0] + log_s
  z_y = jnp.take_along_axis(z, y[:, None], axis=-1)[:, 0]
  logp = z_y - lse
  if want_entropy:
    # H = log s − Σ e·(z − max)/s: the shifted form avoids cancelling two large numbers.
    entropy = log_s - jnp.sum(e * shifted, axis=-1) / s
  else:
    entropy = jnp.zeros_like(lse)
  mu = jnp.mean(z, axis=-1) - lse if want_mean else jnp.zeros_like(lse)
  return logp, lse, entropy, mu


def _chunk_dz(z, cols, y, lse, entropy, g_logp, g_entropy, g_mu, vocab_size):
  """Cotangent w.r.t. tempered logits z [C, Vb] (vocabulary columns `cols` [Vb]) from [C] cotangents."""
  log_p = z - lse[:, None]
  p = jnp.exp(log_p)
  onehot = cols[None, :] == y[:, None]
  # Σ of the three rules of the module docstring, grouped so the −p terms share one product.
  coef = g_logp + g_mu
  dz = jnp.where(onehot, g_logp[:, None], 0.0) + g_mu[:, None] / vocab_size
  return dz - p * (coef[:, None] + g_entropy[:, None] * (log_p + entropy[:, None]))


# ----------------------------------------------------------------------------------------------
# From hidden states: custom VJP with per-chunk recomputation. Tokens are split into chunks of C
# rows and the vocabulary into blocks of Vb columns; the forward pass folds blocks into running
# (max, Σe, Σe·(z − max)) statistics (online logsumexp), the backward pass recomputes each
# [C, Vb] block and adds its contribution to dhidden and, in place, to its columns of dunembed.


def _hidden_logits(h, w, inv_tau):
  return jnp.dot(h, w, preferred_element_type=jnp.float32) * inv_tau


def _vocab_blocks(vocab_size, block):
  """(index, start column) of ceil(V / Vb) blocks; the last one is shifted back to fit inside V.

  Columns of the shifted block that an earlier block already covered are "stale": they are
  excluded (col < index * Vb), so every column is counted exactly once.
  """
  index = jnp.arange(-(-vocab_size // block))
  return index, jnp.minimum(index * block, vocab_size - block)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _hidden_stats(h, w, y, inv_tau, vblock, want_entropy, want_mean):
  """h [n, C, D], w [D, V], y [n, C] -> (logp, entropy, mu), each [n, C] float32."""
  out, _ = _hidden_stats_fwd(h, w, y, inv_tau, vblock, want_entropy, want_mean)
  return out


def _hidden_stats_fwd(h, w, y, inv_tau, vblock, want_entropy, want_mean):
  vocab_size = w.shape[1]

  def one_chunk(args):
    h_c, y_c = args

    def one_block(carry, block):
      m, s, a, z_y, z_sum = carry
      index, start = block
      z = _hidden_logits(h_c, jax.lax.dynamic_slice_in_dim(w, start, vblock, axis=1), inv_tau)
      cols = start + jnp.arange(vblock)
      fresh = (cols >= index * vblock)[None, :]
      new_m = jnp.maximum(m, jnp.max(jnp.where(fresh, z, -jnp.inf), axis=-1))
      scale = jnp.exp(m - new_m)
      shifted = z - new_m[:, None]
      e = jnp.where(fresh, jnp.exp(shifted), 0.0)
      s_new = s * scale + jnp.sum(e, axis=-1)
      if want_entropy:  # a = Σ e·(z − m), rescaled to the new running max
        a = scale * (a + (m - new_m) * s) + jnp.sum(e * shifted, axis=-1)
      z_y = z_y + jnp.sum(jnp.where(fresh & (cols[None, :] == y_c[:, None]), z, 0.0), axis=-1)
      if want_mean:
        z_sum = z_sum + jnp.sum(jnp.where(fresh, z, 0.0), axis=-1)
      return (new_m, s_new, a, z_y, z_sum), None

    zeros = jnp.zeros(y_c.shape, jnp.float32)
    init = (jnp.full(y_c.shape, -1e30, jnp.float32), zeros, zeros, zeros, zeros)
    (m, s, a, z_y, z_sum), _ = jax.lax.scan(one_block, init, _vocab_blocks(vocab_size, vblock))
    log_s = jnp.log(s)
    lse = m + log_s
    entropy = log_s - a / s if want_entropy else zeros
    mu = z_sum / vocab_size - lse if want_mean else zeros
    return z_y - lse, lse, entropy, mu

  logp, lse, entropy, mu = jax.lax.map(one_chunk, (h, y))
  return (logp, entropy, mu), (h, w, y, inv_tau, lse, entropy)


def _hidden_stats_bwd(vblock, want_entropy, want_mean, residuals, cotangents):
  h, w, y, inv_tau, lse, entropy = residuals
  g_logp, g_entropy, g_mu = cotangents
  if not want_entropy:
    g_entropy = jnp.zeros_like(g_logp)
  if not want_mean:
    g_mu = jnp.zeros_like(g_logp)
  vocab_size = w.shape[1]

  def one_chunk(dw, args):
    h_c, y_c, lse_c, ent_c, gl_c, ge_c, gm_c = args

    def one_block(carry, block):
      dw, dh_c = carry
      index, start = block
      w_b = jax.lax.dynamic_slice_in_dim(w, start, vblock, axis=1)
      z = _hidden_logits(h_c, w_b, inv_tau)
      cols = start + jnp.arange(vblock)
      dz = _chunk_dz(z, cols, y_c, lse_c, ent_c, gl_c, ge_c, gm_c, vocab_size)
      dz = jnp.where((cols >= index * vblock)[None, :], dz * inv_tau, 0.0)  # d/d(h @ w)
      dh_c = dh_c + jnp.dot(dz, w_b.T, preferred_element_type=jnp.float32)
      dw_b = jax.lax.dynamic_slice_in_dim(dw, start, vblock, axis=1)
      dw_b = dw_b + jnp.dot(h_c.T, dz, preferred_element_type=jnp.float32)
      return (jax.lax.dynamic_update_slice_in_dim(dw, dw_b, start, axis=1), dh_c), None

    dh0 = jnp.zeros(h_c.shape, jnp.float32)
    (dw, dh_c), _ = jax.lax.scan(one_block, (dw, dh0), _vocab_blocks(vocab_size, vblock))
    return dw, dh_c.astype(h.dtype)

  dw0 = jnp.zeros(w.shape, jnp.float32)
  xs = (h, y, lse, entropy, g_logp, g_entropy, g_mu)
  dw, dh = jax.lax.scan(one_chunk, dw0, xs)
  return dh, dw.astype(w.dtype), None, jnp.zeros_like(inv_tau)


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
    stats = _chunk_stats(z, y_c, want_entropy, want_mean)
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
    dz = _chunk_dz(
      z, cols, sl(y), sl(lse), sl(entropy), sl(g_logp), sl(g_entropy), sl(g_mu), z.shape[-1]
    )
    dz = (dz * inv_tau).astype(logits.dtype)
    return jax.lax.dynamic_update_slice_in_dim(dlogits, dz, start, 0), None

  dlogits, _ = jax.lax.scan(one_chunk, jnp.zeros_like(logits), _chunk_starts(n, chunk))
  return dlogits, None, jnp.zeros_like(inv_tau)


_logits_stats.defvjp(_logits_stats_fwd, _logits_stats_bwd)


# ----------------------------------------------------------------------------------------------
# Public API.


def _check_common(name, x, tokens, temperature, chunk_size):
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise TypeError(f"{name} must be floating point, got dtype {x.dtype}")
  if not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise TypeError(f"tokens must be integer ids, got dtype {tokens.dtype}")
  if x.shape[:-1] != tokens.shape:
    raise ValueError(
      f"{name} shape {x.shape} must be tokens shape {tokens.shape} plus one trailing axis"
    )
  if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
    raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
  if isinstance(temperature, int | float) and not temperature > 0:
    raise ValueError(f"temperature must be > 0, got {temperature}")


def _inv_temperature(temperature):
  return 1.0 / jnp.asarray(temperature, jnp.float32)


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
  _check_common("hidden", hidden, tokens, temperature, chunk_size)
  if unembed.ndim != 2 or unembed.shape[0] != hidden.shape[-1]:
    raise ValueError(
      f"unembed must be [D, V] with D = hidden.shape[-1]; got unembed {unembed.shape}, "
      f"hidden {hidden.shape}"
    )
  if not jnp.issubdtype(unembed.dtype, jnp.floating):
    raise TypeError(f"unembed must be floating point, got dtype {unembed.dtype}")
  if vocab_chunk_size is not None and (
    not isinstance(vocab_chunk_size, int)
    or isinstance(vocab_chunk_size, bool)
    or vocab_chunk_size < 1
  ):
    raise ValueError(f"vocab_chunk_size must be a positive int or None, got {vocab_chunk_size!r}")
  lead, d, v = tokens.shape, hidden.shape[-1], unembed.shape[-1]
  h = hidden.reshape(-1, d)
  y = jnp.clip(tokens.reshape(-1), 0, v - 1).astype(jnp.int32)
  n = h.shape[0]
  chunk = max(1, min(chunk_size, n))
  num_chunks = -(-n // chunk)
  pad = num_chunks * chunk - n  # zero rows: a uniform distribution, finite and dropped below
  h = jnp.pad(h, ((0, pad), (0, 0))).reshape(num_chunks, chunk, d)
  y = jnp.pad(y, (0, pad)).reshape(num_chunks, chunk)
  inv_tau = _inv_temperature(temperature)
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
  _check_common("logits", logits, tokens, temperature, chunk_size)
  lead, v = tokens.shape, logits.shape[-1]
  flat = logits.reshape(-1, v)
  y = jnp.clip(tokens.reshape(-1), 0, v - 1).astype(jnp.int32)
  chunk = max(1, min(chunk_size, flat.shape[0]))
  inv_tau = _inv_temperature(temperature)
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
