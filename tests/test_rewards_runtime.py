"""RewardRuntime: adversarial items finish within their timeout and leave the pool working;
order and determinism do not depend on the number of workers; failures are recorded and counted."""

import ctypes
import functools
import os
import threading
import time

import numpy as np
import pytest

from rlvr_jax import rewards
from rlvr_jax.rewards.runtime import RewardRuntime

TIMEOUT_S = 1.5


# Reward functions must be importable by the workers: module level.
def length_reward(prompts, completions, **fields):
  return np.array([len(c) % 7 for c in completions], dtype=np.float32)


def adversarial_reward(prompts, completions, **fields):
  kind = completions[0]
  if kind == "hang":
    while True:
      pass
  if kind == "segfault":
    ctypes.string_at(0)
  if kind == "exit":
    os._exit(3)
  if kind == "raise":
    raise ValueError("reward function bug")
  if kind == "alloc":
    block = bytearray(10 * 2**30)  # 10 GB
    return np.array([len(block)], np.float32)
  return np.array([float(len(c)) for c in completions], np.float32)


def scaled_reward(prompts, completions, *, scale, **fields):
  return np.array([scale * len(c) for c in completions], np.float32)


def group_mean_reward(prompts, completions, *, group_size, **fields):
  values = np.array([len(c) for c in completions], np.float64).reshape(-1, group_size)
  return (values - values.mean(-1, keepdims=True)).reshape(-1).astype(np.float32)


@pytest.fixture(scope="module")
def runtime():
  with RewardRuntime(num_workers=2, timeout_s=TIMEOUT_S, memory_limit_bytes=2 << 30) as rt:
    yield rt


def test_adversarial_items_fail_with_cause_and_pool_survives(runtime):
  kinds = ["ok", "hang", "abc", "segfault", "exit", "raise", "alloc", "", "zz"]
  start = time.monotonic()
  result = runtime.run(adversarial_reward, [""] * len(kinds), kinds)
  elapsed = time.monotonic() - start
  # One timeout at most per worker in flight, plus respawns: far below the sum of bad items.
  assert elapsed < 4 * TIMEOUT_S + 6
  causes = {f.index: f.cause for f in result.failures}
  assert causes == {1: "timeout", 3: "crash", 4: "crash", 5: "exception", 6: "memory"}
  messages = {f.index: f.message for f in result.failures}
  assert (
    "SIGSEGV" in messages[3] and "code 3" in messages[4] and "reward function bug" in messages[5]
  )
  np.testing.assert_array_equal(result.failed, [i in causes for i in range(len(kinds))])
  expected_ok = {0: 2.0, 2: 3.0, 7: 0.0, 8: 2.0}
  for i, value in expected_ok.items():
    assert result.rewards[i] == value
  assert np.isnan(result.rewards[list(causes)]).all()
  assert result.metrics["reward/fail/timeout"] == 1 and result.metrics["reward/fail/crash"] == 2
  assert result.metrics["reward/fail/exception"] == 1 and result.metrics["reward/fail/memory"] == 1
  assert result.metrics["reward/fail_frac"] == pytest.approx(5 / 9)
  assert result.metrics["reward/mean"] == pytest.approx(np.mean(list(expected_ok.values())))
  # The pool still works, with all workers alive.
  again = runtime.run(length_reward, ["p"] * 20, ["x" * i for i in range(20)])
  np.testing.assert_array_equal(again.rewards, [i % 7 for i in range(20)])
  assert not again.failures


def test_failure_value_is_the_callers_choice():
  with RewardRuntime(num_workers=1, timeout_s=TIMEOUT_S, failure_value=-5.0) as rt:
    result = rt.run(adversarial_reward, ["", ""], ["raise", "ab"])
  np.testing.assert_array_equal(result.rewards, [-5.0, 2.0])
  assert result.failures[0].cause == "exception"


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_order_and_values_independent_of_workers(num_workers):
  rng = np.random.default_rng(0)
  completions = ["y" * int(n) for n in rng.integers(0, 50, size=101)]
  fn = functools.partial(scaled_reward, scale=0.5)
  with RewardRuntime(num_workers=num_workers, timeout_s=10.0, max_chunk=7) as rt:
    result = rt.run(fn, [""] * 101, completions, scale_unused=[0] * 101)
  np.testing.assert_array_equal(result.rewards, [0.5 * len(c) for c in completions])


def test_math_reward_same_under_1_and_2_workers_and_in_process():
  answers = ["1/2", "3", "\\sqrt{2}", "10", "x+1", "5", "7", "4", "\\sqrt{2}", "10"] * 2
  completions = [
    "\\boxed{0.5}",
    "so 3",
    "\\boxed{2^{1/2}}",
    "\\boxed{11}",
    "\\boxed{1+x}",
    "",
    "\\boxed{",
    "the answer is 4",
    "\\boxed{\\frac{\\sqrt{2}}{1}}",
    "10.0",
  ] * 2
  expected = rewards.MathReward()(["q"] * 20, completions, answer=answers)
  for num_workers in (1, 2):
    with RewardRuntime(num_workers=num_workers, timeout_s=20.0) as rt:
      result = rt.run(rewards.MathReward(), ["q"] * 20, completions, answer=answers)
    np.testing.assert_array_equal(result.rewards, expected)
    np.testing.assert_array_equal(result.info["correct"], expected)
  # Unmarked answers ("so 3", "10.0") count only with fallback="last_number".
  np.testing.assert_array_equal(expected[:10], [1, 0, 1, 0, 1, 0, 0, 1, 1, 0])


def test_math_verify_hang_is_a_counted_timeout(runtime):
  # 9^(9^(9^9)) sends sympy into a practically endless big-integer evaluation.
  reward = rewards.MathReward(verify_timeout_s=0.5)
  completions = ["\\boxed{9^{9^{9^{9}}}}", "\\boxed{2}"]
  # Load and warm the workers first (warm-up runs math-verify once per kind, seconds under load):
  # the bound below is about the hang, not about the workers' start.
  runtime.run(reward, ["q"] * 4, ["\\boxed{1}"] * 4, answer=["1"] * 4)
  start = time.monotonic()
  result = runtime.run(reward, ["q", "q"], completions, answer=["7", "2"])
  assert time.monotonic() - start < TIMEOUT_S + 5
  assert [f.cause for f in result.failures] == ["timeout"]
  assert result.failures[0].index == 0
  assert np.isnan(result.rewards[0]) and result.rewards[1] == 1.0


def test_malformed_completions(runtime):
  completions = [
    "",
    "\x00\xff\ufffd garbage \\boxed{",
    b"\x00\xff\xfe\x80 raw bytes \\boxed{4}",
    "9" * 1_000_000,  # 1 MB
    "\\boxed{" * 2000,
    "<think>" * 100_000,
    "\\boxed{4}",
  ]
  reward = rewards.CombinedReward({"math": rewards.MathReward(), "format": rewards.FormatReward()})
  start = time.monotonic()
  result = runtime.run(reward, ["q"] * 7, completions, answer=["4"] * 7)
  assert time.monotonic() - start < 10
  assert not result.failures
  np.testing.assert_array_equal(result.info["correct"], [0, 0, 1, 0, 0, 0, 1])
  assert result.metrics["reward/math/mean"] == pytest.approx(2 / 7)
  assert result.metrics["reward/format/mean"] == 0.0


def test_array_fields_are_sent_as_plain_lists(runtime):
  lengths = np.array([3, 4], dtype=np.int32)
  result = runtime.run(
    rewards.OverlongReward(max_len=4, buffer_len=2),
    ["q"] * 2,
    ["a", "b"],
    completion_lengths=lengths,
    group_size=np.int64(2),
  )
  np.testing.assert_allclose(result.rewards, [-0.5, -1.0])


def test_submit_from_non_main_thread_and_concurrent_jobs(runtime):
  results = {}

  def worker(name, n):
    fut = runtime.submit(length_reward, ["p"] * n, ["a" * i for i in range(n)])
    results[name] = fut.result()

  threads = [threading.Thread(target=worker, args=(f"t{i}", 10 + i)) for i in range(3)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=60)
  for i in range(3):
    np.testing.assert_array_equal(results[f"t{i}"].rewards, [j % 7 for j in range(10 + i)])


def test_group_granularity_and_group_failure(runtime):
  completions = ["a", "abc", "ab", "abcd"]
  result = runtime.run(group_mean_reward, ["p"] * 4, completions, granularity="group", group_size=2)
  np.testing.assert_allclose(result.rewards, [-1, 1, -1, 1])
  bad = runtime.run(
    adversarial_reward, ["p"] * 4, ["raise", "a", "b", "c"], granularity="group", group_size=2
  )
  # A plain function at group granularity fails as a whole group.
  assert [f.index for f in bad.failures] == [0, 1]
  np.testing.assert_array_equal(bad.rewards[2:], [1.0, 1.0])


def test_bad_inputs_raise_clear_errors(runtime):
  with pytest.raises(ValueError, match="answer.*3 rows, expected B=2"):
    runtime.submit(rewards.MathReward(), ["a", "b"], ["c", "d"], answer=["1", "2", "3"])
  with pytest.raises(ValueError, match="whole number of groups"):
    runtime.submit(length_reward, ["a"] * 3, ["c"] * 3, group_size=2)
  with pytest.raises(TypeError, match="picklable"):  # lambdas are fine (cloudpickle), locks not
    runtime.submit(functools.partial(length_reward, lock=threading.Lock()), ["a"], ["b"])
  with pytest.raises(ValueError, match="num_workers"):
    RewardRuntime(0)


class _Unloadable:
  """Pickles fine here, fails to unpickle in a worker (like a module missing there)."""

  def __reduce__(self):
    return (_raise_on_load, ())

  def __call__(self, prompts, completions, **fields):
    return np.zeros(len(completions), np.float32)


def _raise_on_load():
  raise ImportError("module only importable in the parent")


def test_unloadable_reward_fn_raises_and_pool_recovers(runtime):
  with pytest.raises(RuntimeError, match="could not be loaded.*only importable in the parent"):
    runtime.run(_Unloadable(), ["p"] * 40, ["c"] * 40)
  result = runtime.run(length_reward, ["p"] * 3, ["a", "bb", "ccc"])
  np.testing.assert_array_equal(result.rewards, [1, 2, 3])


def jax_loaded_reward(prompts, completions, **fields):
  import sys

  return np.array([float("jax" in sys.modules)] * len(completions), np.float32)


def test_workers_and_rewards_package_never_import_jax(runtime):
  import subprocess
  import sys

  # The parent (this test process) has jax loaded; forkserver workers start clean.
  assert "jax" in sys.modules
  result = runtime.run(jax_loaded_reward, ["p"], ["c"])
  np.testing.assert_array_equal(result.rewards, [0.0])
  code = "import sys, rlvr_jax.rewards as r; r.MathReward(); print('jax' in sys.modules)"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "False"


def test_script_main_is_not_reimported_unless_needed(tmp_path):
  import subprocess
  import sys

  script = tmp_path / "train_like.py"
  script.write_text(
    "import sys\n"
    f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
    "import jax  # a trainer script imports jax at the top\n"
    "import numpy as np\n"
    "from rlvr_jax.rewards import RewardRuntime\n"
    "from test_rewards_runtime import jax_loaded_reward\n"
    "def local_reward(prompts, completions, **fields):\n"
    "  return np.array([7.0] * len(completions), np.float32)\n"
    "if __name__ == '__main__':\n"
    "  with RewardRuntime(num_workers=1, timeout_s=30.0) as rt:\n"
    "    print(rt.run(jax_loaded_reward, ['p'], ['c']).rewards[0])\n"
    "    print(rt.run(local_reward, ['p'], ['c']).rewards[0])\n"
  )
  out = subprocess.run(
    [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True
  )
  # jax is not in the worker for a reward from a jax-free module; a reward defined in the
  # script's __main__ still works (the worker then imports the script once, on demand).
  assert out.stdout.split() == ["0.0", "7.0"]


def test_workers_that_cannot_start_raise_instead_of_hanging(monkeypatch):
  from rlvr_jax.rewards import runtime as runtime_module

  monkeypatch.setattr(runtime_module, "_WORKER_CMD", "import os; os._exit(5)")
  start = time.monotonic()
  with RewardRuntime(num_workers=1, timeout_s=1.0) as rt:
    with pytest.raises(RuntimeError, match="die while starting.*code 5"):
      rt.run(length_reward, ["p"], ["c"])
  assert time.monotonic() - start < 20
