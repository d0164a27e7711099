"""Decoder building blocks as pure functions: RMSNorm, RoPE, grouped-query attention, SwiGLU.

Norms and softmax are computed in float32 whatever the compute dtype; matmuls run in the compute
dtype of their inputs (the weight matmuls through ``linear``: float32 accumulation in bfloat16).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.model.config import ModelConfig


def linear(spec: str, x: jax.Array, w: jax.Array) -> jax.Array:
  """``einsum(spec, x, w)`` for a weight matmul, in the dtype of ``x``.

  float32 operands: the plain einsum. Otherwise (bfloat16 compute) ``lowp_einsum``: ``w`` is cast
  to the dtype of ``x`` inside, and its gradient comes back in the dtype ``w`` came in (unrounded
  for float32 master weights).
  """
  return lowp_einsum(spec, x, w, x.dtype)


def lowp_einsum(spec: str, a: jax.Array, b: jax.Array, out_dtype) -> jax.Array:
  """``einsum(spec, a, b)`` in ``out_dtype``, with float32 accumulation for low-precision operands.

  Two float32 operands: the plain einsum (cast to ``out_dtype``). Otherwise ``b`` is cast to the
  dtype of ``a``, the contraction accumulates in float32 and is rounded once to ``out_dtype``, and
  the two products of its backward pass (``da = g b^T``, ``db = a^T g``) take the cotangent
  rounded to the dtype of ``a`` and accumulate in float32 too, through a custom VJP; ``db`` is
  returned in the dtype ``b`` came in. Besides the accuracy, it is the fast path: XLA:CPU runs a
  bfloat16 dot with a float32 result on the CPU's bfloat16 units (AMX / AVX512-BF16; 3-5x float32
  at this model's shapes, measured in docs/benchmarks.md) but a dot with a bfloat16 result at about
  the float32 speed, and plain autodiff of a float32-result dot (attention scores, logits) would
  put float32 cotangents, hence float32 x float32 dots, into the backward pass. Every index of
  each operand must appear in the other operand or the output (true of the projections
  "bsd,dnh->bsnh", "bsf,fd->bsd" and of attention's "bskgh,btkh->bkgst", "bkgst,btkh->bskgh").
  """
  if a.dtype == jnp.float32 and b.dtype == jnp.float32:
    return jnp.einsum(spec, a, b).astype(out_dtype)
  return _lowp_einsum(spec, jnp.dtype(out_dtype).name, jnp.dtype(b.dtype).name, a, b)


def _einsum_round(spec, a, b, dtype):
  return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32).astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _lowp_einsum(spec, out_dtype, b_dtype, a, b):
  return _einsum_round(spec, a, b.astype(a.dtype), out_dtype)


def _lowp_einsum_fwd(spec, out_dtype, b_dtype, a, b):
  b = b.astype(a.dtype)
  return _einsum_round(spec, a, b, out_dtype), (a, b)


def _lowp_einsum_bwd(spec, out_dtype, b_dtype, res, g):
  a, b = res
  ins, out = spec.split("->")
  a_idx, b_idx = ins.split(",")
  g = g.astype(a.dtype)
  return (
    _einsum_round(f"{out},{b_idx}->{a_idx}", g, b, a.dtype),
    _einsum_round(f"{a_idx},{out}->{b_idx}", a, g, b_dtype),
  )


_lowp_einsum.defvjp(_lowp_einsum_fwd, _lowp_einsum_bwd)


def rms_norm(x: jax.Array, weight: jax.Array, *, eps: float) -> jax.Array:
  """RMSNorm (arXiv 1910.07467): y = x / sqrt(mean(x^2) + eps) * weight, in float32.

  Args:
    x: [..., D] activations.
    weight: [D] gain.
  Returns:
    [..., D] in the dtype of ``x``.
  """
  if x.shape[-1] != weight.shape[-1]:
    raise ValueError(f"rms_norm: x {x.shape} and weight {weight.shape} differ in the last dim")
  xf = x.astype(jnp.float32)
  inv = jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
  return (xf * inv * weight.astype(jnp.float32)).astype(x.dtype)


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
  """RoPE inverse frequencies [H/2] (arXiv 2104.09864), with Llama-3 scaling if configured.

  theta_i = base^(-2i/H). Llama-3 scaling (arXiv 2407.21783, sec. 3.3 / the released code) divides
  low frequencies (wavelength > L_orig / low_freq_factor) by ``factor``, keeps high frequencies
  (wavelength < L_orig / high_freq_factor), and interpolates smoothly in between.
  """
  H = config.head_dim
  inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, H, 2, dtype=np.float32) / np.float32(H)))
  inv_freq = inv_freq.astype(np.float32)
  scaling = config.rope_scaling_dict
  if scaling is None:
    return inv_freq
  factor = scaling["factor"]
  low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
  orig = scaling["original_max_position_embeddings"]
  wavelen = 2 * math.pi / inv_freq
  scaled = np.where(wavelen > orig / low, inv_freq / factor, inv_freq)
  smooth = (orig / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = (wavelen >= orig / high) & (wavelen <= orig / low)
  return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_cos_sin(positions: jax.Array, inv_freq: np.ndarray) -> tuple[jax.Array, jax.Array]:
  """cos and sin tables [B, S, H] (float32) for integer positions [B, S] (negatives clamp to 0)."""
  pos = jnp.maximum(positions, 0).astype(jnp.float32)
  angles = pos[..., None] * jnp.asarray(inv_freq)[None, None, :]  # [B, S, H/2]
  angles = jnp.concatenate([angles, angles], axis=-1)
  return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotates the two halves of the head dim (Hugging Face "rotate_half" layout).

  Args:
    x: [B, S, heads, H].
    cos, sin: [B, S, H] float32.
  Returns:
    [B, S, heads, H] in the dtype of ``x``.
  """
  xf = x.astype(jnp.float32)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
  out = xf * cos[:, :, None, :] + rotated * sin[:, :, None, :]
  return out.astype(x.dtype)


def _masked_softmax(scores: jax.Array, mask: jax.Array) -> jax.Array:
  # where, not add: adding finfo.min to a large negative score would overflow to -inf.
  return jax.nn.softmax(jnp.where(mask, scores, jnp.finfo(jnp.float32).min), axis=-1)


def _check_attention(q, mask, T):
  B, S = q.shape[:2]
  if mask.shape != (B, S, T):
    raise ValueError(f"attention: mask {mask.shape}, expected {(B, S, T)}")


def attention(
  q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *, num_kv_heads: int
) -> jax.Array:
  """Grouped-query softmax attention (arXiv 2305.13245), softmax in float32.

  o = softmax(q k^T / sqrt(H) masked) v, query head n uses key/value head n // (N / K).

  Args:
    q: [B, S, N, H] queries.
    k, v: [B, T, K, H] keys / values.
    mask: [B, S, T] bool, True where query s may attend to key t. Fully masked rows give a
      uniform average of v (finite garbage): they only occur for padding queries.
  Returns:
    [B, S, N, H] in the dtype of ``q``.
  """
  B, S, N, H = q.shape
  K = num_kv_heads
  if k.shape[0] != B or k.shape[2:] != (K, H) or v.shape != k.shape:
    raise ValueError(f"attention: q {q.shape}, k {k.shape}, v {v.shape} with K={K} do not match")
  _check_attention(q, mask, k.shape[1])
  G = N // K
  qg = q.reshape(B, S, K, G, H)
  scores = lowp_einsum("bskgh,btkh->bkgst", qg, k, jnp.float32)
  probs = _masked_softmax(scores * (1.0 / math.sqrt(H)), mask[:, None, None, :, :]).astype(v.dtype)
  out = lowp_einsum("bkgst,btkh->bskgh", probs, v, q.dtype)
  return out.reshape(B, S, N, H)


def cached_attention(
  q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *, num_kv_heads: int
) -> jax.Array:
  """``attention`` over a layer's KV-cache buffers (layouts of ``rlvr_jax.model.cache.KVCache``).

  The G * S queries of each kv head form one [G * S, H] matrix, so both products are batched
  matmuls over (b, k), [G S, H] x [T, H]^T and [G S, T] x [T, H], that read the cache in place.

  Args:
    q: [B, S, N, H] queries.
    k, v: [B, K, T, H] keys and values.
    mask: [B, S, T] bool, as in ``attention``.
  Returns:
    [B, S, N, H] in the dtype of ``q``.
  """
  B, S, N, H = q.shape
  K = num_kv_heads
  if k.shape[:2] != (B, K) or k.shape[3] != H or v.shape != k.shape:
    raise ValueError(
      f"cached_attention: q {q.shape}, k {k.shape}, v {v.shape} (both expected [B, K, T, H]) "
      f"with K={K} do not match"
    )
  T = k.shape[2]
  _check_attention(q, mask, T)
  G = N // K
  qg = q.reshape(B, S, K, G, H).transpose(0, 2, 3, 1, 4).reshape(B, K, G * S, H)
  scores = jnp.einsum("bkqh,bkth->bkqt", qg, k, preferred_element_type=jnp.float32)
  mask = jnp.broadcast_to(mask[:, None, None], (B, 1, G, S, T)).reshape(B, 1, G * S, T)
  probs = _masked_softmax(scores * (1.0 / math.sqrt(H)), mask).astype(v.dtype)
  out = jnp.einsum("bkqt,bkth->bkqh", probs, v, preferred_element_type=jnp.float32)
  out = out.reshape(B, K, G, S, H).transpose(0, 3, 1, 2, 4)
  return out.reshape(B, S, N, H).astype(q.dtype)


def prompt_and_slot_attention(
  q: jax.Array,
  kp: jax.Array,
  vp: jax.Array,
  mask_p: jax.Array,
  kc: jax.Array,
  vc: jax.Array,
  mask_c: jax.Array,
  *,
  num_kv_heads: int,
) -> jax.Array:
  """One decode query per row over two key sets: its prompt's and its own completion's.

  o = softmax([q Kp^T, q Kc^T] / sqrt(H) masked) [Vp; Vc]: the softmax runs over the
  concatenated scores (one normaliser, as if the two sets were one buffer), and the product with
  the values is the sum of the two parts' products.

  Args:
    q: [N, N_h, H] one query per row; kp, vp: [N, K, S_p, H] the row's prompt keys / values;
      kc, vc: [N, K, T_c, H] its completion keys / values (``KVCache`` layout).
    mask_p: [N, S_p], mask_c: [N, T_c] bool, True where the row may attend.
  Returns:
    [N, N_h, H] in the dtype of ``q``.
  """
  N, Nh, H = q.shape
  K = num_kv_heads
  if kp.shape[:2] != (N, K) or kc.shape[:2] != (N, K) or kp.shape[3] != H or kc.shape[3] != H:
    raise ValueError(
      f"prompt_and_slot_attention: q {q.shape}, prompt k {kp.shape}, completion k {kc.shape} "
      f"(both expected [N, K={K}, *, H])"
    )
  Sp = kp.shape[2]
  qg = q.reshape(N, K, Nh // K, H)
  sp = jnp.einsum("nkgh,nksh->nkgs", qg, kp, preferred_element_type=jnp.float32)
  sc = jnp.einsum("nkgh,nkth->nkgt", qg, kc, preferred_element_type=jnp.float32)
  mask = jnp.concatenate([mask_p, mask_c], axis=1)[:, None, None, :]
  scores = jnp.concatenate([sp, sc], axis=-1) * (1.0 / math.sqrt(H))
  probs = _masked_softmax(scores, mask).astype(vp.dtype)
  out = jnp.einsum("nkgs,nksh->nkgh", probs[..., :Sp], vp, preferred_element_type=jnp.float32)
  out = out + jnp.einsum("nkgt,nkth->nkgh", probs[..., Sp:], vc, preferred_element_type=jnp.float32)
  return out.reshape(N, Nh, H).astype(q.dtype)


def swiglu_mlp(x: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array) -> jax.Array:
  """SwiGLU MLP (arXiv 2002.05202): (silu(x W_gate) * x W_up) W_down.

  Args:
    x: [B, S, D]; w_gate, w_up: [D, F]; w_down: [F, D].
  Returns:
    [B, S, D].
  """
  gate = linear("bsd,df->bsf", x, w_gate)
  up = linear("bsd,df->bsf", x, w_up)
  return linear("bsf,fd->bsd", jax.nn.silu(gate) * up, w_down)
