"""Tile-level math shared by `logprobs.token_stats` (chunked, recomputing) and `logprobs.fused` (one sweep).

A tile is C tokens x Vb vocabulary columns of float32 tempered logits z = h W_b / τ. Statistics over
the whole vocabulary are folded block by block (online logsumexp); the cotangent rules are those of the
`logprobs` module docstring.

The vocabulary blocks are a static Python loop (ceil(V / Vb) of them, the last one narrower), not a
``scan``: every block is then a static slice of the unembedding. XLA:CPU keeps a bfloat16 array
that a loop slices dynamically as a float32 copy and converts each slice back (2.7x slower
products at SmolLM2's [128, 576] x [576, 8192] blocks, docs/benchmarks.md), and the gradient of a
static block is a carry of its own instead of a dynamic-update-slice of the whole [D, V] buffer.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

DEFAULT_VOCAB_CHUNK_SIZE = 8192  # vocabulary columns per block (Vb)


def chunk_stats(z, y, want_entropy, want_mean):
  """(logp, lse, entropy, mu) of whole-vocabulary rows z [C, V]; entropy/mu are zeros if unwanted."""
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


def chunk_dz(z, cols, y, lse, entropy, g_logp, g_entropy, g_mu, vocab_size):
  """Cotangent w.r.t. tempered logits z [C, Vb] (vocabulary columns `cols` [Vb]) from [C] cotangents."""
  log_p = z - lse[:, None]
  p = jnp.exp(log_p)
  onehot = cols[None, :] == y[:, None]
  # Σ of the three rules of the module docstring, grouped so the −p terms share one product.
  coef = g_logp + g_mu
  dz = jnp.where(onehot, g_logp[:, None], 0.0) + g_mu[:, None] / vocab_size
  return dz - p * (coef[:, None] + g_entropy[:, None] * (log_p + entropy[:, None]))


def hidden_logits(h, w, inv_tau):
  return jnp.dot(h, w, preferred_element_type=jnp.float32) * inv_tau


def vocab_blocks(vocab_size: int, block: int) -> list[tuple[int, int]]:
  """Static (start, stop) columns of the ceil(V / Vb) vocabulary blocks; the last may be narrower."""
  return [(start, min(start + block, vocab_size)) for start in range(0, vocab_size, block)]


class Online(NamedTuple):
  """Running statistics of a row over the vocabulary blocks seen so far (each [C] float32)."""

  m: jax.Array  # running max of z
  s: jax.Array  # Σ e^{z − m}
  a: jax.Array  # Σ e^{z − m}·(z − m)
  z_y: jax.Array  # z of the given token
  z_sum: jax.Array  # Σ z

  @classmethod
  def start(cls, shape):
    zeros = jnp.zeros(shape, jnp.float32)
    return cls(jnp.full(shape, -1e30, jnp.float32), zeros, zeros, zeros, zeros)

  def fold(self, z, start, y, want_entropy, want_mean):
    """Folds in one [C, Vb] block of z, the vocabulary columns [start, start + Vb)."""
    new_m = jnp.maximum(self.m, jnp.max(z, axis=-1))
    scale = jnp.exp(self.m - new_m)
    shifted = z - new_m[:, None]
    e = jnp.exp(shifted)
    s = self.s * scale + jnp.sum(e, axis=-1)
    a = self.a
    if want_entropy:  # a = Σ e·(z − m), rescaled to the new running max
      a = scale * (a + (self.m - new_m) * self.s) + jnp.sum(e * shifted, axis=-1)
    cols = start + jnp.arange(z.shape[-1])
    z_y = self.z_y + jnp.sum(jnp.where(cols[None, :] == y[:, None], z, 0.0), axis=-1)
    z_sum = self.z_sum + jnp.sum(z, axis=-1) if want_mean else self.z_sum
    return Online(new_m, s, a, z_y, z_sum)

  def finish(self, vocab_size, want_entropy, want_mean):
    """(logp, lse, entropy, mu) from the statistics of the whole vocabulary."""
    log_s = jnp.log(self.s)
    lse = self.m + log_s
    zeros = jnp.zeros_like(lse)
    entropy = log_s - self.a / self.s if want_entropy else zeros
    mu = self.z_sum / vocab_size - lse if want_mean else zeros
    return self.z_y - lse, lse, entropy, mu


def forward_tile(h_c, w, y_c, inv_tau, vblock, want_entropy, want_mean=False, keep_logits=False):
  """Folds one token tile's logits z = h_c W / τ over the vocabulary blocks of Vb = ``vblock``.

  Returns (the ``Online`` statistics of the whole vocabulary, the blocks' z, a tuple of [C, Vb]
  arrays, if ``keep_logits`` else None)."""
  online = Online.start(y_c.shape)
  zs = []
  for start, stop in vocab_blocks(w.shape[1], vblock):
    # Orders the blocks one after the other. Measured on XLA:CPU: the same peak memory without
    # it (the unrolled blocks' buffers are not reused either way), a 2-3% slower sweep.
    h_c, online = jax.lax.optimization_barrier((h_c, online))
    z = hidden_logits(h_c, w[:, start:stop], inv_tau)
    online = online.fold(z, start, y_c, want_entropy, want_mean)
    zs.append(z)
  return online, tuple(zs) if keep_logits else None


def check_common(name, x, tokens, temperature, chunk_size):
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise TypeError(f"{name} must be floating point, got dtype {x.dtype}")
  if not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise TypeError(f"tokens must be integer ids, got dtype {tokens.dtype}")
  if x.shape[:-1] != tokens.shape:
    raise ValueError(
      f"{name} shape {x.shape} must be tokens shape {tokens.shape} plus one trailing axis"
    )
  check_positive_int("chunk_size", chunk_size)
  if isinstance(temperature, int | float) and not temperature > 0:
    raise ValueError(f"temperature must be > 0, got {temperature}")


def check_positive_int(name, value, allow_none=False):
  if allow_none and value is None:
    return
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    extra = " or None" if allow_none else ""
    raise ValueError(f"{name} must be a positive int{extra}, got {value!r}")


def check_unembed(hidden, unembed):
  if unembed.ndim != 2 or unembed.shape[0] != hidden.shape[-1]:
    raise ValueError(
      f"unembed must be [D, V] with D = hidden.shape[-1]; got unembed {unembed.shape}, "
      f"hidden {hidden.shape}"
    )
  if not jnp.issubdtype(unembed.dtype, jnp.floating):
    raise TypeError(f"unembed must be floating point, got dtype {unembed.dtype}")


def inv_temperature(temperature):
  return 1.0 / jnp.asarray(temperature, jnp.float32)


def token_tiles(hidden, tokens, vocab_size, chunk_size):
  """(h [K, C, D], y [K, C] int32 clipped into [0, V), n): flattened tokens in K tiles of C rows.

  The last tile is padded with zero rows (a uniform distribution: finite, dropped afterwards)."""
  d = hidden.shape[-1]
  h = hidden.reshape(-1, d)
  y = jnp.clip(tokens.reshape(-1), 0, vocab_size - 1).astype(jnp.int32)
  n = h.shape[0]
  chunk = max(1, min(chunk_size, n))
  num_tiles = -(-n // chunk)
  pad = num_tiles * chunk - n
  h = jnp.pad(h, ((0, pad), (0, 0))).reshape(num_tiles, chunk, d)
  y = jnp.pad(y, (0, pad)).reshape(num_tiles, chunk)
  return h, y, n


def zero_dw(w, vblock):
  """The float32 gradient of ``w`` [D, V] as per-block accumulators (``backward_tile``'s dw)."""
  return tuple(
    jnp.zeros((w.shape[0], stop - start), jnp.float32)
    for start, stop in vocab_blocks(w.shape[1], vblock)
  )


def joined_dw(dw):
  """[D, V] from the per-block accumulators of ``zero_dw``."""
  return jnp.concatenate(dw, axis=1)


def transposed(x):
  """``x`` with its last two axes swapped, for ``backward_tile``: computed once, outside the
  caller's loop over token tiles, where XLA cannot fold the transpose back into the products."""
  return jnp.swapaxes(x, -1, -2)


def backward_tile(dw, h_c, h_t, w, w_t, y_c, lse, entropy, cotangents, inv_tau, vblock, zs=None):
  """Adds one token tile's gradient to dw (``zero_dw``'s per-block float32 accumulators) and
  returns (dw, dh_c [C, D]).

  h_t, w_t: the tile h_c [C, D] and ``w`` transposed, materialised by the caller outside its loop
  over tiles (``transposed``). cotangents: (g_logp, g_entropy, g_mu), each [C]. zs: the tile's
  logits blocks when kept (fused path, ``forward_tile``), else None and each block is recomputed
  from (h_c, w).

  Both products are plain [M, K] x [K, N] matmuls: dh_c = dz W_bᵀ reads rows of w_t, dW_b = h_cᵀ dz
  reads h_t. With bfloat16 operands XLA:CPU runs only that form on the bfloat16 units: given a
  transposed operand (or a transpose it can fold into the product) it upcasts both operands to
  float32."""
  vocab_size = w.shape[1]
  g_logp, g_entropy, g_mu = cotangents
  h_t = h_t.astype(w.dtype)
  blocks = vocab_blocks(vocab_size, vblock)
  dh_c = jnp.zeros(h_c.shape, jnp.float32)
  new_dw = []
  for i, (start, stop) in enumerate(blocks):
    h_c, dh_c = jax.lax.optimization_barrier((h_c, dh_c))  # block order, as in forward_tile
    z = hidden_logits(h_c, w[:, start:stop], inv_tau) if zs is None else zs[i]
    cols = start + jnp.arange(stop - start)
    dz = chunk_dz(z, cols, y_c, lse, entropy, g_logp, g_entropy, g_mu, vocab_size)
    # d/d(h @ w); bfloat16 inputs: rounded to bfloat16, both products accumulate in float32, as
    # the forward's logits do.
    dz = (dz * inv_tau).astype(w.dtype)
    dh_c = dh_c + jnp.dot(dz, w_t[start:stop], preferred_element_type=jnp.float32)
    new_dw.append(dw[i] + jnp.dot(h_t, dz, preferred_element_type=jnp.float32))
  return tuple(new_dw), dh_c.astype(h_c.dtype)
