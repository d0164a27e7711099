"""Hostile programs against the code sandbox and the reward runtime (issue 18).

Each test is an attack a reward-hacking policy could write: escape (processes outliving the run,
system calls, privileges), persistence (files outliving the run), cross-talk between concurrent
programs, information disclosure and resource exhaustion; a killed worker leaves nothing behind.
Verdict forging is in tests/test_sandbox_forging.py, the runtime's budgets in
tests/test_sandbox_runtime_budgets.py. Assertions look at the host: process tables, files, sockets."""

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import numpy as np
import pytest
import sandbox_util

from rlvr_jax import rewards
from rlvr_jax.rewards import code_sandbox
from rlvr_jax.rewards.code_sandbox import SandboxLimits

pytestmark = sandbox_util.NEEDS_STRONG_SANDBOX
CAPS, FAST, run_python = sandbox_util.CAPS, sandbox_util.FAST, sandbox_util.run_python
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sandbox_uid(result) -> int:
  return int(result.stdout.split("UID=")[1].split()[0])


# --- escape: processes that try to outlive the run ---------------------------------------------


def test_setsid_daemon_dies_with_the_run():
  # The attack of the issue: leave the process group, sleep, act later.
  program = (
    "import os, sys, time\n"
    "print('UID=%d' % os.getuid(), flush=True)\n"
    "if os.fork() == 0:\n"
    "  os.setsid()\n"
    "  if os.fork() == 0:\n"  # double fork: reparented, its own session
    "    sys.stdout = open(os.devnull, 'w')\n"
    "    time.sleep(60)\n"
    "  os._exit(0)\n"
    "time.sleep(0.2)\n"
  )
  result = run_python(program)
  assert result.status == "ok"
  uid = sandbox_uid(result)
  assert uid != 0 and uid != os.getuid()
  sandbox_util.assert_no_live_processes(uid)


def test_daemon_of_a_timed_out_program_dies():
  program = (
    "import os, time\n"
    "print('UID=%d' % os.getuid(), flush=True)\n"
    "try:\n"
    "  os.setsid()\n"  # the attack, verbatim (here the program already leads a session)
    "except OSError:\n"
    "  pass\n"
    "for _ in range(3):\n"
    "  if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    os.closerange(0, 10)\n"  # no pipe keeps the parent waiting: only the kill ends it
    "    time.sleep(60)\n"
    "time.sleep(60)\n"
  )
  start = time.monotonic()
  result = run_python(program, limits=SandboxLimits(timeout_s=1.0, cpu_s=2))
  assert result.status == "timeout" and time.monotonic() - start < 3.0
  sandbox_util.assert_no_live_processes(sandbox_uid(result))


def test_killed_worker_leaves_no_process_and_no_directory():
  # A reward worker SIGKILLed by the runtime mid-run: its sandbox must die too (parent-death
  # signals M -> I -> namespace) and nothing may stay on disk.
  program = (
    "import os, time\nprint('UID=%d' % os.getuid(), flush=True)\n"
    "open('/tmp/keep', 'w').write('x')\ntime.sleep(60)\n"
  )
  driver = (
    "import sys\n"
    "from rlvr_jax.rewards.code_sandbox import SandboxLimits, run_python\n"
    "r = run_python(sys.argv[1], limits=SandboxLimits(timeout_s=60, cpu_s=60))\n"
  )
  before = set(os.listdir(tempfile.gettempdir()))
  env = {**os.environ, "PYTHONPATH": REPO}
  proc = subprocess.Popen([sys.executable, "-c", driver, program], env=env, stdout=subprocess.PIPE)
  time.sleep(0.3)
  uid = None
  deadline = time.monotonic() + 20
  while uid is None and time.monotonic() < deadline:
    for candidate in os.listdir("/proc"):  # find the sandbox by its uid range
      try:
        with open(f"/proc/{candidate}/status") as f:
          real = int(next(x for x in f if x.startswith("Uid:")).split()[1])
      except (OSError, StopIteration, ValueError):
        continue
      if real >= code_sandbox.UID_BASE:
        with open(f"/proc/{candidate}/cmdline", "rb") as f:
          if b"_sandbox_harness" in f.read():
            uid = real
    time.sleep(0.05)
  assert uid is not None, "the sandboxed program never started"
  proc.kill()
  proc.wait()
  sandbox_util.assert_no_live_processes(uid)
  after = set(os.listdir(tempfile.gettempdir()))
  assert not [n for n in after - before if n.startswith("rlvr_sandbox") or n == "keep"]


# --- escape: privileges and system calls --------------------------------------------------------


def test_no_privileges_and_dangerous_system_calls_fail():
  program = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
status = dict(line.split(':', 1) for line in open('/proc/self/status'))
print('CapEff', status['CapEff'].strip(), 'NoNewPrivs', status['NoNewPrivs'].strip(),
      'Seccomp', status['Seccomp'].strip())
calls = {
  'unshare_user': lambda: libc.unshare(0x10000000),
  'mount': lambda: libc.mount(b'tmpfs', b'/tmp', b'tmpfs', 0, None),
  'chroot': lambda: libc.chroot(b'/tmp'),
  'ptrace_attach_1': lambda: libc.ptrace(16, 1, None, None),
  'keyctl': lambda: libc.syscall(250, 0, 0, 0, 0),
  'bpf': lambda: libc.syscall(321, 0, 0, 0),
  'setuid0': lambda: libc.setuid(0),
  'kill_init': lambda: libc.kill(1, 9),
}
for name, call in calls.items():
  print(name, call())
for path in ('/proc/1/root/etc', '/proc/1/environ', '/proc/1/mem'):
  try:
    os.listdir(path) if path.endswith('etc') else open(path, 'rb').read(10)
    print(path, 'READ')
  except OSError as e:
    print(path, 'denied', e.errno)
"""
  result = run_python(program)
  assert result.status == "ok", result.stderr
  lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
  assert lines["CapEff"].startswith("0000000000000000") and "NoNewPrivs 1" in lines["CapEff"]
  assert lines["CapEff"].endswith("Seccomp 2")
  for name in ("unshare_user", "mount", "chroot", "ptrace_attach_1", "keyctl", "bpf", "setuid0"):
    assert lines[name] == "-1", (name, lines[name])
  assert lines["kill_init"] == "-1"
  assert "READ" not in result.stdout


# --- persistence --------------------------------------------------------------------------------


def test_files_written_anywhere_do_not_outlive_the_run():
  marker = f"rlvr_marker_{uuid.uuid4().hex}"
  places = ["/tmp", "/var/tmp", "/dev/shm", "/sandbox", "/sandbox/.."]
  writer = (
    "import os\n"
    f"for d in {places!r}:\n"
    "  try:\n"
    f"    open(os.path.join(d, {marker!r}), 'w').write('persist')\n"
    "    print('wrote', d)\n"
    "  except OSError as e:\n"
    "    print('failed', d, e.errno)\n"
  )
  first = run_python(writer)
  assert first.stdout.count("wrote") == 4, first.stdout  # all scratch places but / are writable
  reader = (
    f"import os\nfor d in {places!r}:\n  print(os.path.exists(os.path.join(d, {marker!r})))\n"
  )
  second = run_python(reader)
  assert second.stdout.split() == ["False"] * len(places)
  for host_dir in ("/tmp", "/var/tmp", "/dev/shm", "/"):
    assert not os.path.exists(os.path.join(host_dir, marker))


# --- cross-talk between concurrent programs -----------------------------------------------------

HIJACK = r"""
import glob, os, threading, time
good = "def sq(x):\n  return x * x\n"
def hijack():
  end = time.time() + 2.5
  hits = 0
  while time.time() < end:
    for path in glob.glob('/tmp/rlvr_sandbox_*/solution.py') + glob.glob('/proc/*/root/sandbox/solution.py') + glob.glob('/proc/*/cwd/solution.py'):
      try:
        with open(path, 'w') as f:
          f.write(good)
        hits += 1
      except OSError:
        pass
    for pid in os.listdir('/proc'):
      if pid.isdigit() and int(pid) > 2:
        try:
          os.kill(int(pid), 9)
        except OSError:
          pass
    time.sleep(0.01)
  print('hits', hits)
hijack()
def sq(x):
  return x * x
"""


def test_a_program_cannot_change_another_programs_verdict():
  tests = [f"assert sq({i}) == {i * i}" for i in range(3)]
  wrong = "import time\ntime.sleep(0.3)\ndef sq(x):\n  return x + 1\n"
  good = "def sq(x):\n  return x * x\n"
  completions = [HIJACK, wrong, wrong, good, wrong, HIJACK, wrong, good]
  reward = rewards.CodeReward(limits=FAST, per_test_s=1.0)
  with rewards.RewardRuntime(num_workers=2, timeout_s=8.0, max_chunk=1) as runtime:
    result = runtime.run(reward, ["q"] * 8, completions, tests=[tests] * 8)
    later = runtime.run(reward, ["q"] * 2, [wrong, good], tests=[tests] * 2)
  assert not result.failures and not later.failures
  np.testing.assert_array_equal(result.rewards, [1, 0, 0, 1, 0, 1, 0, 1])
  np.testing.assert_array_equal(later.rewards, [0, 1])


def test_concurrent_fork_bomb_does_not_starve_another_program():
  # RLIMIT_NPROC counts per uid: with one shared uid a bomb would use up the other's budget.
  bomb = "import os\nwhile True:\n  try:\n    os.fork()\n  except OSError:\n    pass\n"
  forker = (
    "import os, time\ntime.sleep(0.5)\npids = []\n"
    "for _ in range(8):\n  pid = os.fork()\n  if pid == 0:\n    os._exit(0)\n  pids.append(pid)\n"
    "for p in pids:\n  os.waitpid(p, 0)\nprint('forked', len(pids))\n"
  )
  out = {}
  limits = SandboxLimits(timeout_s=2.5, cpu_s=3, max_processes=16)
  thread = threading.Thread(target=lambda: out.update(bomb=run_python(bomb, limits=limits)))
  thread.start()
  time.sleep(0.2)
  out["forker"] = run_python(forker, limits=limits)
  thread.join()
  assert out["forker"].stdout.strip() == "forked 8", out["forker"].stderr
  assert out["bomb"].status == "timeout"


def test_unix_sockets_outside_are_unreachable(tmp_path):
  paths = [str(tmp_path / "s.sock"), f"/tmp/rlvr_test_{uuid.uuid4().hex[:8]}.sock"]
  abstract = f"\0rlvr_test_{uuid.uuid4().hex[:8]}"
  servers = []
  for address in [*paths, abstract]:
    server = socket.socket(socket.AF_UNIX)
    server.bind(address)
    server.listen(4)
    server.settimeout(0.3)
    servers.append(server)
  program = (
    "import socket\n"
    f"for address in {[*paths, abstract]!r}:\n"
    "  s = socket.socket(socket.AF_UNIX)\n"
    "  try:\n"
    "    s.connect(address)\n"
    "    s.sendall(b'leak')\n"
    "    print('connected', repr(address))\n"
    "  except OSError as e:\n"
    "    print('refused', e.errno)\n"
  )
  try:
    result = run_python(program)
    for server in servers:
      with pytest.raises(TimeoutError):
        server.accept()
  finally:
    for server in servers:
      server.close()
    os.unlink(paths[1])
  assert "connected" not in result.stdout and result.stdout.count("refused") == 3


# --- information disclosure ---------------------------------------------------------------------


def test_host_processes_files_and_environment_are_invisible(tmp_path):
  secret = f"SECRET-{uuid.uuid4().hex}"
  readable = f"/tmp/rlvr_secret_{uuid.uuid4().hex[:8]}.txt"
  with open(readable, "w") as f:
    f.write(secret)
  os.chmod(readable, 0o644)  # world-readable on the host
  os.environ["RLVR_SECRET"] = secret
  program = f"""
import glob, os
print('PIDS', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))
for pid in os.listdir('/proc'):
  if pid.isdigit():
    try:
      print(open(f'/proc/{{pid}}/cmdline', 'rb').read())
      print(open(f'/proc/{{pid}}/environ', 'rb').read())
    except OSError:
      pass
for path in {[readable, REPO + "/pyproject.toml", "/etc/shadow", "/etc/hostname"]!r}:
  try:
    print(open(path).read())
  except OSError as e:
    print('missing', path, e.errno)
print('TOP', sorted(os.listdir('/')))
print('ENV', dict(os.environ))
for d in ('/work', '/home', '/root', '/proc/1/root', '/sys', '/run'):
  try:
    print(d, os.listdir(d))
  except OSError as e:
    print(d, 'error', e.errno)
"""
  try:
    result = run_python(program)
  finally:
    os.unlink(readable)
    del os.environ["RLVR_SECRET"]
  out = result.stdout
  assert secret not in out and "[project]" not in out, out
  pids = eval(out.split("PIDS ")[1].splitlines()[0])  # noqa: S307  (our own test output)
  assert pids == [1, 2]  # the namespace's init and the program, nothing of the host
  top = eval(out.split("TOP ")[1].splitlines()[0])  # noqa: S307
  assert "work" not in top and "home" not in top and "sys" not in top
  assert out.count("missing") == 4  # even a world-readable host file is not in the tree
  assert str(os.getpid()) not in out.split("PIDS")[1].split("TOP")[0].split("\n")[0]


# --- resource exhaustion ------------------------------------------------------------------------


def test_memory_across_many_processes_is_capped():
  # RLIMIT_AS is per process: 8 children of 300 MB each would use 2.4 GB without the cgroup.
  program = (
    "import os\npids = []\n"
    "for _ in range(8):\n"
    "  pid = os.fork()\n"
    "  if pid == 0:\n"
    "    block = bytearray(300 << 20)\n"
    "    block[::4096] = b'x' * len(block[::4096])\n"
    "    import time\n    time.sleep(1)\n    os._exit(0)\n"
    "  pids.append(pid)\n"
    "ok = sum(os.waitpid(p, 0)[1] == 0 for p in pids)\n"
    "print('children that kept 300 MB:', ok)\n"
  )
  limits = SandboxLimits(timeout_s=8.0, cpu_s=8, memory_bytes=1 << 30)
  result = run_python(program, limits=limits)
  kept = int(result.stdout.split(":")[1]) if ":" in result.stdout else 0
  assert kept * 300 <= 1024 + 64, result.stdout


def test_disk_is_bounded_by_the_scratch_tmpfs():
  program = (
    "import os\nwritten = 0\n"
    "try:\n"
    "  for i in range(100000):\n"
    "    with open(f'/dev/shm/f{i}', 'wb') as f:\n"
    "      f.write(b'x' * (1 << 20))\n"
    "    written += 1\n"
    "except OSError as e:\n"
    "  print('stopped', e.errno, written)\n"
  )
  result = run_python(
    program, limits=SandboxLimits(timeout_s=10.0, cpu_s=10, scratch_bytes=16 << 20)
  )
  assert result.stdout.startswith("stopped 28 ")  # ENOSPC
  assert int(result.stdout.split()[2]) <= 16


# --- refusing a weak sandbox; seccomp in children ---------------------------------------------


def test_weak_sandbox_is_refused_unless_accepted(monkeypatch, caplog):
  weak = {**CAPS, "namespaces": False, "missing": ("namespaces",), "strong": False}
  monkeypatch.setattr(code_sandbox, "sandbox_capabilities", lambda: weak)
  with pytest.raises(code_sandbox.WeakSandboxError, match="namespaces"):
    rewards.CodeReward()
  code_sandbox._warn_once.cache_clear()  # logged once per process and message
  with caplog.at_level("WARNING"):
    rewards.CodeReward(allow_weak_sandbox=True)
  assert "WEAK sandbox" in caplog.text and "namespaces" in caplog.text


def test_seccomp_filter_denies_user_namespaces_in_children_too():
  # clone() with namespace flags from a child process (Python's os.fork is a plain clone).
  program = (
    "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "  os._exit(0 if libc.unshare(0x10000000 | 0x20000) == -1 else 1)\n"
    "print('child denied', os.waitpid(pid, 0)[1] == 0)\n"
  )
  assert run_python(program).stdout.strip() == "child denied True"
