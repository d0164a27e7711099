"""The reward runtime's promises under the code sandbox (issue 18): a program's sandbox limits fit
inside the runtime's per-item budget, cold workers warm up before their first item, and worker
crashes lose only the crashing items. The attacks themselves are in tests/test_sandbox_attacks.py."""

import os
import time

import numpy as np
import pytest
import sandbox_util

from rlvr_jax import rewards
from rlvr_jax.rewards.code_sandbox import SandboxLimits

pytestmark = sandbox_util.NEEDS_STRONG_SANDBOX


def test_sandbox_limits_stay_inside_the_item_budget():
  # 3 stdio tests x 5 s per run against a 3 s item budget: the slow program fails its tests
  # inside the budget (reward 0, not a killed worker), the good one keeps full credit.
  slow = "import os, time\nprint('UID=%d' % os.getuid(), flush=True)\ntime.sleep(30)\n"
  good = "print(int(input()) * 2)\n"
  tests = [{"input": f"{i}\n", "output": f"{2 * i}\n"} for i in range(3)]
  reward = rewards.CodeReward(limits=SandboxLimits(timeout_s=5.0, cpu_s=5))
  start = time.monotonic()
  with rewards.RewardRuntime(num_workers=2, timeout_s=3.0) as runtime:
    result = runtime.run(reward, ["q"] * 2, [slow, good], tests=[tests] * 2)
    restarts = runtime.worker_restarts
  assert not result.failures and restarts == 0
  np.testing.assert_array_equal(result.rewards, [0.0, 1.0])
  assert time.monotonic() - start < 10


def test_cold_workers_lose_no_math_items():
  # math-verify's import (0.5-1 s cold) happens in the worker's warm-up, not in the first item.
  completions = [f"\\boxed{{(x+{a})^2}}" for a in range(1, 7)]
  answers = [f"x^2+{2 * a}x+{a * a}" for a in range(1, 7)]
  with rewards.RewardRuntime(num_workers=2, timeout_s=0.5) as runtime:
    result = runtime.run(rewards.MathReward(), ["q"] * 6, completions, answer=answers)
  assert not result.failures, result.failures
  np.testing.assert_array_equal(result.rewards, [1.0] * 6)


def crash_on_marker(prompts, completions, **fields):
  """Module level (workers import it): kills its worker on the marker, else 0."""
  if completions[0].endswith("CRASH"):
    os._exit(3)
  return np.zeros(1, np.float32)


@pytest.mark.slow
def test_two_thousand_math_items_with_worker_crashes_lose_no_good_item():
  # Every crash replaces a worker; each replacement warms math-verify before its first item, so
  # only the crashing items fail (the issue lost good items in 2 of 4 such runs).
  rng = np.random.default_rng(0)
  completions, answers, crash = [], [], []
  for i in range(2000):
    a = int(rng.integers(1, 40))
    form = i % 4
    if form == 0:
      completion, answer = f"\\boxed{{(x+{a})^2}}", f"x^2+{2 * a}x+{a * a}"
    elif form == 1:
      completion, answer = f"\\boxed{{\\sqrt{{{2 * a * a}}}}}", f"{a}\\sqrt{{2}}"
    elif form == 2:
      completion, answer = f"\\boxed{{{a}/{a + 1}}}", f"\\frac{{{a}}}{{{a + 1}}}"
    else:
      completion, answer = f"The answer is {a + 1}.", str(a)  # wrong on purpose
    is_crash = i % 250 == 7
    completions.append(completion + (" CRASH" if is_crash else ""))
    answers.append(answer)
    crash.append(is_crash)
  reward = rewards.CombinedReward({"math": rewards.MathReward(), "crash": crash_on_marker})
  with rewards.RewardRuntime(num_workers=2, timeout_s=1.0) as runtime:
    result = runtime.run(reward, ["q"] * 2000, completions, answer=answers)
    restarts = runtime.worker_restarts
  failed = {f.index for f in result.failures}
  assert failed == {i for i in range(2000) if crash[i]}, result.failures[:5]
  assert {f.cause for f in result.failures} == {"crash"} and restarts == len(failed)
  expected = np.array([float(i % 4 != 3) for i in range(2000)])
  ok = ~np.array(crash)
  np.testing.assert_array_equal(result.rewards[ok], expected[ok])
