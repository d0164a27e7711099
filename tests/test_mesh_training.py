"""Training on a (data=2, fsdp=2, tensor=2) mesh of 8 simulated CPU devices equals 1 device.

Three levels: the jitted train step (several AdamW updates), the whole host loop (sampling,
rewards, advantages, updates, checkpoint) through ``MeshTrainer``, and sampler / trainer log-prob
parity with the sampler in the sampling layout and the trainer in the training layout.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlvr_jax import data, model, sampling
from rlvr_jax import sharding as S
from rlvr_jax.train import sharded
from rlvr_jax.train import step as step_lib
from rlvr_jax.train.layout import Layout
from rlvr_jax.train.state import TrainBatch, init_state

CFG = model.ModelConfig.tiny(
  vocab_size=32,
  hidden_size=32,
  intermediate_size=64,
  num_layers=1,
  num_heads=4,
  num_kv_heads=2,
  head_dim=8,
)
B, S_P, T = 8, 4, 5


def _batch(seed, cfg=CFG):
  """A [B, S_P + T] minibatch of random tokens under ``cfg``'s vocabulary, with its N_tok, N_seq
  (also the LoRA step tests')."""
  rng = np.random.default_rng(seed)
  prompt = rng.integers(3, cfg.vocab_size, (B, S_P)).astype(np.int32)
  pmask = np.ones((B, S_P), bool)
  pmask[::2, 0] = False
  comp = rng.integers(3, cfg.vocab_size, (B, T)).astype(np.int32)
  cmask = np.arange(T)[None, :] < rng.integers(1, T + 1, B)[:, None]
  adv = rng.normal(size=(B, 1)).astype(np.float32) * cmask
  tokens, positions = step_lib.sequence_inputs(prompt, pmask, jnp.asarray(comp))
  old = rng.normal(size=(B, T)).astype(np.float32) * 0.1 - 2.0
  tb = TrainBatch(
    tokens=np.asarray(tokens),
    positions=np.asarray(positions),
    completion_mask=cmask,
    advantages=adv,
    old_logp=old,
    sampler_logp=old,
    ref_logp=None,
    extras={},
  )
  return tb, float(cmask.sum()), float((cmask.sum(-1) > 0).sum())


def _steps(mesh, num_steps=3):
  # eps large enough that Adam's first steps (~ lr * sign(g)) do not amplify round-off in
  # near-zero gradient entries into O(lr) differences between layouts.
  opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2, eps=1e-4))
  step = step_lib.make_train_step(
    model_config=CFG, optimizer=opt, objective="dapo", num_microbatches=1
  )
  state = init_state(model.init_params(CFG, jax.random.key(0)), opt, jax.random.key(1))
  if mesh is not None:
    sh = sharded.state_shardings(state, mesh=mesh, model_config=CFG, optimizer=opt)
    state = sharded.place(state, sh)
    step = sharded.sharded_train_step(step, sh, mesh)
  metrics = []
  for i in range(num_steps):
    tb, nt, ns = _batch(i)
    tb = jax.tree.map(jnp.asarray, tb) if mesh is None else sharded.shard_rows(tb, mesh)
    state, m = step(state, tb, nt, ns, jax.random.key(10 + i))
    metrics.append({k: float(v) for k, v in m.items()})
  return state, metrics


def test_train_steps_on_2x2x2_mesh_match_one_device():
  mesh = S.make_mesh(2, 2, 2)
  ref_state, ref_metrics = _steps(None)
  state, metrics = _steps(mesh)
  # The state really is distributed: an FSDP x TP weight is split 4 ways, Adam moments too.
  leaves = jax.tree.leaves(state.params)
  split = [x for x in leaves if len(x.sharding.device_set) == 8 and not x.is_fully_replicated]
  assert split, "no parameter is sharded"
  mu = jax.tree.leaves(state.opt_state)
  assert any(not x.is_fully_replicated for x in mu if hasattr(x, "sharding") and x.ndim > 1)
  for a, b in zip(jax.tree.leaves(ref_state.params), leaves, strict=True):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-5, atol=2e-6)
  for ra, rb in zip(ref_metrics, metrics, strict=True):
    for k in ("loss", "grad_norm", "update_norm", "entropy/mean"):
      np.testing.assert_allclose(rb[k], ra[k], rtol=1e-4, atol=1e-6, err_msg=k)
  # The params moved (the comparison is not between two untouched inits).
  init = model.init_params(CFG, jax.random.key(0))
  assert (
    max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(init), leaves, strict=True))
    > 1e-3
  )


def test_state_shardings_follow_the_training_rules():
  mesh = S.make_mesh(2, 2, 2)
  opt = optax.adamw(1e-3)
  state = init_state(model.init_params(CFG, jax.random.key(0)), opt, jax.random.key(1))
  sh = sharded.state_shardings(state, mesh=mesh, model_config=CFG, optimizer=opt)
  want = model.param_shardings(CFG, mesh, S.TRAIN_RULES)
  assert jax.tree.leaves(sh.params) == jax.tree.leaves(want)
  adam = sh.opt_state[0]
  assert jax.tree.leaves(adam.mu) == jax.tree.leaves(want)
  assert jax.tree.leaves(adam.nu) == jax.tree.leaves(want)
  assert adam.count.spec == jax.sharding.PartitionSpec()
  assert sh.key.spec == jax.sharding.PartitionSpec()


def test_process_rows_and_local_data_single_process():
  mesh = S.make_mesh(2, 2, 2)
  assert sharded.process_rows(8, mesh) == slice(0, 8)
  x = np.arange(24, dtype=np.float32).reshape(8, 3)
  g = sharded.shard_local_rows({"x": x}, 8, mesh)["x"]
  assert g.sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"), None)
  np.testing.assert_array_equal(np.asarray(g), x)
  assert sharded.reduce_metrics({"a": 1.5, "b/max": 2.0}) == {"a": 1.5, "b/max": 2.0}


def test_sampler_in_sampling_layout_matches_trainer_in_training_layout():
  """Rollout sampled with TP-only weights; log-probs recomputed with FSDP x TP weights."""
  mesh = S.make_mesh(2, 2, 2)
  params = model.init_params(CFG, jax.random.key(3))
  sample_params = sharded.place(params, model.param_shardings(CFG, mesh, S.SAMPLE_RULES))
  train_params = sharded.place(params, model.param_shardings(CFG, mesh, S.TRAIN_RULES))
  rng = np.random.default_rng(0)
  prompts = rng.integers(3, CFG.vocab_size, (4, 6)).astype(np.int32)
  pmask = np.ones_like(prompts, bool)
  pmask[1, :2] = False
  strategy = sampling.Temperature(0.8)
  with jax.set_mesh(mesh):
    rollout = sampling.generate(
      sample_params,
      prompts,
      pmask,
      config=CFG,
      num_samples=2,
      strategy=strategy,
      key=jax.random.key(0),
      max_new_tokens=6,
      stop_tokens=(),
      pad_id=0,
      buckets=(8,),
    )
    assert not rollout.tokens.is_fully_replicated  # rows over the data axes
    tokens, positions = step_lib.sequence_inputs(
      rollout.prompt_tokens, rollout.prompt_mask, rollout.tokens
    )
    score = step_lib.make_score_fn(model_config=CFG, temperature=0.8, chunk_size=4)
    logp, _ = score(train_params, tokens, positions, rollout.tokens.shape[1])
    gaps = sampling.logprob_parity(train_params, rollout, config=CFG, strategy=strategy)
  mask = np.asarray(rollout.completion_mask)
  assert mask.sum() > 0
  gap = np.abs(np.asarray(logp) - np.asarray(rollout.sampler_logp))[mask]
  assert gap.max() < 2e-5, gap.max()
  assert float(gaps["sampler_logp_gap/max"]) < 2e-5
  assert float(gaps["model_logp_gap/max"]) < 2e-5


@pytest.mark.parametrize("mesh_shape", [(2, 2, 2)])
def test_reshard_round_trip_is_exact(mesh_shape):
  mesh = S.make_mesh(*mesh_shape)
  params = model.init_params(CFG, jax.random.key(0))
  train = sharded.place(params, model.param_shardings(CFG, mesh, S.TRAIN_RULES))
  sample_sh = model.param_shardings(CFG, mesh, S.SAMPLE_RULES)
  back = S.reshard(S.reshard(train, sample_sh), model.param_shardings(CFG, mesh, S.TRAIN_RULES))
  for a, b, c in zip(
    jax.tree.leaves(params), jax.tree.leaves(back), jax.tree.leaves(sample_sh), strict=True
  ):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert "fsdp" not in jax.tree.leaves(tuple(c.spec))


def test_parse_mesh_flag():
  assert sharded.parse_mesh("") is None
  assert sharded.parse_mesh("2,-1,2") == (2, -1, 2)
  with pytest.raises(ValueError, match="expected three sizes"):
    sharded.parse_mesh("2,2")
  with pytest.raises(ValueError, match="expected three integers"):
    sharded.parse_mesh("2,x,1")


def test_mesh_layout_hooks_single_process():
  mesh = S.make_mesh(2, 2, 2)
  layout = sharded.MeshLayout(mesh)
  assert layout.process_count == 1 and layout.is_primary
  assert layout.local_groups(4) == (0, 4)
  ids, mask = np.arange(6).reshape(2, 3), np.ones((2, 3), bool)
  assert layout.gather_prompts(ids, mask, np.arange(2), pad_id=0)[0] is ids
  with pytest.raises(RuntimeError, match="setup"):
    layout.place_state({})
  opt = optax.adamw(1e-3)
  state = init_state(model.init_params(CFG, jax.random.key(0)), opt, jax.random.key(1))
  layout.setup(state, model_config=CFG, optimizer=opt)
  placed = layout.place_state(state)
  for x, sh in zip(
    jax.tree.leaves(placed.params), jax.tree.leaves(layout.state_shardings.params), strict=True
  ):
    assert x.sharding == sh
  # Placing what is already placed is free (restored checkpoints, multi-process arrays).
  assert layout.place_state(placed).params["embed"] is placed.params["embed"]
  sample = layout.sampling_params(placed.params)
  for x in jax.tree.leaves(sample):
    assert "fsdp" not in jax.tree.leaves(tuple(x.sharding.spec))
  assert layout.sampling_params(None) is None
  tb, _, _ = _batch(0)
  rows = layout.place_batch(tb)
  assert rows.tokens.sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"), None)


def test_default_layout_and_per_process_data_shards():
  lay = Layout()
  x = object()
  assert lay.is_primary and lay.place_state(x) is x and lay.place_batch(x) is x
  assert (
    lay.sampling_params(x) is x and lay.gather_rollout(x) is x and lay.local_groups(5) == (0, 5)
  )
  src = data.PromptSource(task=data.TaskSpec(max_value=9), seed=0)
  assert lay.shard_source(src) is src

  class SecondOfTwo(Layout):  # what process 1 of 2 sees
    process_index, process_count = 1, 2

  second = SecondOfTwo()
  assert not second.is_primary
  mine = second.shard_source(src)
  # The prompts a process loads are exactly the groups whose rewards it computes.
  for n in (4, 5):
    assert mine.span(n) == second.local_groups(n) == (n // 2, n)
  assert [r["index"] for r in mine.take(4)] == [2, 3] and mine.state() == {"position": 4}


def test_gathered_rewards_single_process():
  import concurrent.futures

  from rlvr_jax.rewards.runtime import RewardFailure, RewardResult

  x = np.arange(6, dtype=np.int32).reshape(3, 2)
  np.testing.assert_array_equal(sharded.allgather_rows(x, [3]), x)
  with pytest.raises(ValueError, match="has 3 rows, counts say 2"):
    sharded.allgather_rows(x, [2])
  fut = concurrent.futures.Future()
  fut.set_result(
    RewardResult(
      rewards=np.array([1.0, np.nan, 0.0], np.float32),
      failures=[RewardFailure(index=1, cause="timeout", message="t", elapsed_s=1.0)],
      metrics={"reward/time_s": 0.5},
      info={"correct": np.array([1.0, np.nan, 0.0])},
    )
  )
  r = sharded._GatheredRewards(fut, counts=[3], offset=5).result()
  np.testing.assert_array_equal(r.rewards, np.array([1.0, np.nan, 0.0], np.float32))
  assert r.rewards.dtype == np.float32 and r.info["correct"].dtype == np.float32
  assert [f.index for f in r.failures] == [6]  # local row 1 of a process whose rows start at 5
  assert r.metrics == {"reward/time_s": 0.5}


def test_combine_process_metrics():
  keys = ["a/max", "a/min", "loss", "nan_everywhere"]
  # 3 processes with weights 1, 3, 0 (the last holds no samples); process 1's loss failed (NaN).
  table = np.array(
    [
      [[2.0, 1.0], [2.0, 1.0], [1.0, 1.0], [np.nan, 1.0]],
      [[5.0, 3.0], [-1.0, 3.0], [np.nan, 3.0], [np.nan, 3.0]],
      [[np.nan, 0.0], [np.nan, 0.0], [4.0, 2.0], [np.nan, 0.0]],
    ]
  )
  out = sharded.combine_process_metrics(keys, table)
  assert out["a/max"] == 5.0 and out["a/min"] == -1.0
  assert out["loss"] == pytest.approx((1.0 * 1 + 4.0 * 2) / 3)
  assert np.isnan(out["nan_everywhere"])
  with pytest.raises(ValueError, match=r"must be \[P, K=4, 2\]"):
    sharded.combine_process_metrics(keys, table[:, :3])
