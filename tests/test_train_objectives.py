"""Every objective in losses.OBJECTIVES runs in the trainer from the config (slow: one compile each)."""

import numpy as np
import pytest

from rlvr_jax import losses
from rlvr_jax.metrics import read_jsonl
from rlvr_jax.train import config as config_lib
from rlvr_jax.train.loop import train


def _config(workdir, objective):
  kwargs = dict(lp_reg_frac=0.5) if objective == "lp_reg" else {}
  return config_lib.tiny_config(
    workdir,
    # Two minibatches: the second update is off-policy (ratios != 1).
    rl=dict(
      num_minibatches=2,
      num_microbatches=2,
      advantage="copo" if objective == "copo" else "rloo",
    ),
    objective=dict(name=objective, kwargs=kwargs),
  )


@pytest.mark.slow
@pytest.mark.parametrize("objective", sorted(losses.OBJECTIVES))
def test_objective_runs_in_the_trainer(tmp_path, objective):
  train(_config(tmp_path, objective), log=lambda s: None)
  steps = [r for r in read_jsonl(str(tmp_path / "metrics.jsonl")) if "loss" in r]
  assert len(steps) == 2
  for r in steps:
    assert r["skipped"] == 0.0 and np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"])
