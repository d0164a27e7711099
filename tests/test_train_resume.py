"""Exact resume: N steps uninterrupted == N/2 steps, kill (mid-save), resume, N/2 steps."""

import json
import os
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from rlvr_jax.metrics import read_jsonl
from rlvr_jax.train import config as config_lib
from rlvr_jax.train import rundir
from rlvr_jax.train.loop import Trainer

N = 4


def _config(workdir):
  return config_lib.tiny_config(
    workdir,
    # Two updates per rollout batch (exercises old log-probs and the per-epoch shuffle) and the
    # stateful RiskPO advantage (its quantile tracker must survive the restart).
    rl=dict(
      num_steps=N, num_minibatches=2, advantage="riskpo", advantage_kwargs=dict(bundle_size=2)
    ),  # fmt: skip
    objective=dict(name="dapo"),
    optim=dict(learning_rate=3e-2),
    checkpoint=dict(every=1, keep=2),
  )


def _run(config):
  trainer = Trainer(config, log=lambda s: None)
  try:
    trainer.run()
    return jax.tree.map(np.asarray, trainer.state.params), trainer.state
  finally:
    trainer.close()


def _comparable(records):
  drop = ("time", "reward/time_s", "reward/items_per_s", "eval/time_s")
  return [{k: v for k, v in r.items() if not k.startswith(drop)} for r in records]


def test_resume_after_kill_matches_uninterrupted_run(tmp_path):
  full_params, full_state = _run(_config(tmp_path / "full"))

  c = _config(tmp_path / "resumed")
  c.max_steps_this_run = N // 2
  _run(c)
  # A kill during the save of step N/2 + 1 leaves an incomplete checkpoint behind.
  os.makedirs(tmp_path / "resumed" / "checkpoints" / f"{N // 2 + 1}" / "state")
  c.max_steps_this_run = 0
  resumed_params, resumed_state = _run(c)

  for a, b in zip(jax.tree.leaves(full_params), jax.tree.leaves(resumed_params), strict=True):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(
    full_state.extra["estimator"].quantiles, resumed_state.extra["estimator"].quantiles
  )
  assert bool(full_state.extra["estimator"].initialized)
  full = _comparable(read_jsonl(str(tmp_path / "full" / "metrics.jsonl")))
  resumed = _comparable(read_jsonl(str(tmp_path / "resumed" / "metrics.jsonl")))
  assert [r["step"] for r in full] == [0, 1, 2, 3, 4, 4]  # eval before, 4 steps, eval after
  assert full == resumed
  # The run really trained (RiskPO gives A = 0 to papers above q_beta, so not every step moves).
  assert any(r.get("update_norm", 0.0) > 0 for r in full)
  # The second minibatch of a step is off-policy: its old_logp (from the pre-update scoring pass)
  # differs from the current log-probs, so the KL to the old policy is positive.
  assert any(r.get("kl_old/k3", 0.0) > 0 for r in full)


@pytest.mark.slow
def test_sigkill_during_run_then_resume_matches(tmp_path):
  """A real `kill -9` of `python -m rlvr_jax.main` after its first checkpoints, then a resume."""
  n = 6
  base = [
    sys.executable, "-m", "rlvr_jax.main", "--config=experiments/default.py",
    "--config.warm_start.num_steps=0", "--config.warm_start.clean_steps=0",
    f"--config.rl.num_steps={n}", "--config.rl.prompts_per_step=8", "--config.data.num_eval=8",
    "--config.eval.every=0", "--config.checkpoint.every=1", "--config.logging.progress=False",
    "--config.logging.plot=False", "--config.checkpoint.async_save=True",
  ]  # fmt: skip
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  subprocess.run([*base, f"--config.workdir={tmp_path / 'full'}"], check=True, env=env,
                 capture_output=True, timeout=900)  # fmt: skip
  work = tmp_path / "killed"
  proc = subprocess.Popen([*base, f"--config.workdir={work}"], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
  deadline = time.time() + 900
  while time.time() < deadline:
    done = [d for d in os.listdir(work / "checkpoints")] if (work / "checkpoints").exists() else []
    if any(d.isdigit() and int(d) >= 2 for d in done):
      break
    time.sleep(0.05)
  proc.kill()  # SIGKILL, possibly in the middle of the next step or save
  proc.wait()
  subprocess.run([*base, f"--config.workdir={work}"], check=True, env=env, capture_output=True,
                 timeout=900)  # fmt: skip
  full = _comparable(read_jsonl(str(tmp_path / "full" / "metrics.jsonl")))
  resumed = _comparable(read_jsonl(str(work / "metrics.jsonl")))
  assert full == resumed
  assert [r["step"] for r in full] == [0, *range(1, n + 1), n]


def _files(workdir):
  return {n: (workdir / n).read_bytes() for n in ("summary.json", "metrics.jsonl", "config.json")}


def test_finished_run_is_left_untouched_and_extending_it_matches_a_longer_run(tmp_path):
  """Re-running a finished run changes no byte of its results; a changed experiment is refused;
  raising rl.num_steps continues the run from its last checkpoint exactly like an uninterrupted
  run of the new length; checkpoint.resume=False starts over in place."""
  work = tmp_path / "run"
  _run(_config(work))
  before = _files(work)
  assert json.loads(before["summary.json"])["complete"] is True

  logs = []
  trainer = Trainer(_config(work), log=logs.append)
  try:
    summary = trainer.run()
  finally:
    trainer.close()
  assert _files(work) == before  # summary.json, metrics.jsonl (and config.json) byte-identical
  assert summary == json.loads(before["summary.json"])
  assert any(s.startswith("run complete (4 RL steps)") and "summary.json" in s for s in logs)

  changed = config_lib.apply_overrides(
    _config(work), dict(objective=dict(name="grpo"), sampling=dict(temperature=0.7))
  )
  with pytest.raises(config_lib.ConfigError) as e:
    Trainer(changed, log=lambda s: None)
  msg = str(e.value)
  assert msg.startswith("config.objective.name: ") and str(work) in msg
  assert "objective.name: 'dapo' -> 'grpo'" in msg and "sampling.temperature: 1.0 -> 0.7" in msg
  assert "--config.workdir=<new dir>" in msg and "--config.checkpoint.resume=False" in msg
  assert _files(work) == before

  longer = dict(rl=dict(num_steps=N + 2), eval=dict(every=3), logging=dict(tensorboard=True))
  ext_params, _ = _run(config_lib.apply_overrides(_config(work), longer))
  full_params, _ = _run(config_lib.apply_overrides(_config(tmp_path / "full"), longer))
  for a, b in zip(jax.tree.leaves(full_params), jax.tree.leaves(ext_params), strict=True):
    np.testing.assert_array_equal(a, b)
  full = _comparable(read_jsonl(str(tmp_path / "full" / "metrics.jsonl")))
  extended = _comparable(read_jsonl(str(work / "metrics.jsonl")))
  # The extended run keeps the old run's final evaluation at step N as history; the
  # uninterrupted run evaluated at step 3 (eval.every, changed on resume) instead.
  is_eval = lambda r: "eval/accuracy" in r
  assert [r for r in extended if not is_eval(r)] == [r for r in full if not is_eval(r)]
  assert [r["step"] for r in extended if is_eval(r)] == [0, N, N + 2]
  assert [r["step"] for r in full if is_eval(r)] == [0, 3, N + 2]
  assert extended[-1] == full[-1]  # the same final evaluation
  assert json.loads((work / "summary.json").read_text())["steps"] == N + 2

  changed.checkpoint.resume = False
  logs = []
  Trainer(changed, log=logs.append).close()
  assert any("starting over" in s for s in logs) and not os.listdir(work / "checkpoints")


def test_two_runs_of_the_same_config_are_bit_identical(tmp_path):
  """The reproducibility the README promises on one machine: same config, same numbers."""
  _run(_config(tmp_path / "a"))
  _run(_config(tmp_path / "b"))
  a = _comparable(read_jsonl(str(tmp_path / "a" / "metrics.jsonl")))
  b = _comparable(read_jsonl(str(tmp_path / "b" / "metrics.jsonl")))
  assert a == b and len(a) == N + 2
  assert any(r.get("update_norm", 0.0) > 0 for r in a)  # it trained


def test_extending_a_decaying_schedule_is_refused(tmp_path):
  """cosine / linear schedules last rl.num_steps: a longer run would change every step's rate."""
  c = config_lib.tiny_config(tmp_path, optim=dict(schedule="cosine"))
  (tmp_path / "config.json").write_text(c.to_json_best_effort())
  c.rl.num_steps = 5
  with pytest.raises(config_lib.ConfigError, match="2 -> 5 changes the length of the 'cosine'"):
    rundir.check_resume(c, latest_step=2)
  with pytest.raises(config_lib.ConfigError, match="already has 7 steps, more than"):
    rundir.check_resume(c, latest_step=7)
  c.optim.schedule = "constant"
  with pytest.raises(config_lib.ConfigError, match="optim.schedule: 'cosine' -> 'constant'"):
    rundir.check_resume(c, latest_step=2)


def test_fields_added_or_removed_by_the_code_do_not_count_as_changes():
  current = rundir.resolved(config_lib.base_config())
  saved = {k: v for k, v in current.items() if k != "sampling.phase_steps"}  # added later
  saved["rl.old_removed_option"] = 3  # since removed from the code
  assert rundir.differences(saved, current) == []
  current["sampling.phase_steps"] = 0  # a new field away from its default is a change
  assert rundir.differences(saved, current) == [("sampling.phase_steps", 32, 0)]
  current["rl.num_steps"], current["logging.plot"] = 999, False  # length and logging are not
  assert [f for f, *_ in rundir.differences(saved, current)] == ["sampling.phase_steps"]
