"""tools/harness.py, the benchmark suite's shared harness: warm-up calls left out of the samples,
the order of interleaved rounds and of alternated child processes, the environment record, the
JSON document and the ratio summaries, against hand-computed numbers."""

import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
try:
  import harness
finally:
  sys.path.pop(0)


class FakeClock:
  """A clock that moves only when a call of ``work`` says so: call i (from 0) takes i + 1 s."""

  def __init__(self):
    self.now, self.calls = 100.0, 0

  def __call__(self):
    return self.now

  def work(self):
    self.calls += 1
    self.now += self.calls
    return self.calls


def test_warmup_calls_are_not_samples():
  clock = FakeClock()
  t = harness.time_calls(clock.work, warmup=2, repeats=3, block=False, clock=clock)
  assert clock.calls == 5
  assert t.warmup == [1.0, 2.0] and t.samples == [3.0, 4.0, 5.0]
  assert (t.median, t.min, t.max, t.spread) == (4.0, 3.0, 5.0, 0.5)
  assert t.text() == "4.000 (3.000-5.000)" and t.last is None
  assert t.to_dict() == {"samples": [3.0, 4.0, 5.0], "warmup": [1.0, 2.0], "median": 4.0,
                         "min": 3.0, "max": 5.0}  # fmt: skip


def test_budget_stops_the_repeats_and_keep_last():
  clock = FakeClock()
  t = harness.time_calls(clock.work, warmup=1, repeats=10, budget_s=6.0, block=False,
                         keep_last=True, clock=clock)  # fmt: skip
  assert t.samples == [2.0, 3.0, 4.0]  # 2 + 3 < 6, 2 + 3 + 4 >= 6
  assert t.last == 4  # the last call's output
  # at least one timed call, whatever the repeats and the budget
  assert len(harness.time_calls(clock.work, warmup=0, repeats=0, budget_s=0.0).samples) == 1


def test_every_call_is_waited_for():
  events = []

  def call():
    events.append("call")
    return "out"

  harness.time_calls(call, warmup=1, repeats=2, block=lambda: events.append("sync"))
  assert events == ["call", "sync"] * 3
  blocked = []

  class Array:  # what jax.block_until_ready calls on a leaf
    def block_until_ready(self):
      blocked.append(True)
      return self

  import jax  # noqa: F401 - loaded: block=True waits through jax

  harness.time_calls(Array, warmup=1, repeats=2)
  assert len(blocked) == 3


def test_interleave_alternates_after_the_warmup():
  clock, order = FakeClock(), []

  def contender(name):
    def fn():
      order.append(name)
      clock.work()

    return fn

  samples = harness.interleave({"a": contender("a"), "b": contender("b")}, rounds=2, warmup=1,
                               block=False, clock=clock)  # fmt: skip
  assert order == ["a", "b", "a", "b", "a", "b"]
  assert samples == {"a": [3.0, 5.0], "b": [4.0, 6.0]}  # calls 1-2 were the warm-up


CHILD = """
import os
import harness

def child(name, log, warmup, calls):
  with open(log, "a") as f:
    f.write(name + "\\n")
  made = []
  timing = harness.time_calls(lambda: made.append(1), warmup=warmup, repeats=calls)
  return {**timing.to_dict(), "calls_made": len(made), "pid": os.getpid(),
          "setting": os.environ.get("BENCH_SETTING"), "unset": os.environ.get("BENCH_UNSET")}

def fails(**kwargs):
  raise ValueError("no such setting")
"""


def test_alternate_runs_each_round_in_fresh_processes_in_turn(tmp_path, monkeypatch):
  (tmp_path / "child_tool.py").write_text(CHILD)
  log = str(tmp_path / "order.log")
  monkeypatch.setenv("BENCH_UNSET", "from the parent")
  target = str(tmp_path / "child_tool.py") + ":child"
  children = {
    name: harness.Child(target, dict(name=name, log=log, warmup=2, calls=3),
                        {"BENCH_SETTING": name.lower(), "BENCH_UNSET": None})
    for name in ("A", "B")
  }  # fmt: skip
  results = harness.alternate(children, rounds=3)
  with open(log) as f:
    assert f.read().split() == ["A", "B", "A", "B", "A", "B"]
  assert list(results) == ["A", "B"] and all(len(r) == 3 for r in results.values())
  pids = {r["pid"] for runs in results.values() for r in runs}
  assert len(pids) == 6 and os.getpid() not in pids  # one fresh process per (round, child)
  for name, runs in results.items():
    for r in runs:
      assert r["calls_made"] == 5 and len(r["samples"]) == 3 and len(r["warmup"]) == 2
      assert r["setting"] == name.lower() and r["unset"] is None
  assert harness.round_medians(results["A"]) == [r["median"] for r in results["A"]]


def test_a_failing_child_says_why(tmp_path):
  (tmp_path / "child_tool.py").write_text(CHILD)
  with pytest.raises(harness.ChildFailed, match="no such setting"):
    harness.run_child(harness.Child(str(tmp_path / "child_tool.py") + ":fails"))


WORKER = """
import sys, time
sys.path.insert(0, {tools!r})
import harness

channel = harness.Channel()
print("library noise goes to the log")
count = [0]

def ping():
  count[0] += 1
  return {{"pong": count[0]}}

def slow():
  time.sleep(30)
  return {{}}

cmd = channel.serve({{"ping": ping, "slow": slow}})
if cmd == "crash":
  sys.exit(3)
"""


def test_worker_answers_commands_and_reports_its_end(tmp_path):
  script = tmp_path / "worker.py"
  script.write_text(WORKER.format(tools=os.path.join(ROOT, "tools")))
  w = harness.Worker([sys.executable, str(script)], log_path=str(tmp_path / "w.log"))
  assert w.ask("ping") == {"pong": 1} and w.ask("ping") == {"pong": 2}
  with pytest.raises(harness.WorkerExited) as e:
    w.ask("crash")
  assert e.value.returncode == 3 and "library noise" in e.value.log_tail
  w.close()
  late = harness.Worker([sys.executable, str(script)], log_path=str(tmp_path / "late.log"),
                        deadline=time.time() + 1.0)  # fmt: skip
  with pytest.raises(harness.WorkerTimeout):
    late.ask("slow")
  assert late.proc.poll() is not None  # stopped
  late.close()


def test_environment_record(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_some_flag=1")
  monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
  monkeypatch.setenv("HF_TOKEN", "hf_secret")
  monkeypatch.setenv("SOME_UNRELATED_VARIABLE", "1")
  env = harness.environment(packages=("no-such-package-xyz",), devices="none")
  assert set(env) == {"date_utc", "git", "machine", "python", "packages", "jax", "env"}
  assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", env["date_utc"])
  head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True)
  assert env["git"]["commit"] == head.stdout.strip() and len(env["git"]["commit"]) == 40
  assert isinstance(env["git"]["dirty"], bool)
  m = env["machine"]
  assert m["cores"] == os.cpu_count() and 1 <= m["usable_cores"] <= m["cores"]
  assert m["memory_bytes"] > 2**28 and m["cpu_model"] and len(m["load_avg"]) == 3
  assert env["python"] == platform.python_version()
  for name in ("jax", "jaxlib"):
    assert env["packages"][name] == importlib.metadata.version(name)
  assert env["packages"]["no-such-package-xyz"] is None
  assert env["env"]["XLA_FLAGS"] == "--xla_cpu_some_flag=1"
  assert env["env"]["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
  assert "HF_TOKEN" not in env["env"] and "SOME_UNRELATED_VARIABLE" not in env["env"]
  assert env["jax"] is None
  line = harness.header(env)
  assert line.startswith("# " + env["date_utc"][:10]) and env["git"]["commit"][:10] in line


def test_jax_devices_here_and_without_git(tmp_path):
  import jax

  devices = harness.jax_devices("here")
  assert devices["platform"] == jax.default_backend()
  assert devices["device_count"] == jax.device_count() == len(devices["devices"])
  assert harness.git_state(str(tmp_path)) == {"commit": None, "dirty": None}


def test_json_round_trip(tmp_path):
  env = harness.environment(devices="none")
  row = {"a": 1.5, "f32": np.float32(2.0), "arr": np.arange(3), "t": harness.Timing([1.0, 3.0])}
  results = {"settings": {"rounds": 2}, "rows": [row]}
  path = tmp_path / "out" / "bench.json"
  doc = harness.write_json(str(path), results, env, tool="tools/x.py", argv=["--rounds", "2"])
  back = harness.read_json(str(path))
  assert back == json.loads(json.dumps(doc, default=harness._jsonable))
  assert list(back) == ["tool", "argv", "environment", "settings", "rows"]
  assert back["tool"] == "tools/x.py" and back["argv"] == ["--rounds", "2"]
  assert back["environment"] == json.loads(json.dumps(env))
  row = back["rows"][0]
  assert row["f32"] == 2.0 and row["arr"] == [0, 1, 2] and row["t"]["samples"] == [1.0, 3.0]
  with pytest.raises(ValueError, match="environment"):
    harness.document({"environment": 1}, env)


def test_ratio_summary_and_tables():
  s = harness.ratio_summary([2.0, 3.0, 6.0], [1.0, 2.0, 4.0])
  assert s == {"ratios": [2.0, 1.5, 1.5], "min": 1.5, "median": 1.5, "max": 2.0}
  assert harness.ratio_text(s) == "1.50x (1.50-2.00)"
  assert harness.ratio_text(s, fmt=".3f", suffix="") == "1.500 (1.500-2.000)"
  assert harness.ratio_text(harness.ratio_summary([5.0], [4.0])) == "1.25x"  # one round: no range
  with pytest.raises(ValueError):
    harness.ratio_summary([1.0, 2.0], [1.0])
  assert harness.spread_text([3.0, 1.0, 2.0]) == "2.000 (1.000-3.000)"
  assert harness.round_medians([{"samples": [1.0, 5.0, 3.0]}, {"samples": [2.0, 4.0]}]) == [3, 3]
  assert harness.markdown_table(["a", "b"], [[1, "x"], [2.5, ""]]) == textwrap.dedent("""\
    | a | b |
    |---|---|
    | 1 | x |
    | 2.5 |  |""")


def test_common_flags():
  import argparse

  p = harness.add_common_args(argparse.ArgumentParser(), rounds=3, warmup=1)
  assert vars(p.parse_args([])) == {"rounds": 3, "warmup": 1, "json_out": ""}
  args = p.parse_args(["--rounds", "5", "--warmup", "0", "--json-out", "x.json"])
  assert (args.rounds, args.warmup, args.json_out) == (5, 0, "x.json")
  only_json = harness.add_common_args(argparse.ArgumentParser())
  assert vars(only_json.parse_args([])) == {"json_out": ""}
