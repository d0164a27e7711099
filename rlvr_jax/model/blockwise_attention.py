"""Blockwise (flash-style) causal self-attention with segments, in plain JAX/XLA, O(S) memory.

The algorithm of FlashAttention (Dao et al., arXiv 2205.14135) with the loop order and backward of
FlashAttention-2 (Dao, arXiv 2307.08691), written with ``lax.fori_loop`` over tiles instead of a
fused kernel, so it runs on every backend.

Function (the same as ``layers.attention`` on the dense mask, except on queries with no key):

  o[b, s, n] = sum_t P[b, n, s, t] v[b, t, n // G],   G = N / K (grouped-query heads)
  P[b, n, s, t] = softmax_t(q[b, s, n] . k[b, t, n // G] / sqrt(H)  over allowed(b, s, t))
  allowed(b, s, t) = t <= s  and  seg[b, t] == seg[b, s]  and  seg[b, t] > 0

A query with no allowed key (every padding query) outputs exactly 0 and passes no gradient.

Forward, per query block i (rows r) over key blocks j = 0 .. last block touching the diagonal,
with the online softmax recurrence (running max m, running sum l, unnormalised output acc), all
float32, starting from m = finfo.min, l = 0, acc = 0:

  S_ij = Q_i K_j^T / sqrt(H)                           (masked entries: -inf)
  m'   = max(m, rowmax S_ij)
  l'   = exp(m - m') l + rowsum exp(S_ij - m')
  acc' = exp(m - m') acc + exp(S_ij - m') V_j
  O_i  = acc / l,   lse_i = m + log l                  (O_i = 0, lse_i = 0 where l = 0)

Backward, per key block j (columns c) over query blocks i = first block touching the diagonal ..
last, recomputing the tile's probabilities from the saved log-sum-exp:

  D_i   = rowsum(dO_i * O_i)
  P_ij  = exp(S_ij - lse_i)                            (0 on masked entries)
  dV_j += P_ij^T dO_i
  dP_ij = dO_i V_j^T
  dS_ij = P_ij * (dP_ij - D_i) / sqrt(H)
  dQ_i += dS_ij K_j,   dK_j += dS_ij^T Q_i

dK_j and dV_j sum over the G query heads of their key/value head (the grouped axis ``g`` is
contracted in the einsums). Both matmuls of a tile run in the input dtype with float32
accumulation (bfloat16 inputs work); the softmax statistics are float32.

Memory: no [B, N, S, S] array exists. A step holds one [B, K, G, block_q, block_k] float32 tile
(plus its bool mask); the forward saves q, k, v, o and the float32 [B, K, S, G] log-sum-exp for the
backward, which carries a float32 dq [B, S, N, H] and one block of dk, dv: O(S) in all.

Work skipped: key blocks entirely after a query block (above the causal diagonal) are never
visited (the inner loop's trip count depends on the block index), and a tile whose query and key
blocks share no positive segment id range in any row (e.g. a block of padding, or two different
sequences of packed rows) is skipped with ``lax.cond``; such a tile is fully masked, so skipping
it changes nothing.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

_F32 = jnp.float32
# Initial running max: finite, so m - m' and S - m' are never inf - inf (no NaN on empty rows).
_M_INIT = float(jnp.finfo(jnp.float32).min)


def blockwise_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  segment_ids: jax.Array,
  *,
  num_kv_heads: int,
  block_q: int = 512,
  block_k: int = 512,
) -> jax.Array:
  """Causal grouped-query self-attention with segments, blockwise with a custom VJP.

  Args:
    q: [B, S, N, H] queries.
    k, v: [B, S, K, H] keys and values (K = ``num_kv_heads``; query head n uses kv head
      n // (N / K)). Same dtype as ``q``.
    segment_ids: [B, S] integer; query s attends key t <= s of the same segment; 0 is padding.
    num_kv_heads: K.
    block_q, block_k: tile sizes along the query / key sequence (clipped to S; S is padded
      internally to a multiple of each, the padding being segment 0).
  Returns:
    [B, S, N, H] in the dtype of ``q``; exactly 0 on queries with no allowed key.
  """
  _check_shapes(q, k, v, segment_ids, num_kv_heads, block_q, block_k)
  B, S, N, H = q.shape
  K = num_kv_heads
  G = N // K
  if S == 0:
    return jnp.zeros_like(q)
  bq, bk = min(block_q, S), min(block_k, S)
  pad_q, pad_k = -S % bq, -S % bk
  seg = segment_ids.astype(jnp.int32)
  seg_q = jnp.pad(seg, ((0, 0), (0, pad_q)))
  seg_k = jnp.pad(seg, ((0, 0), (0, pad_k)))
  # Internal layout: heads before the sequence, so a tile is a batched matmul over (b, k).
  qt = jnp.pad(q, ((0, 0), (0, pad_q), (0, 0), (0, 0))).reshape(B, S + pad_q, K, G, H)
  qt = qt.transpose(0, 2, 1, 3, 4)  # [B, K, Sq, G, H]
  kt = jnp.pad(k, ((0, 0), (0, pad_k), (0, 0), (0, 0))).transpose(0, 2, 1, 3)  # [B, K, Sk, H]
  vt = jnp.pad(v, ((0, 0), (0, pad_k), (0, 0), (0, 0))).transpose(0, 2, 1, 3)
  ot = _flash(qt, kt, vt, seg_q, seg_k, bq, bk)
  return ot.transpose(0, 2, 1, 3, 4).reshape(B, S + pad_q, N, H)[:, :S]


def _check_shapes(q, k, v, segment_ids, num_kv_heads, block_q, block_k):
  if q.ndim != 4:
    raise ValueError(f"blockwise_attention: q {q.shape}, expected [B, S, N, H]")
  B, S, N, H = q.shape
  K = num_kv_heads
  if K <= 0 or N % K:
    raise ValueError(f"blockwise_attention: {N} query heads (q {q.shape}) not a multiple of K={K}")
  if k.shape != (B, S, K, H) or v.shape != k.shape:
    raise ValueError(
      f"blockwise_attention: q {q.shape}, k {k.shape}, v {v.shape}: expected k and v "
      f"{(B, S, K, H)} with K={K}"
    )
  if segment_ids.shape != (B, S) or not jnp.issubdtype(segment_ids.dtype, jnp.integer):
    raise ValueError(
      f"blockwise_attention: segment_ids {segment_ids.shape} {segment_ids.dtype}, expected "
      f"integer {(B, S)} for q {q.shape}"
    )
  if not (q.dtype == k.dtype == v.dtype):
    raise ValueError(f"blockwise_attention: dtypes q {q.dtype}, k {k.dtype}, v {v.dtype} differ")
  if block_q <= 0 or block_k <= 0:
    raise ValueError(f"blockwise_attention: block sizes ({block_q}, {block_k}) must be positive")


def _active_tiles(seg_q, seg_k, bq, bk):
  """[nq, nk] bool: False where no row has a positive segment id in both blocks' ranges."""

  def ranges(seg, block):
    blocks = seg.reshape(seg.shape[0], -1, block)
    real = blocks > 0
    lo = jnp.min(jnp.where(real, blocks, jnp.iinfo(jnp.int32).max), axis=-1)
    hi = jnp.max(jnp.where(real, blocks, 0), axis=-1)
    return lo, hi  # [B, n]; a block of padding has lo > hi

  q_lo, q_hi = ranges(seg_q, bq)
  k_lo, k_hi = ranges(seg_k, bk)
  overlap = (q_lo[:, :, None] <= k_hi[:, None, :]) & (k_lo[:, None, :] <= q_hi[:, :, None])
  return jnp.any(overlap, axis=0)


def _tile_mask(seg_q_i, seg_k_j, q_start, k_start):
  """allowed(b, s, t) on one tile, [B, 1, bq, 1, bk] to broadcast against [B, K, bq, G, bk]."""
  causal = (k_start + jnp.arange(seg_k_j.shape[1]))[None, :] <= (
    q_start + jnp.arange(seg_q_i.shape[1])
  )[:, None]
  same = (seg_k_j[:, None, :] == seg_q_i[:, :, None]) & (seg_k_j[:, None, :] > 0)
  return (causal[None] & same)[:, None, :, None, :]


def _scores(q_i, k_j):
  """[B, K, bq, G, H] x [B, K, bk, H] -> float32 [B, K, bq, G, bk], scaled by 1 / sqrt(H)."""
  s = jnp.einsum("bkqgh,bkth->bkqgt", q_i, k_j, preferred_element_type=_F32)
  return s * (1.0 / math.sqrt(q_i.shape[-1]))


def _forward(qt, kt, vt, seg_q, seg_k, bq, bk):
  """(o [B, K, Sq, G, H] in q's dtype, lse [B, K, Sq, G] float32)."""
  B, K, Sq, G, H = qt.shape
  nq, nk = Sq // bq, kt.shape[2] // bk
  active = _active_tiles(seg_q, seg_k, bq, bk)

  def q_block(i, carry):
    o_all, lse_all = carry
    q_i = lax.dynamic_slice_in_dim(qt, i * bq, bq, axis=2)
    seg_q_i = lax.dynamic_slice_in_dim(seg_q, i * bq, bq, axis=1)

    def tile(j, state):
      row_max, row_sum, acc = state
      k_j = lax.dynamic_slice_in_dim(kt, j * bk, bk, axis=2)
      v_j = lax.dynamic_slice_in_dim(vt, j * bk, bk, axis=2)
      seg_k_j = lax.dynamic_slice_in_dim(seg_k, j * bk, bk, axis=1)
      mask = _tile_mask(seg_q_i, seg_k_j, i * bq, j * bk)
      # -inf only enters exp(): the running max stays >= _M_INIT (finite), so exp(-inf - m') = 0.
      s = jnp.where(mask, _scores(q_i, k_j), -jnp.inf)
      new_max = jnp.maximum(row_max, jnp.max(s, axis=-1))
      p = jnp.exp(s - new_max[..., None])
      alpha = jnp.exp(row_max - new_max)
      row_sum = alpha * row_sum + jnp.sum(p, axis=-1)
      pv = jnp.einsum("bkqgt,bkth->bkqgh", p.astype(vt.dtype), v_j, preferred_element_type=_F32)
      return new_max, row_sum, alpha[..., None] * acc + pv

    def k_block(j, state):
      return lax.cond(active[i, j], functools.partial(tile, j), lambda st: st, state)

    init = (
      jnp.full((B, K, bq, G), _M_INIT, _F32),
      jnp.zeros((B, K, bq, G), _F32),
      jnp.zeros((B, K, bq, G, H), _F32),
    )
    # Key blocks 0 .. the one holding key (i + 1) bq - 1: later ones are above the diagonal.
    num_k_blocks = jnp.minimum(nk, ((i + 1) * bq - 1) // bk + 1)
    row_max, row_sum, acc = lax.fori_loop(0, num_k_blocks, k_block, init)
    has_keys = row_sum > 0
    # acc = 0 where row_sum = 0 (no allowed key): those rows output exactly 0.
    sum_safe = jnp.where(has_keys, row_sum, 1.0)
    o_i = (acc / sum_safe[..., None]).astype(qt.dtype)
    lse_i = jnp.where(has_keys, row_max + jnp.log(sum_safe), 0.0)  # any finite value: P_ij = 0
    o_all = lax.dynamic_update_slice_in_dim(o_all, o_i, i * bq, axis=2)
    lse_all = lax.dynamic_update_slice_in_dim(lse_all, lse_i, i * bq, axis=2)
    return o_all, lse_all

  init = (jnp.zeros_like(qt), jnp.zeros((B, K, Sq, G), _F32))
  return lax.fori_loop(0, nq, q_block, init)


def _backward(bq, bk, residuals, do):
  """(dq, dk, dv) in the layouts and dtypes of qt, kt, vt."""
  qt, kt, vt, seg_q, seg_k, o, lse = residuals
  B, K, Sq, G, H = qt.shape
  Sk = kt.shape[2]
  nq, nk = Sq // bq, Sk // bk
  active = _active_tiles(seg_q, seg_k, bq, bk)
  delta = jnp.sum(do.astype(_F32) * o.astype(_F32), axis=-1)  # D = rowsum(dO * O), [B, K, Sq, G]
  scale = 1.0 / math.sqrt(H)

  def k_block(j, carry):
    dq_all, dk_all, dv_all = carry
    k_j = lax.dynamic_slice_in_dim(kt, j * bk, bk, axis=2)
    v_j = lax.dynamic_slice_in_dim(vt, j * bk, bk, axis=2)
    seg_k_j = lax.dynamic_slice_in_dim(seg_k, j * bk, bk, axis=1)

    def tile(i, grads):
      dq_i, dk_j, dv_j = grads
      sl = lambda x: lax.dynamic_slice_in_dim(x, i * bq, bq, axis=2)
      q_i, do_i, lse_i, delta_i = sl(qt), sl(do), sl(lse), sl(delta)
      seg_q_i = lax.dynamic_slice_in_dim(seg_q, i * bq, bq, axis=1)
      mask = _tile_mask(seg_q_i, seg_k_j, i * bq, j * bk)
      p = jnp.exp(jnp.where(mask, _scores(q_i, k_j) - lse_i[..., None], -jnp.inf))
      dv_j += jnp.einsum("bkqgt,bkqgh->bkth", p.astype(do.dtype), do_i, preferred_element_type=_F32)
      dp = jnp.einsum("bkqgh,bkth->bkqgt", do_i, v_j, preferred_element_type=_F32)
      ds = (p * (dp - delta_i[..., None]) * scale).astype(qt.dtype)
      dq_i += jnp.einsum("bkqgt,bkth->bkqgh", ds, k_j, preferred_element_type=_F32)
      dk_j += jnp.einsum("bkqgt,bkqgh->bkth", ds, q_i, preferred_element_type=_F32)
      return dq_i, dk_j, dv_j

    def q_block(i, state):
      dq_all, dk_j, dv_j = state
      # Slice dq out of the carry around the cond, so the skip branch never touches the buffer.
      dq_i = lax.dynamic_slice_in_dim(dq_all, i * bq, bq, axis=2)
      dq_i, dk_j, dv_j = lax.cond(
        active[i, j], functools.partial(tile, i), lambda g: g, (dq_i, dk_j, dv_j)
      )
      return lax.dynamic_update_slice_in_dim(dq_all, dq_i, i * bq, axis=2), dk_j, dv_j

    zeros = jnp.zeros((B, K, bk, H), _F32)
    # Query blocks from the one holding query j bk: earlier ones lie entirely before key block j.
    dq_all, dk_j, dv_j = lax.fori_loop((j * bk) // bq, nq, q_block, (dq_all, zeros, zeros))
    dk_all = lax.dynamic_update_slice_in_dim(dk_all, dk_j.astype(kt.dtype), j * bk, axis=2)
    dv_all = lax.dynamic_update_slice_in_dim(dv_all, dv_j.astype(vt.dtype), j * bk, axis=2)
    return dq_all, dk_all, dv_all

  init = (jnp.zeros(qt.shape, _F32), jnp.zeros_like(kt), jnp.zeros_like(vt))
  dq, dk, dv = lax.fori_loop(0, nk, k_block, init)
  return dq.astype(qt.dtype), dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _flash(qt, kt, vt, seg_q, seg_k, bq, bk):
  return _forward(qt, kt, vt, seg_q, seg_k, bq, bk)[0]


def _flash_fwd(qt, kt, vt, seg_q, seg_k, bq, bk):
  o, lse = _forward(qt, kt, vt, seg_q, seg_k, bq, bk)
  return o, (qt, kt, vt, seg_q, seg_k, o, lse)


def _flash_bwd(bq, bk, residuals, do):
  dq, dk, dv = _backward(bq, bk, residuals, do)
  return dq, dk, dv, None, None  # integer segment ids: no cotangent


_flash.defvjp(_flash_fwd, _flash_bwd)
