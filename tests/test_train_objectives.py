"""Every objective in losses.OBJECTIVES runs in the trainer from the config (slow: one compile each)."""

import numpy as np
import pytest

from rlvr_jax import advantages, losses
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


# Every estimator whose reads the collector fills from any reward (not reward components or
# per-token rewards, which need a reward that gives them).
_ANY_REWARD = {"rewards", "completion_mask", "answer_ids", "greedy_rewards"}
RUNNABLE = sorted(n for n, s in advantages.ESTIMATORS.items() if set(s.reads) <= _ANY_REWARD)


@pytest.mark.slow
@pytest.mark.parametrize("estimator", RUNNABLE)
def test_estimator_runs_in_the_trainer(tmp_path, estimator):
  """The collector runs each estimator from its spec alone (reads, outputs, state, level), with
  an objective that reads its outputs."""
  spec = advantages.ESTIMATORS[estimator]
  settings = {name: 2 for name in spec.required_hyperparameters()}  # pass@k's k
  if "bundle_size" in spec.hyperparameters():
    settings["bundle_size"] = 2  # P = 4 prompts
  objective = next(
    n for n, o in sorted(losses.OBJECTIVES.items())
    if sorted(i.name for i in o.inputs_from("estimator")) == sorted(spec.outputs)
    and not o.inputs_from("proxy_logp") and o.state is None
  )  # fmt: skip
  c = config_lib.tiny_config(
    tmp_path, rl=dict(advantage=estimator, advantage_kwargs=settings),
    objective=dict(name=objective),
  )  # fmt: skip
  train(c, log=lambda s: None)
  steps = [r for r in read_jsonl(str(tmp_path / "metrics.jsonl")) if "loss" in r]
  assert len(steps) == 2 and all(np.isfinite(r["loss"]) for r in steps)
