"""Every estimator on a mesh of 8 simulated CPU devices equals the unsharded result.

Two routes: (1) ``jax.jit`` with rows sharded over the mesh (XLA inserts the collectives), and
(2) ``jax.shard_map`` with ``axis_name`` for the rollout-scope statistics (explicit psums).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as PS

from rlvr_jax import advantages as adv

NUM_PROMPTS, GROUP_SIZE, NUM_TOKENS = 16, 4, 5


def _mesh(axis_type):
  assert jax.device_count() >= 8, "tests/conftest.py sets XLA_FLAGS for 8 simulated devices"
  return jax.make_mesh((8,), ("data",), axis_types=(axis_type,))


def _inputs():
  rng = np.random.default_rng(0)
  rewards = rng.integers(0, 2, (NUM_PROMPTS, GROUP_SIZE)).astype(np.float32)
  rewards[rng.random(rewards.shape) < 0.1] = np.nan
  rewards[5] = np.nan
  num_rows = NUM_PROMPTS * GROUP_SIZE
  lengths = rng.integers(0, NUM_TOKENS + 1, num_rows)
  return dict(
    rewards=jnp.asarray(rewards),
    greedy=jnp.asarray(rng.integers(0, 2, NUM_PROMPTS).astype(np.float32)),
    metric=jnp.asarray(rng.random((NUM_PROMPTS, GROUP_SIZE)).astype(np.float32)),
    answer_ids=jnp.asarray(rng.integers(0, 3, (NUM_PROMPTS, GROUP_SIZE))),
    mask=jnp.asarray(np.arange(NUM_TOKENS)[None, :] < lengths[:, None]),
    old_logp=jnp.asarray(rng.normal(size=(num_rows, NUM_TOKENS)).astype(np.float32)),
    ref_logp=jnp.asarray(rng.normal(size=(num_rows, NUM_TOKENS)).astype(np.float32)),
    values=jnp.asarray(rng.normal(size=(num_rows, NUM_TOKENS)).astype(np.float32)),
  )


def _all_estimators(x, state, axis_name=None):
  r, m = x["rewards"], x["mask"]
  copo = adv.copo_advantages(r, x["answer_ids"], axis_name=axis_name)
  riskpo, new_state = adv.riskpo_advantages(r, state, bundle_size=2, axis_name=axis_name)
  gae, returns = adv.gae_advantages(x["old_logp"], x["values"], m, axis_name=axis_name)
  out = dict(
    lite_ppo=adv.lite_ppo_advantages(r, axis_name=axis_name),
    copo_global=copo.global_advantages,
    copo_weight=copo.local_weight,
    riskpo=riskpo,
    reinforce_pp=adv.reinforce_plus_plus_advantages(
      r, m, old_logp=x["old_logp"], ref_logp=x["ref_logp"], kl_coef=0.1, axis_name=axis_name
    ),
    reinforce_pp_baseline=adv.reinforce_plus_plus_baseline_advantages(r, m, axis_name=axis_name),
    gae=gae,
    gae_returns=returns,
  )
  if axis_name is None:  # group-scope estimators: no collectives at all
    out.update(
      grpo=adv.grpo_advantages(r),
      dr_grpo=adv.dr_grpo_advantages(r),
      rloo=adv.rloo_advantages(r),
      remax=adv.remax_advantages(r, x["greedy"]),
      canon=adv.canon_advantages(r, x["metric"]),
      passk=adv.passk_training_advantages(r, k=2),
      pkpo=adv.pkpo_advantages(r, k=2),
      max_at_g=adv.max_at_g_advantages(r),
      tokens=adv.to_tokens(adv.grpo_advantages(r), m),
      grad_frac=adv.gradient_group_fraction(r),
    )
  return out, new_state


def _row_spec(x):
  return PS("data", *([None] * (x.ndim - 1)))


def _state():
  return adv.riskpo_init()


@pytest.fixture(scope="module")
def unsharded():
  return jax.jit(_all_estimators)(_inputs(), _state())


@pytest.mark.parametrize("axis_type", [AxisType.Explicit, AxisType.Auto])
def test_jit_with_sharded_rows_equals_unsharded(axis_type, unsharded):
  mesh = _mesh(axis_type)
  x = _inputs()
  want, want_state = unsharded
  sharded = jax.tree.map(lambda a: jax.device_put(a, NamedSharding(mesh, _row_spec(a))), x)
  got, got_state = jax.jit(_all_estimators)(sharded, _state())
  assert len(got["grpo"].sharding.device_set) == 8
  for name in want:
    np.testing.assert_allclose(got[name], want[name], atol=1e-6, rtol=1e-6, err_msg=name)
  np.testing.assert_allclose(got_state.quantiles, want_state.quantiles, atol=1e-6)
  assert np.isfinite(np.asarray(want["riskpo"])).all()


def test_shard_map_with_axis_name_equals_unsharded(unsharded):
  mesh = _mesh(AxisType.Explicit)  # jax.make_mesh's default; inside shard_map the axis is manual
  x = _inputs()
  want, want_state = unsharded
  x = jax.tree.map(lambda a: jax.device_put(a, NamedSharding(mesh, _row_spec(a))), x)
  in_specs = (jax.tree.map(_row_spec, x), PS())
  fn = jax.shard_map(
    functools.partial(_all_estimators, axis_name="data"),
    mesh=mesh,
    in_specs=in_specs,
    out_specs=(PS("data"), PS()),
  )
  got, got_state = jax.jit(fn)(x, _state())
  for name in got:
    np.testing.assert_allclose(got[name], want[name], atol=1e-5, rtol=1e-5, err_msg=name)
  np.testing.assert_allclose(got_state.quantiles, want_state.quantiles, atol=1e-6)
  # Without the psum each shard would whiten by its own statistics: a different answer.
  local = jax.shard_map(
    lambda r: adv.lite_ppo_advantages(r), mesh=mesh, in_specs=PS("data"), out_specs=PS("data")
  )
  assert not np.allclose(jax.jit(local)(x["rewards"]), want["lite_ppo"], atol=1e-3)
