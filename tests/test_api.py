"""The Python entry point: one call runs a config and returns its metrics and checkpoints."""

import json
import os

import pytest

from rlvr_jax import api
from rlvr_jax.train import config as config_lib
from rlvr_jax.train import platform_info


def test_run_returns_metrics_summary_and_checkpoints(tmp_path):
  base = config_lib.tiny_config(tmp_path / "unused")
  result = api.run(
    base,
    workdir=str(tmp_path / "run"),
    rl=dict(num_steps=3),
    **{"checkpoint.every": 2, "checkpoint.async_save": False},
    log=lambda s: None,
  )
  assert base.rl.num_steps == 2 and base.workdir.endswith("unused")  # the caller's config kept
  assert result.workdir == str(tmp_path / "run") and result.config.rl.num_steps == 3
  with open(tmp_path / "run" / "metrics.jsonl") as f:
    assert result.metrics == [json.loads(line) for line in f]
  steps, rewards = result.curve("reward/mean")
  assert steps == [1, 2, 3] and len(rewards) == 3
  for r in (m for m in result.metrics if "length/mean" in m):
    # the mean length is the accuracy-weighted mix of the by-outcome lengths (None: no such row)
    a, lc, li = r["accuracy/mean"], r["length/correct_mean"], r["length/incorrect_mean"]
    assert (lc is None) == (a == 0.0) and (li is None) == (a == 1.0)
    mix = (a * lc if a > 0 else 0.0) + ((1 - a) * li if a < 1 else 0.0)
    assert mix == pytest.approx(r["length/mean"], rel=1e-6)
  assert result.curve("eval/accuracy")[0] == [0, 3]
  assert result.summary["steps"] == 3
  assert result.summary["eval_after"]["eval/accuracy"] == result.curve("eval/accuracy")[1][-1]
  # the machine and versions the numbers came from (a moved number is not always a code change)
  assert result.summary["platform"] == platform_info.fingerprint()
  with open(tmp_path / "run" / "summary.json") as f:
    assert json.load(f)["platform"] == platform_info.fingerprint()
  assert sorted(os.listdir(result.checkpoint_dir)) == ["2", "3"]


def test_make_config_from_file_with_nested_and_dotted_overrides():
  c = api.make_config(
    "experiments/default.py",
    objective=dict(name="dapo"),
    **{"objective.kwargs.clip_high": 0.28, "rl.num_steps": 7},
  )
  assert (c.objective.name, c.objective.kwargs.clip_high, c.rl.num_steps) == ("dapo", 0.28, 7)
  assert c.warm_start.drop_carry_prob == 0.7  # the file's own values stay


@pytest.mark.parametrize(
  "overrides, field",
  [
    ({"rl": dict(num_stepz=3)}, "config.rl.num_stepz"),
    ({"sampling.num_samples": 1}, "config.sampling.num_samples"),
    ({"data.source": "reasoning_gym", "data.reasoning_gym.tasks": "chainsum"}, "tasks"),
  ],
)
def test_bad_override_fails_before_building_anything(tmp_path, overrides, field):
  workdir = tmp_path / "never"
  with pytest.raises(config_lib.ConfigError, match=field):
    api.run("experiments/default.py", workdir=str(workdir), **overrides)
  assert not workdir.exists()


def test_missing_config_file():
  with pytest.raises(config_lib.ConfigError, match="no such file"):
    api.run("experiments/nope.py")
