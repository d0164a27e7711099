"""Verdict forging against the code sandbox (issue 18): wrong programs that try to make their tests
pass (or their zero an excluded failure), expected values that must never enter the sandbox, and
right answers in many shapes that must pass."""

import numpy as np
import pytest
import sandbox_util

from rlvr_jax import rewards
from rlvr_jax.rewards.code_sandbox import SandboxLimits

pytestmark = sandbox_util.NEEDS_STRONG_SANDBOX
FAST, run_python = sandbox_util.FAST, sandbox_util.run_python


# --- verdict forging ----------------------------------------------------------------------------


FORGERS = {
  "eq_always_true": (
    "class Any:\n  def __eq__(self, other):\n    return True\n  __hash__ = object.__hash__\n"
    "def sq(x):\n  return Any()\n"
  ),
  "int_subclass": (
    "class I(int):\n  def __eq__(self, other):\n    return True\n  __hash__ = int.__hash__\n"
    "def sq(x):\n  return I(0)\n"
  ),
  "patched_builtins": (
    "import builtins\nbuiltins.abs = lambda x: 0\nbuiltins.isinstance = lambda *a: True\n"
    "builtins.all = lambda *a: True\ndef sq(x):\n  return -1\n"
  ),
  "rewrite_test_lists": (
    "import gc\n"
    "for obj in gc.get_objects():\n"
    "  if isinstance(obj, list):\n"
    "    for i, v in enumerate(obj):\n"
    "      if isinstance(v, str) and 'assert' in v:\n"
    "        obj[i] = 'assert True'\n"
    "      elif isinstance(v, str) and v.startswith('sq('):\n"
    "        obj[i] = '1'\n"
    "def sq(x):\n  return -1\n"
  ),
  "forged_result_lines": (
    "import os\n"
    "for fd in range(3, 30):\n"
    "  for line in (b'[0, 0, [\"B\", true]]\\n', b'0 1 1\\n', b'{\"passed\": [1, 1, 1]}\\n'):\n"
    "    try:\n      os.write(fd, line)\n    except OSError:\n      pass\n"
    "def sq(x):\n  return -1\n"
  ),
  "exit_early": "import os\nos._exit(0)\n",
  "raise_in_probe": "def sq(x):\n  raise SystemExit(0)\n",
}


@pytest.mark.parametrize("name", sorted(FORGERS))
def test_wrong_programs_cannot_forge_a_pass(name):
  tests = [
    "assert sq(987654321) == 975461057789971041",
    "assert abs(sq(3) - 9) < 1e-9",
    "assert isinstance(sq(4), int) and sq(4) == 16",
  ]
  result = run_python(FORGERS[name], tests=tests)
  assert result.test_passed == (False, False, False), (name, result.stderr[-500:])


def test_a_program_cannot_turn_its_zero_into_an_excluded_failure():
  # Failed items get NaN and leave the advantage estimate: a wrong program that imitates a broken
  # sandbox (its exit code and message) must still score 0, not fail the item.
  program = "import sys\nsys.stderr.write('sandbox: unshare failed')\nsys.exit(97)\n"
  reward = rewards.CodeReward(limits=FAST)
  out = reward.evaluate(["q"], [program], tests=[["assert sq(2) == 4"]])
  np.testing.assert_array_equal(out.rewards, [0.0])


def test_expected_values_never_enter_the_sandbox():
  # The program searches everything its interpreter holds (objects, frames) for the test's
  # expected value (built at run time, so its own constants do not contain it): it is not there,
  # while the probe it is asked to evaluate is.
  program = (
    "import gc, sys\n"
    "needles = {'expected': str(int('1000000020') + 1), 'probe': ''.join(['sq(3141', '5)'])}\n"
    "me = globals()\n"
    "hits = dict.fromkeys(needles, 0)\n"
    "def scan(obj):\n"
    "  try:\n"
    "    text = repr(obj)\n"
    "  except Exception:\n"
    "    return\n"
    "  for name, needle in needles.items():\n"
    "    hits[name] += needle in text\n"
    "def sq(x):\n"
    "  for obj in gc.get_objects():\n"
    "    if obj is not me and obj is not needles and obj is not hits:\n"
    "      scan(obj)\n"
    "  frame = sys._getframe()\n"
    "  while frame:\n"
    "    if frame.f_locals is not me:\n"
    "      scan(frame.f_locals)\n"
    "    frame = frame.f_back\n"
    "  print(hits)\n"
    "  return x * x\n"
  )
  limits = SandboxLimits(timeout_s=20.0, cpu_s=20)
  result = run_python(program, tests=["assert sq(31415) == 1000000021"], limits=limits)
  hits = eval(result.stdout)  # noqa: S307  (our own test output)
  assert hits["probe"] > 0 and hits["expected"] == 0, hits
  assert result.test_passed == (False,)


def test_right_answers_in_many_shapes_pass():
  program = (
    "import collections, itertools\n"
    "def sq(x):\n  return x * x\n"
    "def pair(x):\n  return (x, [x], {x: {x}})\n"
    "def gen(n):\n  return (i for i in range(n))\n"
    "def text():\n  return '  hi  '\n"
    "def counts(s):\n  return collections.Counter(s)\n"
    "class Solution:\n  def two(self, x):\n    return [x, x]\n"
    "def big():\n  return 10 ** 5000\n"
  )
  tests = [
    "assert sq(3) == 9",
    "assert pair(2) == (2, [2], {2: {2}})",
    "assert list(gen(3)) == [0, 1, 2]",
    "assert text().strip() == 'hi'",
    "assert counts('aab') == {'a': 2, 'b': 1}",
    "assert Solution().two(5) == [5, 5]",
    "assert big() == 10 ** 5000",
    "assert math.isclose(sq(0.1), 0.01)",
    "assert not sq(0)\nassert sq(2) != 5",
  ]
  result = run_python(program, tests=tests)
  assert result.test_passed == (True,) * len(tests), result.stderr
