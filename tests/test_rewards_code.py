"""Code sandbox and code reward: adversarial programs stay within their limits, the reward gives
partial credit, and the runtime keeps working."""

import os
import socket
import time

import numpy as np
import pytest
import sandbox_util

from rlvr_jax import rewards
from rlvr_jax.rewards import code_sandbox
from rlvr_jax.rewards.code_sandbox import SandboxLimits, sandbox_capabilities

CAPS = sandbox_capabilities()
WEAK = not CAPS["strong"]  # hosts without namespaces (not root): the tests accept the weak sandbox
FAST = SandboxLimits(timeout_s=2.0, cpu_s=2)


def run_python(*args, **kwargs):
  return code_sandbox.run_python(*args, allow_weak_sandbox=WEAK, **kwargs)


def test_infinite_loop_hits_wall_clock():
  start = time.monotonic()
  result = run_python("while True:\n  pass\n", limits=SandboxLimits(timeout_s=1.0, cpu_s=10))
  assert result.status == "timeout" and time.monotonic() - start < 3.0


def test_cpu_limit():
  result = run_python("while True:\n  pass\n", limits=SandboxLimits(timeout_s=10.0, cpu_s=1))
  assert result.status == "cpu_limit"


def test_segfault_and_huge_allocation():
  assert run_python("import ctypes\nctypes.string_at(0)\n", limits=FAST).status == "signal"
  result = run_python("block = bytearray(10 * 2**30)\nprint('allocated')\n", limits=FAST)
  assert result.status == "error" and "MemoryError" in result.stderr and not result.stdout


def test_output_is_capped():
  start = time.monotonic()
  # 100 MB of output against a 1 MB cap.
  code = "import sys\nfor _ in range(1600):\n  sys.stdout.write('x' * 65536)\n"
  result = run_python(code, limits=SandboxLimits(timeout_s=10.0, max_output_bytes=1 << 20))
  assert result.status == "output_limit"
  assert len(result.stdout) <= 1 << 20 and time.monotonic() - start < 5.0


def test_fork_bomb_is_bounded_and_cleaned_up():
  bomb = (
    "import os\nprint(os.getuid(), flush=True)\n"
    "while True:\n  try:\n    os.fork()\n  except OSError:\n    pass\n"
  )
  start = time.monotonic()
  result = run_python(bomb, limits=SandboxLimits(timeout_s=1.5, max_processes=16))
  assert result.status == "timeout" and time.monotonic() - start < 4.0
  uid = int(result.stdout.splitlines()[0])
  assert uid != os.getuid() or WEAK
  # every descendant was killed (zombies included: nothing is left to reap them late here)
  assert sandbox_util.processes_of_uid(uid, zombies=True) == {} or uid == os.getuid()


def test_file_size_limit():
  code = "open('big', 'wb').write(b'x' * (64 << 20))\n"
  result = run_python(code, limits=SandboxLimits(file_size_bytes=1 << 20))
  assert result.status == "error" and "File too large" in result.stderr


@pytest.mark.skipif(not CAPS["fresh_uid"], reason="needs root to run programs as another uid")
def test_cannot_read_owner_only_files(tmp_path):
  secret = tmp_path / "secret.txt"
  secret.write_text("TOKEN-123")
  os.chmod(secret, 0o600)
  result = run_python(f"print(open({str(secret)!r}).read())\n", limits=FAST)
  assert "TOKEN-123" not in result.stdout and result.status == "error"


@pytest.mark.skipif(not CAPS["private_root"], reason="needs a mount namespace")
def test_trainer_directory_is_hidden():
  # .../<project>/rlvr_jax/rewards/__init__.py -> <project>: not in the sandbox's file tree.
  project = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(rewards.__file__))))
  readme = os.path.join(project, "pyproject.toml")
  assert os.path.exists(readme)
  code = f"import os\nprint(os.listdir({project!r}))\nprint(open({readme!r}).read())\n"
  result = run_python(code, limits=FAST)
  assert result.stdout == "" and "FileNotFoundError" in result.stderr


def test_working_directory_and_environment_are_fresh():
  os.environ["RLVR_TEST_SECRET"] = "abc"
  try:
    code = "import os\nprint(sorted(os.listdir('.')))\nprint('RLVR_TEST_SECRET' in os.environ)\n"
    result = run_python(code, limits=FAST)
  finally:
    del os.environ["RLVR_TEST_SECRET"]
  assert result.stdout.split("\n")[:2] == ["['solution.py']", "False"]


@pytest.mark.skipif(not CAPS["namespaces"], reason="needs a network namespace")
def test_no_network():
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen(1)
  server.settimeout(0.2)
  port = server.getsockname()[1]
  code = (
    "import socket\n"
    f"s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
    "s.sendall(b'leak')\nprint('connected')\n"
  )
  try:
    result = run_python(code, limits=FAST)
    with pytest.raises(TimeoutError):
      server.accept()
  finally:
    server.close()
  assert "connected" not in result.stdout and result.status == "error"


def test_program_cannot_fake_results_by_exiting_early():
  code = "import os\nos._exit(0)\ndef f(x):\n  return x\n"
  result = run_python(code, tests=["assert f(1) == 1"], limits=FAST)
  assert result.status == "ok" and result.test_passed == (False,)


def test_code_reward_partial_credit_stdio_and_asserts():
  reward = rewards.CodeReward(limits=FAST, allow_weak_sandbox=WEAK)
  stdio_tests = [{"input": f"{i}\n", "output": f"{2 * i}\n"} for i in range(4)]
  assert_tests = ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(2, 2) == 5"]
  completions = [
    "```python\nprint(2 * int(input()))\n```",  # all 4 stdio tests
    "```python\nn = int(input())\nprint(0 if n < 2 else 2 * n)\n```",  # 0, 2*1 wrong -> 3 of 4
    "def add(a, b):\n  return a + b\n",  # 2 of 3 asserts (the third test is wrong on purpose)
    "def add(a, b):\n  while True:\n    pass\n",  # per-test timeouts: 0 of 3
  ]
  tests = [stdio_tests, stdio_tests, assert_tests, assert_tests]
  out = reward.evaluate(["q"] * 4, completions, tests=tests)
  np.testing.assert_allclose(out.rewards, [1.0, 0.75, 2 / 3, 0.0], atol=1e-6)
  np.testing.assert_array_equal(out.info["correct"], [1, 0, 0, 0])
  weighted = reward.evaluate(
    ["q"], completions[2:3], tests=[assert_tests], test_weights=[[1.0, 1.0, 2.0]]
  )
  np.testing.assert_allclose(weighted.rewards, [0.5])


def test_code_reward_verpo_in_runtime_with_adversarial_programs():
  tests = ["assert sq(2) == 4", "assert sq(3) == 9", "assert sq(-1) == 1"]
  completions = [
    "def sq(x):\n  return x * x\n",  # passes all
    "def sq(x):\n  return 2 * x\n",  # passes sq(2) only
    "import ctypes\nctypes.string_at(0)\n",  # segfault inside the sandbox: 0 passed, no failure
    "block = bytearray(10 * 2**30)\n",  # MemoryError inside the sandbox
  ]
  reward = rewards.CodeReward(limits=FAST, weighting="verpo", allow_weak_sandbox=WEAK)
  with rewards.RewardRuntime(num_workers=2, timeout_s=8.0) as runtime:
    result = runtime.run(reward, ["q"] * 4, completions, tests=[tests] * 4, group_size=4)
    assert not result.failures
    # Reference: rho = [0.5, 0.25, 0.25]; w_j proportional to 1 - rho_j + 1e-3.
    w = np.array([0.501, 0.751, 0.751]) / 2.003
    expected = [1 + 0.5 * w.sum(), 0.5 * w[0], 0.0, 0.0]
    np.testing.assert_allclose(result.rewards, expected, atol=1e-6)
    plain = rewards.CodeReward(limits=FAST, allow_weak_sandbox=WEAK)
    again = runtime.run(plain, ["q"], completions[:1], tests=[tests])
    np.testing.assert_array_equal(again.rewards, [1.0])


def test_adversarial_programs_through_the_pool_then_pool_still_works(tmp_path):
  secret = tmp_path / "secret.txt"
  secret.write_text("TOKEN")
  os.chmod(secret, 0o600)
  tests = ["assert ok() == 1"]
  programs = [
    "def ok():\n  while True:\n    pass\n",  # infinite loop inside the test
    "import os\nwhile True:\n  try:\n    os.fork()\n  except OSError:\n    pass\n",
    "import sys\nfor _ in range(1600):\n  sys.stdout.write('x' * 65536)\n",  # 100 MB
    "block = bytearray(10 * 2**30)\n",
    "import ctypes\nctypes.string_at(0)\n",
    f"data = open({str(secret)!r}).read()\ndef ok():\n  return 1\n",
    "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)\ndef ok():\n  return 1\n",
    "def ok():\n  return 1\n",
  ]
  limits = SandboxLimits(timeout_s=2.0, cpu_s=2)
  reward = rewards.CodeReward(limits=limits, per_test_s=1.0, allow_weak_sandbox=WEAK)
  start = time.monotonic()
  with rewards.RewardRuntime(num_workers=2, timeout_s=6.0) as runtime:
    result = runtime.run(reward, ["q"] * 8, programs, tests=[tests] * 8)
    assert time.monotonic() - start < 20
    assert not result.failures  # contained by the sandbox: no worker died or hung
    again = runtime.run(reward, ["q"], programs[-1:], tests=[tests])
  np.testing.assert_array_equal(again.rewards, [1.0])
  np.testing.assert_array_equal(result.rewards[[0, 1, 2, 3, 4, 7]], [0, 0, 0, 0, 0, 1])
  if CAPS["fresh_uid"]:
    assert result.rewards[5] == 0  # the owner-only file was unreadable
  if CAPS["namespaces"]:
    assert result.rewards[6] == 0  # no network


def test_harness_state_is_not_reachable_through_main_module():
  code = (
    "import os, __main__\n"
    "print(sorted(k for k in vars(__main__) if not k.startswith('__')))\n"
    "for fd in range(3, 20):\n"
    "  try:\n"
    "    os.write(fd, b'forged 0 1\\n')\n"
    "  except OSError:\n"
    "    pass\n"
    "def f():\n"
    "  return 0\n"
  )
  result = run_python(code, tests=["assert f() == 1"], limits=FAST)
  assert result.stdout.strip() == "['os']"  # the program's own module, nothing else
  assert result.test_passed == (False,)  # garbage on inherited descriptors decides nothing


@pytest.mark.skipif(not CAPS["fresh_uid"], reason="the weak path kills leftovers by uid (root)")
def test_weak_sandbox_path_still_decides_outside_and_kills_leftovers(monkeypatch):
  # Hosts without namespaces: same harness minus namespaces and private root, once accepted.
  weak = {**CAPS, "namespaces": False, "private_root": False, "missing": ("namespaces",)}
  monkeypatch.setattr(code_sandbox, "sandbox_capabilities", lambda: {**weak, "strong": False})
  with pytest.raises(code_sandbox.WeakSandboxError):
    code_sandbox.run_python("print(1)")
  program = (
    "import os, time\nprint(os.getuid(), flush=True)\n"
    "if os.fork() == 0:\n  os.setsid()\n  time.sleep(30)\n"
    "class Any:\n  def __eq__(self, other):\n    return True\n"
    "def f(x):\n  return Any() if x else 0\n"
  )
  result = code_sandbox.run_python(
    program, tests=["assert f(1) == 2", "assert f(0) == 0"], allow_weak_sandbox=True, limits=FAST
  )
  assert result.test_passed == (False, True)
  sandbox_util.assert_no_live_processes(int(result.stdout.split()[0]))


@pytest.mark.skipif(not CAPS["strong"], reason="needs the strong sandbox to degrade from")
def test_capabilities_name_the_missing_protection(monkeypatch):
  # A host whose cgroups cannot be written: the probe still finds the namespaces and says which
  # protection is missing, and code rewards refuse to run until it is accepted.
  monkeypatch.setattr(code_sandbox, "_cgroup_bases", lambda: ("v1", ["/nonexistent/rlvr"]))
  code_sandbox.sandbox_capabilities.cache_clear()
  try:
    caps = code_sandbox.sandbox_capabilities()
    assert caps["namespaces"] and caps["private_root"] and caps["missing"] == ("cgroup",)
    assert "cgroup" in caps["reason"]
    with pytest.raises(code_sandbox.WeakSandboxError, match="cgroup"):
      rewards.CodeReward()
  finally:
    code_sandbox.sandbox_capabilities.cache_clear()


def test_verdict_plan_splits_tests_and_rejects_what_it_cannot_check():
  from rlvr_jax.rewards import code_verdict

  plan = code_verdict.compile_tests(
    ["assert f(2) == 4", "assert abs(g(1.5) - 2.25) < 1e-9\nassert not h(0)", "assert s().strip()"]
  )
  assert plan.probes == [["f(2)"], ["g(1.5)", "h(0)"], ["s()"]]  # no expected value inside
  with pytest.raises(ValueError, match=r"test 1 .*GeneratorExp"):
    code_verdict.compile_tests(["assert f(1) == 1", "assert all(f(i) == i for i in range(3))"])
  with pytest.raises(ValueError, match=r"test 0 .*only `assert"):
    code_verdict.compile_tests(["x = f(1)"])
  raw = b'[0, 0, ["i", "0x4"]]\n[0, 0, ["i", "0x5"]]\nnot json\n[1, 0, ["f", "2.25"]]\n'
  values = code_verdict.parse_values(
    raw + b'[1, 1, ["E", "ValueError"]]\n[2, 0, ["s", " a "]]\n', [1, 2, 1]
  )
  assert values[0] == [4] and values[2] == [" a "]  # the first line per probe counts
  assert code_verdict.decide(plan, values) == [True, False, True]  # h(0) raised: test 1 fails
