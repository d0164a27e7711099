"""The command line: --help (exit 0, every field), experiment names, one-line errors (exit 2)."""

import os
import pathlib
import subprocess
import sys

import pytest

from rlvr_jax import cli
from rlvr_jax.train import config as config_lib
from rlvr_jax.train import config_help


def _main(*args, timeout=120):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.run(
    [sys.executable, "-m", "rlvr_jax.main", *args],
    capture_output=True, text=True, env=env, timeout=timeout,
  )  # fmt: skip


def test_help_exits_0_and_lists_every_field_with_value_and_meaning():
  out = _main("--config=default", "--help")
  assert out.returncode == 0, out.stderr
  text = out.stdout
  assert text.startswith("usage: python -m rlvr_jax.main --config=")
  exp = pathlib.Path(__file__).resolve().parents[1] / "experiments"
  names = sorted(p.stem for p in exp.glob("*.py") if "def get_config" in p.read_text())
  assert {"default", "smollm2_arithmetic"} <= set(names)
  assert ", ".join(names) in text  # the experiments by name
  for field, value in cli.flatten(cli.load_config("experiments/default.py")).items():
    line = next((ln for ln in text.splitlines() if ln.strip().startswith(f"{field} = ")), None)
    assert line is not None, field
    assert repr(value) in line  # this experiment's value (default.py sets rl.num_steps=150)
  assert "rl.num_steps = 150" in text and config_help.FIELD_HELP["rl.num_steps"] in text
  assert "[constant|cosine|linear]" in text  # the choices of a name-valued field
  assert "--mesh" in text and "--coordinator_address" in text


def test_help_without_a_config_shows_base_defaults():
  out = _main("-h")
  assert out.returncode == 0
  assert f"rl.num_steps = {config_lib.base_config().rl.num_steps}" in out.stdout


@pytest.mark.parametrize(
  "args,expected",
  [
    # unknown field: its name, the argument, the closest field
    (["--config.rl.num_stepz=3"],
     "error: config.rl.num_stepz: no such field (--config.rl.num_stepz=3); "
     "did you mean config.rl.num_steps?"),
    # wrong type: field, value, the expected type
    (["--config.rl.num_steps=many"], "error: config.rl.num_steps: "),
    # out of range: field, rule, value
    (["--config.sampling.num_samples=1"],
     "error: config.sampling.num_samples: group RL needs G >= 2, got 1"),
    # not one of the choices: field, value, choices
    (["--config.optim.schedule=cosin"],
     "error: config.optim.schedule: 'cosin'; valid: constant, cosine, linear; "
     "did you mean 'cosine'?"),
    # incompatible options: both fields
    (["--config.objective.name=copo"],
     "error: config.rl.advantage: objective 'copo' reads ['global_advantages', 'local_weight'] "
     "from the estimator and estimator 'grpo' returns []"),
  ],
)  # fmt: skip
def test_invalid_config_is_one_line_and_exit_2(args, expected, tmp_path):
  out = _main("--config=default", f"--config.workdir={tmp_path}/run", *args)
  assert out.returncode == 2, out.stderr
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(expected), out.stderr
  assert not os.path.exists(tmp_path / "run")  # failed before anything was loaded or written
  if "num_steps=many" in args[0]:
    assert "'many'" in lines[0] and "expected int" in lines[0]


def test_unknown_experiment_and_missing_config_exit_2():
  out = _main("--config=defualt")
  assert out.returncode == 2
  exp = pathlib.Path(__file__).resolve().parents[1] / "experiments"
  names = ", ".join(sorted(p.stem for p in exp.glob("*.py") if "def get_config" in p.read_text()))
  assert out.stderr.strip() == (
    f"error: --config=defualt: no experiment of that name (experiments: {names})"
  )
  out = _main()
  assert out.returncode == 2 and "--config=<experiment name or file> is required" in out.stderr
