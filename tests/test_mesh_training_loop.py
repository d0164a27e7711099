"""The whole RL step (sample -> rewards -> advantages -> updates) on a (2, 2, 2) mesh equals 1 device,
and an orbax checkpoint of the sharded state restores into the training layout."""

import jax
import numpy as np
import pytest

from rlvr_jax import sharding as S
from rlvr_jax.train import config as config_lib
from rlvr_jax.train import sharded
from rlvr_jax.train.loop import Trainer

STEPS = 2


def _config(workdir):
  c = config_lib.base_config()
  c.workdir = str(workdir)
  c.model.hidden_size, c.model.intermediate_size, c.model.num_layers = 32, 64, 1
  c.model.num_heads, c.model.num_kv_heads, c.model.head_dim = 2, 2, 16
  c.data.task.max_value = 9
  c.data.num_eval = 4
  c.sampling.num_samples = 2
  c.sampling.max_new_tokens = 3
  c.rl.num_steps = STEPS
  c.rl.prompts_per_step = 4  # B = 8 rows: 2 per (data x fsdp) shard
  c.rl.num_minibatches = 1
  c.rl.num_epochs = 2  # two updates per rollout batch: old log-probs from the scoring pass
  c.rl.zero_variance = "keep"
  c.objective.name = "dapo"
  # A random model rarely gets a sum right (all-zero rewards, zero advantages): the entropy bonus
  # keeps a non-zero gradient through the sampled tokens either way.
  c.objective.kwargs.entropy_coef = 0.05
  c.optim.learning_rate = 1e-2
  c.optim.eps = 1e-4
  c.checkpoint.async_save = False
  c.logging.progress = c.logging.tensorboard = c.logging.plot = False
  return c


def _steps(trainer):
  start = trainer.restore_or_start()
  metrics = [trainer.rl_step(s) for s in range(start, start + STEPS)]
  return metrics


@pytest.mark.slow
def test_rl_steps_on_mesh_match_one_device_and_checkpoint_restores(tmp_path):
  ref = Trainer(_config(tmp_path / "one"), log=lambda s: None)
  try:
    init = jax.tree.map(np.asarray, ref.state.params)
    ref_metrics = _steps(ref)
    ref_params = jax.tree.map(np.asarray, ref.state.params)
  finally:
    ref.close()

  assert all(m["grad_norm"] > 0 for m in ref_metrics)
  moved = max(
    float(np.abs(a - b).max())
    for a, b in zip(jax.tree.leaves(init), jax.tree.leaves(ref_params), strict=True)
  )
  assert moved > 1e-3

  mesh = S.make_mesh(2, 2, 2)
  tr = sharded.MeshTrainer(_config(tmp_path / "mesh"), mesh=mesh, log=lambda s: None)
  try:
    metrics = _steps(tr)
    leaves = jax.tree.leaves(tr.state.params)
    assert any(not x.is_fully_replicated for x in leaves)
    for a, b in zip(jax.tree.leaves(ref_params), leaves, strict=True):
      np.testing.assert_allclose(np.asarray(b), a, rtol=1e-4, atol=1e-5)
    for ra, rb in zip(ref_metrics, metrics, strict=True):
      for k in ("reward/mean", "length/mean", "loss", "grad_norm", "logp_gap/max"):
        np.testing.assert_allclose(rb[k], ra[k], rtol=1e-3, atol=1e-5, err_msg=k)
      assert ra["logp_gap/max"] < 1e-4  # sampler (TP layout) vs trainer (FSDP x TP layout)
    tr.save(STEPS, force=True)
    tr.checkpointer.wait()
    saved = jax.tree.map(np.asarray, tr.state.params)
  finally:
    tr.close()

  again = sharded.MeshTrainer(_config(tmp_path / "mesh"), mesh=mesh, log=lambda s: None)
  try:
    assert again.restore_or_start() == STEPS
    for a, b, sh in zip(
      jax.tree.leaves(saved),
      jax.tree.leaves(again.state.params),
      jax.tree.leaves(again.shardings.params),
      strict=True,
    ):
      np.testing.assert_array_equal(np.asarray(b), a)
      assert b.sharding == sh
  finally:
    again.close()
