"""Rewards defined interactively (a notebook cell, ``python -c``, stdin, a script's ``__main__``)
are sent to the worker processes by value (cloudpickle) and keep the runtime's isolation and
timeouts. Each case runs in a fresh interpreter whose ``__main__`` defines the reward."""

import os
import subprocess
import sys

import numpy as np
import pytest

from rlvr_jax.rewards import RewardRuntime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What a notebook cell would hold: a function, an ItemReward subclass, a closure over a global,
# all in __main__, plus a reward that hangs. Module-level code appends to a log, so a worker
# that re-ran __main__ would show up as a second line.
NOTEBOOK = """
import dataclasses, os, sys, time
import numpy as np
from rlvr_jax import rewards

with open(os.environ["MAIN_RUNS_LOG"], "a") as f:
  f.write(f"{os.getpid()}\\n")

SCALE = 3.0

def count_a(prompts, completions, **fields):
  return np.array([SCALE * c.count("a") for c in completions], np.float32)

@dataclasses.dataclass(frozen=True)
class EndsWith(rewards.ItemReward):
  suffix: str = "!"
  def score_item(self, prompt, completion, **row):
    return {"reward": float(completion.endswith(self.suffix)), "pid": os.getpid()}
  def combine(self, scores, **fields):
    out = super().combine(scores, **fields)
    out.info["pid"] = np.array([np.nan if s is None else s["pid"] for s in scores])
    return out

def hang_on_x(prompts, completions, **fields):
  if "x" in completions[0]:
    time.sleep(600)
  return np.ones(1, np.float32)

completions = ["aa", "b!", "a!", "xa"]
with rewards.RewardRuntime(num_workers=2, timeout_s=2.0) as rt:
  r1 = rt.run(count_a, ["p"] * 4, completions)
  r2 = rt.run(EndsWith(), ["p"] * 4, completions)
  r3 = rt.run(rewards.CombinedReward({"a": count_a, "end": EndsWith()}), ["p"] * 4, completions)
  r4 = rt.run(hang_on_x, ["p"] * 4, completions)
  r5 = rt.run(lambda p, c, **f: np.array([len(c[0])], np.float32), ["p"] * 4, completions)
print("R1", *r1.rewards)
print("R2", *r2.rewards)
print("PIDS", *sorted(set(int(p) for p in r2.info["pid"])), "MAIN", os.getpid())
print("R3", *r3.rewards, r3.metrics["reward/a/mean"], r3.metrics["reward/end/mean"])
print("R4", *r4.rewards, [(f.index, f.cause) for f in r4.failures])
print("R5", *r5.rewards)
"""


def _run(args, tmp_path, stdin=None):
  env = dict(os.environ, PYTHONPATH=ROOT, MAIN_RUNS_LOG=str(tmp_path / "main_runs.log"))
  out = subprocess.run(
    args, input=stdin, capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path
  )
  assert out.returncode == 0, out.stderr[-3000:]
  lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
  return lines, (tmp_path / "main_runs.log").read_text().split()


def _check(lines, main_runs):
  assert lines["R1"].split() == ["6.0", "0.0", "3.0", "3.0"]
  assert lines["R2"].split() == ["0.0", "1.0", "1.0", "0.0"]
  pids, main = lines["PIDS"].split("MAIN")
  assert main.split()[0] not in pids.split()  # scored in worker processes, not in __main__
  assert lines["R3"].split() == ["6.0", "1.0", "4.0", "3.0", "3.0", "0.5"]
  r4 = lines["R4"].split(" ", 4)
  assert r4[:3] == ["1.0", "1.0", "1.0"] and r4[3] == "nan"
  assert r4[4] == "[(3, 'timeout')]"  # the hanging __main__ reward is killed and counted
  assert lines["R5"].split() == ["2.0"] * 4
  assert len(main_runs) == 1  # __main__ ran once: the workers never re-imported it


@pytest.mark.parametrize("how", ["stdin", "python_c"])
def test_rewards_defined_in_an_interactive_main_are_scored_in_workers(how, tmp_path):
  if how == "stdin":  # no file behind __main__, like a notebook kernel
    lines, runs = _run([sys.executable, "-"], tmp_path, stdin=NOTEBOOK)
  else:
    lines, runs = _run([sys.executable, "-c", NOTEBOOK], tmp_path)
  _check(lines, runs)


def test_rewards_defined_in_a_script_main_are_sent_by_value(tmp_path):
  script = tmp_path / "notebook_like.py"
  script.write_text(NOTEBOOK)
  _check(*_run([sys.executable, str(script)], tmp_path))


CONFIG_MAIN = """
import numpy as np
from rlvr_jax import rewards
from rlvr_jax.train import build, config, reward_config

def shout(prompts, completions, *, bonus=0.0, **fields):
  return np.array([float(c.isupper()) + bonus for c in completions], np.float32)

c = config.tiny_config("unused")
c.reward.name = ""
c.reward.components.shout = reward_config.reward_component(fn="__main__:shout", bonus=0.5)
c.reward.components.short = reward_config.reward_component("overlong", weight=2.0)
config.validate(c)
with rewards.RewardRuntime(num_workers=1, timeout_s=10.0) as rt:
  r = rt.run(build.build_reward(c), ["p"] * 3, ["AB", "ab", "A"], completion_lengths=[3, 2, 1])
print("R", *r.rewards)
"""


def test_a_main_reward_selected_from_the_config(tmp_path):
  # fn="__main__:shout": a notebook's own function, by import path, sent by value.
  env = dict(os.environ, PYTHONPATH=ROOT)
  out = subprocess.run(
    [sys.executable, "-"], input=CONFIG_MAIN, capture_output=True, text=True, timeout=180, env=env
  )
  assert out.returncode == 0, out.stderr[-3000:]
  # overlong with L = max_new_tokens = 3, buffer 1: 0 up to 2 tokens, -1 at 3; weight 2.
  assert out.stdout.split()[-3:] == ["-0.5", "0.5", "1.5"]


def test_lambdas_and_closures_reach_the_workers():
  offset = np.float32(0.25)
  with RewardRuntime(num_workers=1, timeout_s=10.0) as rt:
    res = rt.run(lambda p, c, **f: np.array([len(c[0]) + offset]), ["p"] * 2, ["a", "abc"])
  np.testing.assert_array_equal(res.rewards, [1.25, 3.25])
