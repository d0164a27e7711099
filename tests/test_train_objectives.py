"""Every objective in losses.OBJECTIVES runs in the trainer from the config (slow: one compile each)."""

import numpy as np
import pytest

from rlvr_jax import losses
from rlvr_jax.metrics import read_jsonl
from rlvr_jax.train import config as config_lib
from rlvr_jax.train.loop import Trainer


def _config(workdir, objective):
  c = config_lib.base_config()
  c.workdir = str(workdir)
  c.model.hidden_size, c.model.intermediate_size, c.model.num_layers = 32, 64, 1
  c.model.num_heads, c.model.num_kv_heads, c.model.head_dim = 2, 1, 16
  c.data.task.max_value = 9
  c.data.num_eval = 4
  c.sampling.num_samples = 4
  c.sampling.max_new_tokens = 3
  c.rl.num_steps = 2
  c.rl.prompts_per_step = 4
  c.rl.num_minibatches = 2  # off-policy second update: ratios != 1
  c.rl.num_microbatches = 2
  c.rl.zero_variance = "keep"
  c.rl.advantage = "rloo"
  c.objective.name = objective
  c.eval.every = 0
  c.eval.num_samples = 4
  c.checkpoint.every = 0
  c.logging.progress = c.logging.tensorboard = c.logging.plot = False
  if objective == "copo":
    c.rl.advantage = "copo"
  if objective == "lp_reg":
    c.objective.kwargs.lp_reg_frac = 0.5
  return c


@pytest.mark.slow
@pytest.mark.parametrize("objective", sorted(losses.OBJECTIVES))
def test_objective_runs_in_the_trainer(tmp_path, objective):
  trainer = Trainer(_config(tmp_path, objective), log=lambda s: None)
  try:
    trainer.run()
  finally:
    trainer.close()
  steps = [r for r in read_jsonl(str(tmp_path / "metrics.jsonl")) if "loss" in r]
  assert len(steps) == 2
  for r in steps:
    assert r["skipped"] == 0.0 and np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"])
