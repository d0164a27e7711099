"""A token-local objective fused into the log-prob sweep: three matmul passes instead of four.

`logprobs.token_stats_from_hidden` keeps memory flat by recomputing every logits tile in the backward
pass: z = h W (forward), then z again, dh = dz Wᵀ and dW = hᵀ dz (backward), four [N, D] x [D, V]
matmul passes. When the objective's gradient is TOKEN-LOCAL,

  ∂L/∂logp_t and ∂L/∂H_t depend on (logp_t, H_t) and constants only, not on other tokens' values,

the cotangent of each tile is known as soon as the tile's statistics are. The forward sweep takes C
tokens at a time, computes their logits z = h W block by block over the vocabulary (Vb columns,
kept: C x V float32 per tile), their logp / H (online logsumexp), the objective's cotangents
(g_logp, g_H) for those tokens, then walks the kept blocks again for dz (rules in `token_stats`),
dh += dz W_bᵀ and dW_b += hᵀ dz. The backward pass only scales the stored gradients by the loss
cotangent: three matmul passes, the count of a logits-materialising implementation (two for a
tile whose tokens carry no gradient: padding, masked or zero-advantage tokens), with one
[C, V] float32 tile alive (78 MB at C = 128, V = 151,936) instead of [N, V]. This is the
"gradient in the forward pass" scheme of fused linear cross-entropy kernels (Liger-Kernel,
arXiv 2410.10989), opened up to any token-local objective: PPO-clip / GRPO / DAPO / Dr.GRPO / CISPO /
GPPO / SAPO surrogates, every aggregation mode (the normalisers are constants of the step batch),
constant token weights and selections computed beforehand (step-scope statistics), k1/k2/k3 KL to a
reference and the entropy bonus. NOT token-local: GSPO / GMPO (sequence-level ratio), off-policy
sequence masking (OPSM), and statistics computed from the current log-probs inside the objective
(scope='micro'); for those the gradient from this function is wrong, use the unfused path.

How the cotangents of a tile are obtained without knowing later tiles: the objective is evaluated on
the whole [B, T] arrays in which the tiles swept so far hold their values and the rest hold
placeholders (``logp_fill`` / zeros); for a token-local objective the cotangent at the tile's
positions does not depend on the placeholders. The objective is elementwise work, so evaluating its
VJP once per tile costs O(N²/C) flops against the O(N D V) of the matmuls.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.logprobs import tiles

DEFAULT_FUSED_CHUNK_SIZE = 128


def _zero_cotangent(x):
  x = jnp.asarray(x)
  if jnp.issubdtype(x.dtype, jnp.inexact):
    return jnp.zeros_like(x)
  return np.zeros(x.shape, jax.dtypes.float0)


def _tile_forward(h_c, w, y_c, inv_tau, want_entropy, keep_logits):
  """(logp, lse, entropy) [C] of one token tile and its kept logits blocks (or None)."""
  vblock = min(w.shape[1], tiles.DEFAULT_VOCAB_CHUNK_SIZE)
  online, zs = tiles.forward_tile(h_c, w, y_c, inv_tau, vblock, want_entropy, False, keep_logits)
  logp, lse, entropy, _ = online.finish(w.shape[1], want_entropy, False)
  return logp, lse, entropy, zs


def min_p_proxy_from_hidden(hidden, unembed, tokens, *, min_p, temperature, chunk_size):
  """Lp-Reg's min-p proxy log-prob (``regularizers.min_p_proxy_logp``) from hidden states, in one
  matmul pass over [C, V] token tiles (the kept-set test needs the row maximum first, so each
  tile's logits blocks are kept). No gradient."""
  tiles.check_common("hidden", hidden, tokens, temperature, chunk_size)
  tiles.check_unembed(hidden, unembed)
  if not 0.0 < min_p <= 1.0:
    raise ValueError(f"min_p must be in (0, 1], got {min_p}")
  v = unembed.shape[-1]
  h, y, n = tiles.token_tiles(jax.lax.stop_gradient(hidden), tokens, v, chunk_size)
  w = jax.lax.stop_gradient(unembed)
  inv_tau = tiles.inv_temperature(temperature)
  vblock = min(v, tiles.DEFAULT_VOCAB_CHUNK_SIZE)
  log_kappa = jnp.log(jnp.float32(min_p))

  def one_tile(args):
    h_c, y_c = args
    online, zs = tiles.forward_tile(h_c, w, y_c, inv_tau, vblock, False, keep_logits=True)
    floor = online.m + log_kappa  # kept: z >= max z + log kappa

    s_keep = jnp.zeros_like(online.m)
    for z in zs:
      keep = z >= floor[:, None]
      s_keep = s_keep + jnp.sum(jnp.where(keep, jnp.exp(z - online.m[:, None]), 0.0), axis=-1)
    lse_keep = online.m + jnp.log(s_keep)
    lse = online.m + jnp.log(online.s)
    # Filtered tokens: the reference sets their log-prob to -1e4 before renormalising.
    return jnp.where(online.z_y >= floor, online.z_y - lse_keep, -1e4 - (lse_keep - lse))

  proxy = jax.lax.map(one_tile, (h, y))
  return proxy.reshape(-1)[:n].reshape(tokens.shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _fused(loss_fn, want_entropy, h, w, y, inv_tau, fill, consts):
  """h [K, C, D], w [D, V], y [K, C], fill [K·C] -> (loss, logp [K, C], entropy [K, C])."""

  def one_tile(args):
    h_c, y_c = args
    logp, _, entropy, _ = _tile_forward(h_c, w, y_c, inv_tau, want_entropy, False)
    return logp, entropy

  logp, entropy = jax.lax.map(one_tile, (h, y))
  return loss_fn(logp.reshape(-1), entropy.reshape(-1), *consts), logp, entropy


def _fused_fwd(loss_fn, want_entropy, h, w, y, inv_tau, fill, consts):
  num_tiles, chunk, _ = h.shape
  vocab_size = w.shape[1]
  vblock = min(vocab_size, tiles.DEFAULT_VOCAB_CHUNK_SIZE)
  w_t = tiles.transposed(w)

  def tile_cotangents(logp_all, ent_all):
    _, vjp = jax.vjp(lambda lp, ent: loss_fn(lp, ent, *consts), logp_all, ent_all)
    return vjp(jnp.ones((), jnp.float32))

  def one_tile(carry, xs):
    dw, logp_all, ent_all = carry
    k, h_c, h_t, y_c = xs
    logp_c, lse_c, ent_c, zs = _tile_forward(h_c, w, y_c, inv_tau, want_entropy, True)
    start = k * chunk
    logp_all = jax.lax.dynamic_update_slice_in_dim(logp_all, logp_c, start, 0)
    ent_all = jax.lax.dynamic_update_slice_in_dim(ent_all, ent_c, start, 0)
    g_logp_all, g_ent_all = tile_cotangents(logp_all, ent_all)
    g_logp = jax.lax.dynamic_slice_in_dim(g_logp_all, start, chunk)
    g_ent = jax.lax.dynamic_slice_in_dim(g_ent_all, start, chunk)
    if not want_entropy:
      g_ent = jnp.zeros_like(g_ent)
    cotangents = (g_logp, g_ent, jnp.zeros_like(g_logp))
    # A tile without gradient (padding, masked or zero-advantage tokens without a regulariser)
    # has dz = 0 exactly: skip its two backward matmul passes.
    dw, dh_c = jax.lax.cond(
      jnp.any(g_logp != 0) | jnp.any(g_ent != 0),
      lambda dw: tiles.backward_tile(
        dw, h_c, h_t, w, w_t, y_c, lse_c, ent_c, cotangents, inv_tau, vblock, zs
      ),
      lambda dw: (dw, jnp.zeros_like(h_c)),
      dw,
    )
    return (dw, logp_all, ent_all), (logp_c, ent_c, dh_c)

  init = (tiles.zero_dw(w, vblock), fill, jnp.zeros_like(fill))
  xs = (jnp.arange(num_tiles), h, tiles.transposed(h), y)
  (dw, logp_all, ent_all), (logp, entropy, dh) = jax.lax.scan(one_tile, init, xs)
  loss = loss_fn(logp_all, ent_all, *consts)
  residuals = (dh, tiles.joined_dw(dw).astype(w.dtype), y, inv_tau, fill, consts)
  return (loss, logp, entropy), residuals


def _fused_bwd(loss_fn, want_entropy, residuals, cotangents):
  dh, dw, y, inv_tau, fill, consts = residuals
  g_loss = cotangents[0]  # logp / entropy leave through stop_gradient: their cotangents are zero
  return (
    (g_loss * dh).astype(dh.dtype),
    (g_loss * dw).astype(dw.dtype),
    _zero_cotangent(y),
    jnp.zeros_like(inv_tau),
    jnp.zeros_like(fill),
    jax.tree.map(_zero_cotangent, consts),
  )


_fused.defvjp(_fused_fwd, _fused_bwd)


def fused_objective_from_hidden(
  hidden: jax.Array,
  unembed: jax.Array,
  tokens: jax.Array,
  objective: Callable[[jax.Array, jax.Array | None], jax.Array],
  *,
  temperature: float | jax.Array = 1.0,
  chunk_size: int = DEFAULT_FUSED_CHUNK_SIZE,
  compute_entropy: bool = True,
  logp_fill: jax.Array | None = None,
):
  """L = objective(logp, H) with π = softmax(hidden @ unembed / τ), fused into one sweep.

  Args:
    hidden: [B, T, D] final hidden states (after the final norm), any float dtype.
    unembed: [D, V] unembedding matrix.
    tokens: [B, T] integer ids y whose log-prob is wanted (ids outside [0, V) are clipped).
    objective: ``(logp [B, T], entropy [B, T] or None) -> scalar loss``; its gradient must be
      token-local (module docstring). It may close over arrays (advantages, masks, normalisers,
      traced coefficients): they are constants, no gradient flows to them.
    temperature: τ > 0, a constant.
    chunk_size: tokens per tile (C); the largest temporaries are a few [C, V] float32 tiles plus
      the [D, V] float32 gradient of ``unembed``.
    compute_entropy: pass the differentiable full-vocabulary entropy H to ``objective`` (else None).
    logp_fill: [B, T] placeholder log-probs for the tokens not yet swept (e.g. ``old_logp``); only
      the objective's values there matter, never the gradient. Default: zeros.

  Returns:
    ``(loss, logp, entropy)``: the scalar loss, differentiable w.r.t. ``hidden`` and ``unembed``
    (three matmul passes in all), and the per-token logp and H ([B, T] float32, entropy None when
    not computed) as constants (stop_gradient), e.g. for metrics.
  """
  tiles.check_common("hidden", hidden, tokens, temperature, chunk_size)
  tiles.check_unembed(hidden, unembed)
  if logp_fill is not None and jnp.shape(logp_fill) != tokens.shape:
    raise ValueError(f"logp_fill shape {jnp.shape(logp_fill)} must be tokens shape {tokens.shape}")
  lead = tokens.shape
  h, y, n = tiles.token_tiles(hidden, tokens, unembed.shape[-1], chunk_size)
  pad = y.size - n  # zero rows: finite statistics, dropped before the objective
  fill = jnp.zeros((n,), jnp.float32) if logp_fill is None else jnp.ravel(logp_fill)
  fill = jnp.pad(jax.lax.stop_gradient(fill).astype(jnp.float32), (0, pad))

  def flat_objective(logp_flat, ent_flat):
    unpad = lambda a: a[:n].reshape(lead)
    return jnp.asarray(
      objective(unpad(logp_flat), unpad(ent_flat) if compute_entropy else None), jnp.float32
    )

  example = jnp.zeros((y.size,), jnp.float32)
  loss_fn, consts = jax.closure_convert(flat_objective, example, example)
  loss, logp, entropy = _fused(
    loss_fn, compute_entropy, h, unembed, y, tiles.inv_temperature(temperature), fill, consts
  )
  unpad = lambda a: jax.lax.stop_gradient(a).reshape(-1)[:n].reshape(lead)
  return loss, unpad(logp), unpad(entropy) if compute_entropy else None
