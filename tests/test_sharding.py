"""Meshes, logical-axis rules and sharded forward passes on 8 simulated CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from rlvr_jax import sharding as S
from rlvr_jax.model import (
  ModelConfig,
  cache_shardings,
  forward,
  init_cache,
  init_params,
  param_shardings,
)


def test_infer_mesh_shape():
  assert S.infer_mesh_shape((2, -1, 2), 8) == (2, 2, 2)
  assert S.infer_mesh_shape((1, -1, 1), 8) == (1, 8, 1)
  assert S.infer_mesh_shape((4, 1, 2), 8) == (4, 1, 2)
  with pytest.raises(ValueError, match="at most one"):
    S.infer_mesh_shape((-1, -1, 2), 8)
  with pytest.raises(ValueError, match="do not divide the 8 devices"):
    S.infer_mesh_shape((3, -1, 1), 8)
  with pytest.raises(ValueError, match="use 4 of 8"):
    S.infer_mesh_shape((2, 1, 2), 8)
  mesh = S.make_mesh(2, -1, 2)
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}


def test_logical_to_spec_rules():
  mesh = S.make_mesh(2, 2, 2)
  train, sample = S.TRAIN_RULES, S.SAMPLE_RULES
  wq_axes = ("layers", "embed", "heads", "head_dim")
  assert S.logical_to_spec(wq_axes, train, shape=(2, 64, 4, 16), mesh=mesh) == P(
    None, "fsdp", "tensor", None
  )
  assert S.logical_to_spec(wq_axes, sample, shape=(2, 64, 4, 16), mesh=mesh) == P(
    None, None, "tensor", None
  )
  # 3 KV heads do not divide tensor=2: replicated instead of an invalid spec
  kv_axes = ("layers", "embed", "kv_heads", "head_dim")
  assert S.logical_to_spec(kv_axes, train, shape=(2, 64, 3, 16), mesh=mesh) == P(
    None, "fsdp", None, None
  )
  # batch over data x fsdp, dropping fsdp when only data divides
  assert S.logical_to_spec(("batch", None), train, shape=(8, 5), mesh=mesh) == P(
    ("data", "fsdp"), None
  )
  assert S.logical_to_spec(("batch", None), train, shape=(6, 5), mesh=mesh) == P("data", None)
  # a mesh axis is used once per array: vocab and embed of lm_head
  rules = (("a", "tensor"), ("b", ("tensor", "fsdp")))
  assert S.logical_to_spec(("a", "b"), rules) == P("tensor", "fsdp")
  with pytest.raises(KeyError, match="'emebd' has no rule"):
    S.logical_to_spec(("emebd",), train)


def _setup(family="qwen2"):
  config = ModelConfig.tiny(
    attention_bias=family == "qwen2", qk_norm=family == "qwen3", family=family
  )
  params = init_params(config, jax.random.key(0))
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, config.vocab_size, (4, 6)), jnp.int32)
  positions = jnp.asarray(np.tile(np.arange(6), (4, 1)) - np.array([[2], [0], [1], [0]]))
  return config, params, tokens, jnp.maximum(positions, -1).astype(jnp.int32)


@pytest.mark.parametrize("rules_name", ["TRAIN_RULES", "SAMPLE_RULES"])
def test_sharded_forward_equals_single_device(rules_name):
  config, params, tokens, positions = _setup()
  rules = getattr(S, rules_name)
  ref, _ = forward(params, tokens, positions, config=config, return_logits=True)
  mesh = S.make_mesh(2, 2, 2)
  shardings = param_shardings(config, mesh, rules)
  sharded = S.reshard(params, shardings)
  wq = sharded["layers"]["wq"]
  assert len(wq.sharding.device_set) == 8
  n_shards = 2 if rules_name == "SAMPLE_RULES" else 4  # tensor (x fsdp) splits of wq
  assert wq.addressable_shards[0].data.size * n_shards == wq.size
  data = S.batch_sharding(mesh, rules, shape=tokens.shape)
  fn = jax.jit(lambda p, t, q: forward(p, t, q, config=config, return_logits=True)[0])
  out = fn(sharded, jax.device_put(tokens, data), jax.device_put(positions, data))
  np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=2e-5, rtol=1e-5)


def test_sharded_cached_decode_and_reshard():
  """Train layout -> reshard -> sample layout with a sharded cache: same logits as 1 device."""
  config, params, tokens, positions = _setup("qwen3")
  mesh = S.make_mesh(2, 2, 2)
  train = S.reshard(params, param_shardings(config, mesh, S.TRAIN_RULES))
  sample_sh = param_shardings(config, mesh, S.SAMPLE_RULES)
  cost = S.reshard_cost(train, sample_sh, repeats=1)
  assert cost["bytes_per_device_after"] > cost["bytes_per_device_before"]  # fsdp gathered
  sample = S.reshard(train, sample_sh)
  for a, b in zip(jax.tree.leaves(sample), jax.tree.leaves(params), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  def run(p, cache):
    out1, cache = forward(
      p, tokens[:, :4], positions[:, :4], config=config, cache=cache, return_logits=True
    )
    out2, cache = forward(
      p, tokens[:, 4:], positions[:, 4:], config=config, cache=cache, return_logits=True
    )
    return jnp.concatenate([out1, out2], 1), cache

  ref, _ = run(params, init_cache(config, 4, 8))
  cache = init_cache(config, 4, 8)
  cache = jax.device_put(cache, cache_shardings(cache, mesh, S.SAMPLE_RULES))
  out, new_cache = jax.jit(run, donate_argnums=1)(sample, cache)
  assert int(new_cache.index) == 6
  np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=2e-5, rtol=1e-5)


def test_init_and_load_straight_into_shardings(tmp_path):
  """init_params / load_hf / abstract_params with shardings give arrays already laid out."""
  from rlvr_jax.model import abstract_params, export_hf, load_hf

  config, params, tokens, positions = _setup("qwen3")
  mesh = S.make_mesh(1, 4, 2)
  shardings = param_shardings(config, mesh, S.TRAIN_RULES)
  fresh = init_params(config, jax.random.key(0), shardings=shardings)
  assert fresh["layers"]["w_up"].sharding == shardings["layers"]["w_up"]
  assert fresh["layers"]["w_up"].sharding.spec == P(None, "fsdp", "tensor")
  np.testing.assert_array_equal(np.asarray(fresh["embed"]), np.asarray(params["embed"]))
  target = abstract_params(config, shardings)
  assert target["layers"]["wq"].shape == params["layers"]["wq"].shape
  assert target["layers"]["wq"].sharding.spec == P(None, "fsdp", "tensor", None)

  export_hf(params, config, tmp_path / "ckpt")
  loaded, _ = load_hf(tmp_path / "ckpt", mesh=mesh)
  for (path, a), b in zip(
    jax.tree_util.tree_leaves_with_path(loaded), jax.tree.leaves(shardings), strict=True
  ):
    assert a.sharding == b, path
  for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(params), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
