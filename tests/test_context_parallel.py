"""Ring attention (rlvr_jax.model.context_parallel) on 8 simulated CPU devices against the dense
single-device reference ``layers.attention`` with the same causal + segment mask."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from rlvr_jax import model
from rlvr_jax.model import layers
from rlvr_jax.model.context_parallel import CONTEXT_AXIS, ring_self_attention

B, S, N, K, H = 2, 32, 4, 2, 8


def _packed_segments() -> np.ndarray:
  """Row 0: 5 left-padding tokens then one sequence. Row 1: three packed sequences (the second
  and third cross chunk boundaries for chunks of 4 and 8) then right padding."""
  seg = np.zeros((B, S), np.int32)
  seg[0, 5:] = 1
  seg[1, :3], seg[1, 3:13], seg[1, 13:27] = 1, 2, 3
  return seg


def _dense_mask(seg):
  t = jnp.arange(seg.shape[1])
  causal = t[None, :] <= t[:, None]
  return causal[None] & (seg[:, None, :] == seg[:, :, None]) & (seg[:, None, :] > 0)


def _inputs(seed, seg, dtype=jnp.float32):
  kq, kk, kv, kw = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(kq, (B, S, N, H)).astype(dtype)
  k = jax.random.normal(kk, (B, S, K, H)).astype(dtype)
  v = jax.random.normal(kv, (B, S, K, H)).astype(dtype)
  weights = jax.random.normal(kw, (B, S, N, H))  # of the weighted-sum loss
  return q, k, v, jnp.asarray(seg), weights


def _ring(q, k, v, seg):
  return ring_self_attention(q, k, v, seg, num_kv_heads=K)


def _reference(q, k, v, seg):
  return layers.attention(q, k, v, _dense_mask(seg), num_kv_heads=K)


def _values_and_grads(fn, q, k, v, seg, weights):
  """fn's output and the gradient of sum(weights * output) w.r.t. (q, k, v), under jit."""

  def loss(q, k, v):
    return jnp.sum(weights * fn(q, k, v, seg).astype(jnp.float32))

  @jax.jit
  def run(q, k, v):
    return fn(q, k, v, seg), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

  return run(q, k, v)


def _mesh(shape, names, axis_type=AxisType.Explicit):
  return jax.make_mesh(shape, names, (axis_type,) * len(names))


MESHES = {
  "context8": ((8,), (CONTEXT_AXIS,), AxisType.Explicit),
  "data2_context4": ((2, 4), ("data", CONTEXT_AXIS), AxisType.Explicit),
  "auto_data2_context2_tensor2": ((2, 2, 2), ("data", CONTEXT_AXIS, "tensor"), AxisType.Auto),
}


def _random_segments(seed):
  """Arbitrary (non-contiguous) segment ids in {0, 1, 2}: the mask semantics, not just packing."""
  return np.asarray(jax.random.randint(jax.random.key(seed), (B, S), 0, 3), np.int32)


@pytest.mark.parametrize(
  "mesh_name, segments",
  [(name, "packed") for name in MESHES] + [("context8", "random")],
)
def test_matches_reference_float32(mesh_name, segments):
  seg = _packed_segments() if segments == "packed" else _random_segments(7)
  q, k, v, seg, weights = _inputs(0, seg)
  valid = np.asarray(_dense_mask(seg).any(-1))  # [B, S]: queries with an allowed key
  # The reference gives padding queries a uniform average: leave them out of the loss.
  weights = weights * valid[:, :, None, None]
  ref_out, ref_grads = _values_and_grads(_reference, q, k, v, seg, weights)
  with jax.set_mesh(_mesh(*MESHES[mesh_name])):
    out, grads = _values_and_grads(_ring, q, k, v, seg, weights)
  out = np.asarray(out)
  np.testing.assert_allclose(out[valid], np.asarray(ref_out)[valid], atol=1e-5, rtol=1e-5)
  assert np.all(out[~valid] == 0)
  for name, g, ref_g in zip("qkv", grads, ref_grads, strict=True):
    np.testing.assert_allclose(np.asarray(g), np.asarray(ref_g), atol=1e-5, rtol=1e-5, err_msg=name)


def test_queries_without_keys_get_zero_output_and_gradient():
  q, k, v, seg, weights = _inputs(1, _packed_segments())
  valid = np.asarray(_dense_mask(seg).any(-1))
  assert not valid.all()
  with jax.set_mesh(_mesh(*MESHES["context8"])):
    out, grads = _values_and_grads(_ring, q, k, v, seg, weights)
    _, grads_valid_only = _values_and_grads(_ring, q, k, v, seg, weights * valid[:, :, None, None])
  assert np.all(np.isfinite(np.asarray(out)))
  assert np.all(np.asarray(out)[~valid] == 0)
  assert np.all(np.asarray(grads[0])[~valid] == 0)
  for g, g_valid in zip(grads, grads_valid_only, strict=True):
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_valid), atol=1e-6)


def test_bfloat16_close_to_float32_reference():
  """bfloat16 inputs against the float32 reference on the same (rounded) inputs: outputs within
  2e-2 and gradients within 3e-2 (absolute; outputs are O(1), gradients up to ~5). Measured:
  7e-3 and 1.4e-2, the size of the dense bfloat16 reference's own error (7e-3, 1.4e-2)."""
  q, k, v, seg, weights = _inputs(2, _packed_segments(), jnp.bfloat16)
  valid = np.asarray(_dense_mask(seg).any(-1))
  weights = weights * valid[:, :, None, None]
  f32 = [x.astype(jnp.float32) for x in (q, k, v)]
  ref_out, ref_grads = _values_and_grads(_reference, *f32, seg, weights)
  with jax.set_mesh(_mesh(*MESHES["data2_context4"])):
    out, grads = _values_and_grads(_ring, q, k, v, seg, weights)
  assert out.dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in grads)
  out = np.asarray(out.astype(jnp.float32))
  np.testing.assert_allclose(out[valid], np.asarray(ref_out)[valid], atol=2e-2)
  assert np.all(out[~valid] == 0)
  for name, g, ref_g in zip("qkv", grads, ref_grads, strict=True):
    g = np.asarray(g.astype(jnp.float32))
    np.testing.assert_allclose(g, np.asarray(ref_g), atol=3e-2, err_msg=name)


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_output_is_sharded_over_context(mesh_name):
  """Explicit axes: sequence-sharded inputs give a sequence-sharded output (the layout of q).
  Auto axes: replicated inputs, and XLA's propagation leaves the output in the ring's layout."""
  q, k, v, seg, _ = _inputs(3, _packed_segments())
  shape, names, axis_type = MESHES[mesh_name]
  sizes = dict(zip(names, shape, strict=True))
  batch = "data" if "data" in names else None
  mesh = _mesh(*MESHES[mesh_name])
  with jax.set_mesh(mesh):
    if axis_type == AxisType.Explicit:
      q, k, v = (jax.device_put(x, NamedSharding(mesh, P(batch, CONTEXT_AXIS))) for x in (q, k, v))
      seg = jax.device_put(seg, NamedSharding(mesh, P(batch, CONTEXT_AXIS)))
    out = jax.jit(_ring)(q, k, v, seg)
  assert out.sharding.spec[:2] == (batch, CONTEXT_AXIS)
  heads = N // sizes.get("tensor", 1)
  local = (B // sizes.get("data", 1), S // sizes[CONTEXT_AXIS], heads, H)
  assert {s.data.shape for s in out.addressable_shards} == {local}


def test_explicit_mesh_output_keeps_the_layout_of_q():
  """On Explicit axes the result has the type of q (replicated here), so that the ring is a
  drop-in replacement inside a scan over layers whose carry keeps one type."""
  q, k, v, seg, _ = _inputs(3, _packed_segments())
  with jax.set_mesh(_mesh(*MESHES["data2_context4"])):
    out = jax.jit(_ring)(q, k, v, seg)
  assert out.sharding.is_fully_replicated


def test_missing_axis_or_indivisible_length_is_a_clear_error():
  q, k, v, seg, _ = _inputs(4, _packed_segments())
  with pytest.raises(ValueError, match="no mesh with axis 'context'"):
    jax.jit(_ring)(q, k, v, seg)
  with jax.set_mesh(_mesh((8,), ("data",))):
    with pytest.raises(ValueError, match=r"no mesh with axis 'context' is set \(current mesh axes"):
      jax.jit(_ring)(q, k, v, seg)
  with jax.set_mesh(_mesh((8,), (CONTEXT_AXIS,))):
    with pytest.raises(ValueError, match="S=28 is not divisible by the size 8"):
      jax.jit(_ring)(q[:, :28], k[:, :28], v[:, :28], seg[:, :28])


def test_decoder_forward_with_ring_attention_matches_xla():
  """``model.forward`` with ``attention="ring"`` under a ("data", "context") mesh of Auto axes
  (as ``rlvr_jax.sharding.make_mesh`` builds them): the logits at real tokens and the gradient of
  a next-token loss over real tokens equal ``attention="xla"``."""
  cfg = model.ModelConfig.tiny()
  params = model.init_params(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (B, S), 3, cfg.vocab_size)
  left_pad = np.array([5, 0])[:, None]
  positions = np.arange(S)[None, :] - left_pad
  positions = jnp.asarray(np.where(positions < 0, -1, positions), jnp.int32)
  real = positions >= 0
  scored = real[:, :-1] & real[:, 1:]  # predictions made at a real token of a real token

  @functools.partial(jax.jit, static_argnames="config")
  def loss_and_grad(params, config):
    def loss(params):
      logits, _ = model.forward(params, tokens, positions, config=config, return_logits=True)
      logp = jax.nn.log_softmax(logits[:, :-1])
      token_logp = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
      return -jnp.sum(token_logp * scored) / jnp.sum(scored), logits

    return jax.value_and_grad(loss, has_aux=True)(params)

  (ref_loss, ref_logits), ref_grads = loss_and_grad(params, cfg.replace(attention="xla"))
  with jax.set_mesh(_mesh((2, 4), ("data", CONTEXT_AXIS), AxisType.Auto)):
    (loss, logits), grads = loss_and_grad(params, cfg.replace(attention="ring"))
  real = np.asarray(real)
  np.testing.assert_allclose(np.asarray(logits)[real], np.asarray(ref_logits)[real], atol=1e-5)
  np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6)
  for path, g in jax.tree_util.tree_leaves_with_path(grads):
    ref_g = functools.reduce(lambda t, key: t[key.key], path, ref_grads)
    err_msg = jax.tree_util.keystr(path)
    np.testing.assert_allclose(np.asarray(g), np.asarray(ref_g), atol=1e-5, err_msg=err_msg)


def test_future_chunks_are_skipped_by_a_cond():
  """The blocks in the causal future of a device's queries are skipped (``lax.cond``), not only
  masked, in the forward and the backward ring."""
  q, k, v, seg, weights = _inputs(5, _packed_segments())
  with jax.set_mesh(_mesh(*MESHES["context8"])):
    jaxpr = jax.make_jaxpr(lambda *a: _values_and_grads(_ring, *a, seg, weights))(q, k, v)
  assert str(jaxpr).count("cond[") >= 4  # forward: loop + last step; backward: the same
