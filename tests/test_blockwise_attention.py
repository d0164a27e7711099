"""Tests for model.blockwise_attention: values and gradients against the dense einsum attention.

The reference is ``layers.attention`` on the dense [B, S, S] mask of causal segments. It averages v
uniformly on queries with no allowed key (blockwise gives exactly 0 there), so values are compared
on the other queries only, and gradients of a weighted sum whose weights vanish on them.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.model import layers
from rlvr_jax.model.blockwise_attention import _active_tiles, blockwise_attention


def _segments(kind, b, s, rng):
  """[B, S] int32 segment ids of one layout; 0 is padding."""
  if kind == "full":
    return np.ones((b, s), np.int32)
  if kind == "left_pad":  # row r starts with 2 r padding tokens
    return (np.arange(s)[None, :] >= 2 * np.arange(b)[:, None]).astype(np.int32)
  if kind == "packed":  # several sequences per row, then trailing padding
    seg = np.zeros((b, s), np.int32)
    for row in range(b):
      start, sid = 0, 1
      end = s - rng.integers(0, s // 3)
      while start < end:
        length = int(rng.integers(1, s // 2))
        seg[row, start : min(start + length, end)] = sid
        start, sid = start + length, sid + 1
    return seg
  if kind == "random":  # non-contiguous segments and padding anywhere
    return rng.integers(0, 3, (b, s)).astype(np.int32)
  raise ValueError(kind)


def _mask(seg):
  t = jnp.arange(seg.shape[1])
  same = (seg[:, None, :] == seg[:, :, None]) & (seg[:, None, :] > 0)
  return (t[None, None, :] <= t[None, :, None]) & same


def _inputs(seed, b, s, n, k, h, kind, dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  q, w = rng.normal(size=(2, b, s, n, h))
  kk, v = rng.normal(size=(2, b, s, k, h))
  seg = jnp.asarray(_segments(kind, b, s, rng))
  cast = lambda x: jnp.asarray(x, jnp.float32).astype(dtype)
  return cast(q), cast(kk), cast(v), seg, jnp.asarray(w, jnp.float32)


def _value_and_grads(attn_fn, q, k, v, weights):
  """(out, d sum(weights * out) / d(q, k, v)), jitted."""

  def loss(q, k, v):
    return jnp.sum(weights * attn_fn(q, k, v).astype(jnp.float32))

  def fn(q, k, v):
    return attn_fn(q, k, v), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

  return jax.jit(fn)(q, k, v)


def _both(q, k, v, seg, weights, num_kv_heads, block_q, block_k):
  """Reference and blockwise (out, grads), the weights zeroed on queries with no allowed key."""
  mask = _mask(seg)
  valid = jnp.any(mask, axis=-1)
  weights = weights * valid[:, :, None, None]
  ref_fn = lambda q, k, v: layers.attention(q, k, v, mask, num_kv_heads=num_kv_heads)
  blk_fn = lambda q, k, v: blockwise_attention(
    q, k, v, seg, num_kv_heads=num_kv_heads, block_q=block_q, block_k=block_k
  )
  return _value_and_grads(ref_fn, q, k, v, weights), _value_and_grads(blk_fn, q, k, v, weights)


CASES = [  # (B, S, N, K, H, block_q, block_k, segment layout)
  (2, 16, 2, 2, 8, 4, 4, "full"),  # MHA, 4 x 4 tiles
  (3, 13, 4, 2, 8, 4, 8, "left_pad"),  # GQA, S not a multiple of either block, bq < bk
  (3, 16, 4, 1, 8, 8, 4, "packed"),  # MQA, bq > bk
  (3, 19, 4, 2, 16, 5, 3, "packed"),  # odd blocks, S a multiple of neither
  (1, 24, 4, 2, 8, 4, 4, "packed"),  # one row: tiles between different sequences are skipped
  (4, 12, 4, 2, 8, 3, 4, "random"),  # non-contiguous segments, padding anywhere
  (2, 11, 4, 2, 8, 512, 512, "left_pad"),  # blocks clipped to S: one tile
]


@pytest.mark.parametrize("b, s, n, k, h, block_q, block_k, kind", CASES)
def test_float32_equals_reference(b, s, n, k, h, block_q, block_k, kind):
  q, kk, v, seg, weights = _inputs(0, b, s, n, k, h, kind)
  (ref_out, ref_grads), (out, grads) = _both(q, kk, v, seg, weights, k, block_q, block_k)
  valid = np.asarray(jnp.any(_mask(seg), axis=-1))
  # Bound: 1e-5 absolute + relative (outputs are O(1), gradients O(1)-O(10)); seen: < 1e-6.
  np.testing.assert_allclose(out[valid], ref_out[valid], rtol=1e-5, atol=1e-5)
  assert np.all(np.asarray(out)[~valid] == 0.0)
  for g, ref_g in zip(grads, ref_grads, strict=True):
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g, ref_g, rtol=1e-5, atol=1e-5)


def test_bfloat16_within_bound_of_float32_reference():
  b, s, n, k, h = 3, 24, 4, 2, 16
  q, kk, v, seg, weights = _inputs(1, b, s, n, k, h, "packed", dtype=jnp.bfloat16)
  up = lambda x: x.astype(jnp.float32)  # the reference sees the same bfloat16-rounded inputs
  (ref_out, ref_grads), _ = _both(up(q), up(kk), up(v), seg, weights, k, 8, 8)
  _, (out, grads) = _both(q, kk, v, seg, weights, k, 8, 8)
  assert out.dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in grads)
  valid = np.asarray(jnp.any(_mask(seg), axis=-1))
  # Bound: max |error| <= 2% of max |reference| (bfloat16 keeps 8 significant bits, 2^-9 = 0.2%
  # relative rounding, applied to P, dS, the outputs and gradients; seen: about 0.5%).
  pairs = [(np.asarray(up(out))[valid], np.asarray(ref_out)[valid])]
  pairs += [(np.asarray(up(g)), np.asarray(r)) for g, r in zip(grads, ref_grads, strict=True)]
  for got, want in pairs:
    assert np.all(np.isfinite(got))
    err, scale = np.max(np.abs(got - want)), np.max(np.abs(want))
    assert err <= 0.02 * scale, (err, scale)


def test_fully_masked_queries_output_zero_and_get_zero_gradient():
  b, s, n, k, h = 3, 10, 4, 2, 8
  q, kk, v, _, weights = _inputs(2, b, s, n, k, h, "full")
  seg = jnp.asarray([[0] * 10, [0, 0, 0, 1, 1, 1, 1, 2, 2, 0], [0] * 9 + [3]], jnp.int32)
  valid = np.asarray(jnp.any(_mask(seg), axis=-1))
  attn = lambda q, k, v: blockwise_attention(q, k, v, seg, num_kv_heads=k.shape[2], block_q=4)
  out, grads = _value_and_grads(attn, q, kk, v, weights)  # weights on every query
  _, grads_valid = _value_and_grads(attn, q, kk, v, weights * valid[:, :, None, None])
  assert np.all(np.asarray(out)[~valid] == 0.0) and np.all(np.isfinite(out))
  assert np.all(np.asarray(grads[0])[~valid] == 0.0)
  for g, g_valid in zip(grads, grads_valid, strict=True):
    assert np.all(np.isfinite(g))
    np.testing.assert_array_equal(g, g_valid)  # masked queries contribute nothing to dk, dv


def test_tiles_without_a_common_segment_are_skipped():
  seg = jnp.asarray([[1, 1, 1, 1, 2, 2, 2, 3, 0, 0, 0, 0], [1] * 12], jnp.int32)
  # Row 0 alone: blocks of 4 hold segments {1}, {2, 3}, {0}; tile (1, 0) shares none.
  expected = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 0]], bool)
  np.testing.assert_array_equal(_active_tiles(seg[:1], seg[:1], 4, 4), expected)
  # A tile is skipped only when no row needs it.
  np.testing.assert_array_equal(_active_tiles(seg, seg, 4, 4), np.ones((3, 3), bool))
  # Unequal blocks: query blocks of 6 hold {1, 2}, {2, 3}; key blocks of 4 as above.
  np.testing.assert_array_equal(_active_tiles(seg[:1], seg[:1], 6, 4), [[1, 1, 0], [0, 1, 0]])


def test_shape_errors_name_the_shapes():
  q, k = jnp.zeros((2, 8, 4, 16)), jnp.zeros((2, 8, 2, 16))
  seg = jnp.ones((2, 8), jnp.int32)
  with pytest.raises(ValueError, match=r"\(2, 8, 3, 16\)"):
    blockwise_attention(q, jnp.zeros((2, 8, 3, 16)), k, seg, num_kv_heads=2)
  with pytest.raises(ValueError, match="multiple of K=3"):
    blockwise_attention(q, k, k, seg, num_kv_heads=3)
  with pytest.raises(ValueError, match=r"segment_ids \(2, 7\)"):
    blockwise_attention(q, k, k, seg[:, :7], num_kv_heads=2)


def test_memory_linear_in_sequence_length():
  """Compiled temp memory of value and gradient at S = 8192 (compiled, never run)."""
  b, s, n, k, h = 1, 8192, 4, 2, 64
  spec = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
  args = (
    spec(b, s, n, h),
    spec(b, s, k, h),
    spec(b, s, k, h),
    jax.ShapeDtypeStruct((b, s), jnp.int32),
  )

  def ref(q, k, v, seg):
    return jnp.sum(layers.attention(q, k, v, _mask(seg), num_kv_heads=k.shape[2]) ** 2)

  def blk(q, k, v, seg):
    return jnp.sum(blockwise_attention(q, k, v, seg, num_kv_heads=k.shape[2]) ** 2)

  def temp_bytes(fn):
    compiled = jax.jit(jax.value_and_grad(fn, argnums=(0, 1, 2))).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  ref_bytes, blk_bytes = temp_bytes(ref), temp_bytes(blk)
  q_bytes = b * s * n * h * 4  # 8 MiB; the reference's [B, N, S, S] float32 scores alone: 1 GiB
  msg = f"temp bytes: blockwise {blk_bytes / 2**20:.1f} MiB, reference {ref_bytes / 2**20:.1f} MiB"
  # Seen on CPU: blockwise about 51 MiB (about 4 q-sizes growing with S plus ~18 MiB of tiles),
  # reference about 4100 MiB.
  assert blk_bytes < 8 * q_bytes, msg
  assert blk_bytes * 40 < ref_bytes, msg
