"""Self-attention by implementation (``rlvr_jax.model.attention``): every implementation that runs
on this CPU (Pallas kernels in interpret mode) equals the einsum reference in values and
gradients; the decoder on packed rows equals the decoder on each sequence alone; the memory of
a 32k-token update at the Qwen2.5-1.5B shape fits one 141-GB GPU. The blockwise kernel and ring
attention have tests of their own (test_blockwise_attention.py, test_context_parallel.py)."""

import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import model
from rlvr_jax.model import attention as A
from rlvr_jax.model import layers as L

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _inputs(B, S, N, K, H, segment_ids, dtype=jnp.float32, seed=0):
  ks = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(ks[0], (B, S, N, H), dtype)
  k = jax.random.normal(ks[1], (B, S, K, H), dtype)
  v = jax.random.normal(ks[2], (B, S, K, H), dtype)
  seg = jnp.asarray(segment_ids, jnp.int32)
  w = jax.random.normal(ks[3], (B, S, N, H)) * (seg > 0)[:, :, None, None]  # real queries only
  return q, k, v, seg, w


def _value_and_grads(fn, q, k, v, seg, w):
  def loss(q, k, v):
    return jnp.sum(fn(q, k, v, seg).astype(jnp.float32) * w)

  return fn(q, k, v, seg), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)


def _check_against_reference(fn, q, k, v, seg, w, K, tol):
  ref = functools.partial(A._xla, num_kv_heads=K, max_segments=None)
  out, grads = _value_and_grads(fn, q, k, v, seg, w)
  ref_out, ref_grads = _value_and_grads(ref, q, k, v, seg, w)
  real = np.asarray(seg > 0)
  np.testing.assert_allclose(np.asarray(out)[real], np.asarray(ref_out)[real], **tol)
  for g, rg in zip(grads, ref_grads, strict=True):
    assert np.isfinite(np.asarray(g)).all()
    np.testing.assert_allclose(np.asarray(g)[real], np.asarray(rg)[real], **tol)


PACKED_16 = [
  [0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],  # left padding, one sequence
  [1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3, 0, 0, 0],  # three packed sequences, then padding
]


def test_pallas_gpu_kernel_interpreted_equals_reference():
  # Triton's kernel run by the Pallas interpreter; S = 16 is not a multiple of its 128-token
  # blocks' default (the wrapper picks a block that fits), grouped heads N = 4 on K = 2.
  q, k, v, seg, w = _inputs(2, 16, 4, 2, 16, PACKED_16)
  fn = functools.partial(A._pallas_gpu, num_kv_heads=2, max_segments=3, interpret=True)
  _check_against_reference(fn, q, k, v, seg, w, 2, dict(rtol=1e-5, atol=1e-5))


def test_splash_kernel_interpreted_equals_reference():
  # The TPU kernel needs 128-token blocks and lanes: S = 200 is padded to 256 inside.
  seg = np.r_[[0] * 40, [1] * 100, [2] * 50, [0] * 10][None]
  q, k, v, seg, w = _inputs(1, 200, 4, 2, 128, seg)
  fn = functools.partial(A._splash, num_kv_heads=2, max_segments=2, interpret=True)
  _check_against_reference(fn, q, k, v, seg, w, 2, dict(rtol=1e-5, atol=1e-5))


def test_ragged_offsets_golden():
  offsets, lengths = A.ragged_offsets(jnp.asarray(PACKED_16), 4)
  np.testing.assert_array_equal(offsets, [[3, -1, -1, -1, -1], [0, 5, 10, -1, -1]])
  np.testing.assert_array_equal(lengths, [[13, -1, -1, -1], [5, 5, 3, -1]])


def test_auto_implementation_by_platform_and_length():
  short = jnp.zeros((1, 128, 4, 64), jnp.bfloat16)
  long = jax.ShapeDtypeStruct((1, A.BLOCKWISE_MIN_LEN, 4, 64), jnp.float32)
  hopper, ampere = dict(platform="gpu", gpu_capability=(9, 0)), dict(gpu_capability=(8, 0))
  assert A.auto_implementation(short, **hopper) == "cudnn"
  assert A.auto_implementation(short, platform="gpu", **ampere) == "pallas_gpu"
  assert A.auto_implementation(short.astype(jnp.float32), **hopper) == "xla"
  assert A.auto_implementation(jnp.zeros((1, 8, 4, 12), jnp.bfloat16), **hopper) == "xla"
  assert A.auto_implementation(short, platform="tpu") == "splash"
  assert A.auto_implementation(short, platform="cpu") == "xla"
  assert A.auto_implementation(long, platform="cpu") == "blockwise"
  with pytest.raises(ValueError, match="not in"):
    A.self_attention(*_inputs(1, 4, 2, 1, 8, [[1] * 4])[:4], num_kv_heads=1, implementation="x")


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN runs on a GPU only")
@pytest.mark.parametrize("max_segments", [1, 2])
def test_cudnn_equals_reference_on_gpu(max_segments):
  # One segment per row (the unpacked, left-padded update) and packed rows, grouped heads.
  if max_segments == 1:
    seg = np.r_[[0] * 40, [1] * 216][None].repeat(2, 0)
  else:
    seg = np.r_[[0] * 40, [1] * 100, [2] * 100, [0] * 16][None].repeat(2, 0)
  q, k, v, seg, w = _inputs(2, 256, 4, 2, 64, seg, dtype=jnp.bfloat16)
  fn = functools.partial(A._cudnn, num_kv_heads=2, max_segments=max_segments)
  _check_against_reference(fn, q, k, v, seg, w, 2, dict(rtol=2e-2, atol=2e-2))


CFG = model.ModelConfig.tiny(num_layers=2, attention="xla")


def _loss_and_grads(cfg, tokens, positions, segment_ids=None):
  params = model.init_params(CFG, jax.random.key(0))

  def loss(params):
    h, _ = model.forward(params, tokens, positions, config=cfg, segment_ids=segment_ids)
    return jnp.sum(h.astype(jnp.float32) ** 2 * (positions >= 0)[..., None]), h

  (value, hidden), grads = jax.value_and_grad(loss, has_aux=True)(params)
  return value, hidden, grads


@pytest.mark.parametrize("implementation", ["blockwise", "xla"])
def test_decoder_on_packed_rows_equals_each_sequence_alone(implementation):
  # Two sequences (lengths 5 and 7) in one packed row of 14 (2 padding), against the same two
  # sequences left-padded in two rows of 7 with the reference attention.
  rng = np.random.default_rng(0)
  a, b = rng.integers(3, CFG.vocab_size, 5), rng.integers(3, CFG.vocab_size, 7)
  packed_tokens = jnp.asarray(np.r_[a, b, [0, 0]][None], jnp.int32)
  packed_pos = jnp.asarray(np.r_[np.arange(5), np.arange(7), [-1, -1]][None], jnp.int32)
  segment_ids = jnp.asarray(np.r_[[1] * 5, [2] * 7, [0, 0]][None], jnp.int32)
  rows = jnp.asarray(np.stack([np.r_[[0, 0], a], b]), jnp.int32)
  rows_pos = jnp.asarray(np.stack([np.r_[[-1, -1], np.arange(5)], np.arange(7)]), jnp.int32)
  cfg = CFG.replace(attention=implementation)
  v1, h1, g1 = _loss_and_grads(cfg, packed_tokens, packed_pos, segment_ids)
  v0, h0, g0 = _loss_and_grads(CFG, rows, rows_pos)
  np.testing.assert_allclose(h1[0, :5], h0[0, 2:], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(h1[0, 5:12], h0[1], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(v1, v0, rtol=1e-5)
  # Gradients are sums over differently laid out tokens: float32 rounding of elements ~0.1
  # whose sums cancel is ~1e-5 absolute.
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-4), g1, g0)


def test_update_at_32k_tokens_fits_one_gpu():
  # XLA's compiled memory analysis of one update (Qwen2.5-1.5B shape, float32 masters, bfloat16
  # compute, remat, AdamW) on one 32,768-token row with blockwise attention: lowered and
  # compiled only. The reference's float32 scores of ONE layer would be 12 x 32768^2 x 4 bytes
  # = 51.5 GB; docs/benchmarks.md has the table (tools/update_memory.py).
  sys.path.insert(0, os.path.join(ROOT, "tools"))
  try:
    import update_memory
  finally:
    sys.path.pop(0)
  r = update_memory.update_memory("Qwen/Qwen2.5-1.5B", 1, 32768, attention="blockwise")
  scores_one_layer = 12 * 32768**2 * 4
  assert r["temp_bytes"] < scores_one_layer / 2, r
  assert r["peak_bytes"] < 141e9 * 0.5, r


@pytest.mark.parametrize("Sp, Tc", [(32, 64), (48, 256)])
def test_slot_decode_kernel_interpreted_equals_the_einsum(Sp, Tc):
  """Pallas' decode kernel over each part's filled range (left-padded prompts, completions filled
  from column 0, one empty completion), merged by softmax statistics: the two-part einsum's
  values; buffers the kernel cannot split fall back to the einsum."""
  N, K, G, H = 4, 2, 3, 16
  ks = jax.random.split(jax.random.key(0), 5)
  q = jax.random.normal(ks[0], (N, K * G, H))
  kp, vp = (jax.random.normal(k, (N, K, Sp, H)) for k in ks[1:3])
  kc, vc = (jax.random.normal(k, (N, K, Tc, H)) for k in ks[3:5])
  n_p, n_c = np.array([Sp, 5, 17, 1]), np.array([0, Tc, 9, 33])
  mask_p = np.arange(Sp)[None] >= Sp - n_p[:, None]
  mask_c = np.arange(Tc)[None] < n_c[:, None]
  ref = L.prompt_and_slot_attention(q, kp, vp, mask_p, kc, vc, mask_c, num_kv_heads=K)
  got = A.slot_decode_attention(
    q, kp, vp, mask_p, kc, vc, mask_c, num_kv_heads=K, implementation="pallas_gpu",
    interpret=True,
  )  # fmt: skip
  np.testing.assert_allclose(got, ref, atol=2e-6, rtol=2e-6)
  assert A._decode_splits(Sp) and A._decode_splits(Tc) and A._decode_splits(8) is None
  short = A.slot_decode_attention(
    q, kp[:, :, :8], vp[:, :, :8], mask_p[:, :8], kc, vc, mask_c, num_kv_heads=K,
    implementation="pallas_gpu", interpret=True,
  )  # fmt: skip
  np.testing.assert_allclose(
    short, L.prompt_and_slot_attention(q, kp[:, :, :8], vp[:, :, :8], mask_p[:, :8], kc, vc,
                                       mask_c, num_kv_heads=K), atol=1e-6)  # fmt: skip
