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
  # B = 4 prompts x 2 samples = 8 rows: 2 per (data x fsdp) shard; two updates per rollout batch.
  return config_lib.tiny_mesh_config(workdir, rl=dict(num_steps=STEPS))


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
      jax.tree.leaves(again.layout.state_shardings.params),
      strict=True,
    ):
      np.testing.assert_array_equal(np.asarray(b), a)
      assert b.sharding == sh
  finally:
    again.close()
