"""A real two-process run on loopback (jax.distributed, CPU, gloo) equals the one-process runs.

``tools/multihost_demo.py`` runs sampling (sampling layout), host rewards on each process's own
rows, group advantages, train steps (training layout, batches from per-process rows), a collective
orbax save / restore and one more step. The two-process run (2 x 4 devices, mesh 2x2x2) must give
the same params and metrics as one process with 8 devices (same mesh) and with 1 device.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "tools", "multihost_demo.py")


def _launch(workdir, *args):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  out = subprocess.run(
    [sys.executable, DEMO, f"--workdir={workdir}", "--steps=2", *args],
    env=env,
    capture_output=True,
    text=True,
    timeout=1200,
  )
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  return out.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path):
  sys.path.insert(0, os.path.join(ROOT, "tools"))
  try:
    import multihost_demo
  finally:
    sys.path.pop(0)
  two = _launch(tmp_path, "--launch=2", "--devices_per_process=4")
  one = _launch(tmp_path, "--launch=1", "--devices_per_process=8")
  single = _launch(tmp_path, "--launch=1", "--devices_per_process=1", "--mesh=1,1,1")
  assert (two, one, single) == ("p2x4", "p1x8", "p1x1")

  with open(tmp_path / "metrics_p2x4.json") as f:
    run = json.load(f)
  assert run["info"]["process_count"] == 2 and run["info"]["device_count"] == 8
  assert run["info"]["source"] == "explicit"
  assert run["process_rows"] == [0, 4]  # process 0 holds (and rewards) half of the 8 rows
  assert run["restored_step"] == 2
  assert run["restore_equal_params"] and run["restore_equal_opt_state"]
  assert run["restore_layout_ok"]
  assert len(run["metrics"]) == 3  # 2 steps, save / restore, 1 step from the restored state
  assert all(m["grad_norm"] > 0 and m["update_norm"] > 0 for m in run["metrics"])
  assert max(m["logp_gap/max"] for m in run["metrics"]) < 1e-5

  for ref in ("p1x8", "p1x1"):
    cmp = multihost_demo.compare(str(tmp_path), "p2x4", ref)
    assert cmp["param_max_abs_diff"] < 2e-5, (ref, cmp["param_max_abs_diff"])
    assert cmp["metric_max_abs_diff"] < 2e-5, (ref, cmp["metric_max_abs_diff"])


@pytest.mark.slow
def test_trainer_host_loop_two_processes_with_resume_matches_one_process(tmp_path):
  """The real host loop (``MeshTrainer``: each process loads and rewards its own prompts, sampling,
  advantages, 2 updates per step, held-out eval, JSONL, orbax): two processes run 1 step and stop
  (collective checkpoint), a second two-process launch resumes and runs step 2; the result equals
  one process running both steps on the same 8-device mesh."""
  sys.path.insert(0, os.path.join(ROOT, "tools"))
  try:
    import multihost_demo
  finally:
    sys.path.pop(0)
  two = ("--launch=2", "--devices_per_process=4", "--trainer")
  _launch(tmp_path, *two, "--stop_after=1")
  assert sorted(os.listdir(tmp_path / "trainer_p2x4" / "checkpoints")) == ["1"]
  _launch(tmp_path, *two)
  _launch(tmp_path, "--launch=1", "--devices_per_process=8", "--trainer")
  out = multihost_demo.compare_trainer(str(tmp_path), "p2x4_stop0", "p1x8_stop0")
  assert out["steps"] == [0, 1, 2, 2]  # eval before, 2 RL steps (1 before the restart), eval after
  assert out["info"][0]["process_count"] == 2 and out["info"][1]["process_count"] == 1
  assert out["param_max_abs_diff"] < 2e-5, out
  assert out["metric_max_abs_diff"] < 2e-5, out
  # Per-process data loading: each process read only its half of every batch of 4 prompts (the
  # groups it rewards), the halves are disjoint, and, concatenated in process order, they are
  # the one-process stream (the restarted launch continues from the checkpointed position).
  (one,) = multihost_demo.loaded_indices(str(tmp_path), "p1x8_stop0", 1)
  assert one == list(range(8))
  first = multihost_demo.loaded_indices(str(tmp_path), "p2x4_stop1", 2)
  second = multihost_demo.loaded_indices(str(tmp_path), "p2x4_stop0", 2)
  assert first == [[0, 1], [2, 3]] and second == [[4, 5], [6, 7]]
  assert [*first[0], *first[1], *second[0], *second[1]] == one
  # Only process 0 logs into the run directory; process 1 writes its own copy elsewhere.
  assert (tmp_path / "trainer_p2x4" / "process_1" / "metrics.jsonl").exists()
  with open(tmp_path / "log_p2x4_0.txt") as f:
    assert "resumed from step 1" in f.read()


@pytest.mark.slow
def test_trainer_uneven_shards_with_refill_two_processes_match_one_process(tmp_path):
  """P = 5 prompts over 2 processes (2 + 3: uneven prompt widths and reward rows) with DAPO's
  dynamic sampling (``refill``: several prompt batches per step while groups are zero-variance):
  the two-process host loop equals the one-process one and each process loads only its slices."""
  sys.path.insert(0, os.path.join(ROOT, "tools"))
  try:
    import multihost_demo
  finally:
    sys.path.pop(0)
  opts = ("--trainer", "--prompts_per_step=5", "--zero_variance=refill")
  _launch(tmp_path, "--launch=2", "--devices_per_process=4", *opts)
  _launch(tmp_path, "--launch=1", "--devices_per_process=8", *opts)
  out = multihost_demo.compare_trainer(str(tmp_path), "p2x4_stop0", "p1x8_stop0")
  assert out["param_max_abs_diff"] < 2e-5, out
  assert out["metric_max_abs_diff"] < 2e-5, out
  (one,) = multihost_demo.loaded_indices(str(tmp_path), "p1x8_stop0", 1)
  p0, p1 = multihost_demo.loaded_indices(str(tmp_path), "p2x4_stop0", 2)
  rounds = len(one) // 5
  assert len(one) == 5 * rounds and rounds > 2  # refill took more than one batch per step
  assert p0 == [i for i in one if i % 5 < 2] and p1 == [i for i in one if i % 5 >= 2]
