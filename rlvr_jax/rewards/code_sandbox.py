"""Run model-written Python in a separate, limited process. Never ``exec`` it in the trainer.

Each program gets:
  * a fresh temporary working directory (removed afterwards) holding only ``solution.py``;
  * a scrubbed environment (PATH, HOME=TMPDIR=workdir, LANG, PYTHONHASHSEED=0 and nothing else),
    an isolated interpreter (``python -I -S``: no user site, no PYTHONPATH, no site-packages);
  * rlimits: CPU seconds, address space, file size, open files, process count, no core dumps;
  * a wall-clock timeout and an output cap (stdout + stderr), both enforced by the parent, which
    kills the whole process group (and the PID namespace, when available) on expiry;
  * where ``unshare`` works (root, or unprivileged user namespaces): new network and PID
    namespaces, so no network at all (not even loopback to the host) and every descendant dies
    with the sandbox, even one that called ``setsid``;
  * when the trainer runs as root: the program runs as ``nobody`` (uid 65534). This is what makes
    ``RLIMIT_NPROC`` effective (Linux does not apply it to root) and what makes owner-only files
    (mode 600/700, e.g. ``/root``) unreadable.
See docs/design.md (Rewards section) for what this does NOT protect against.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time

from rlvr_jax.rewards._sandbox_harness import HARNESS

NOBODY = 65534


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
  """Per-process limits. ``timeout_s`` is wall clock; ``cpu_s`` is RLIMIT_CPU; ``hidden_paths``
  are directories replaced by an empty tmpfs for the program (needs a mount namespace)."""

  timeout_s: float = 5.0
  cpu_s: int = 5
  memory_bytes: int = 1 << 30
  file_size_bytes: int = 8 << 20
  max_processes: int = 32
  max_open_files: int = 64
  max_output_bytes: int = 1 << 20
  hidden_paths: tuple[str, ...] | None = None  # None: default_hidden_paths()


@dataclasses.dataclass(frozen=True)
class SandboxResult:
  """status: "ok" (exit 0), "error" (non-zero exit), "signal" (killed by a signal, e.g. SIGSEGV),
  "cpu_limit" (RLIMIT_CPU reached), "timeout" (wall clock), "output_limit" (stdout + stderr over
  the cap)."""

  status: str
  returncode: int | None
  stdout: str
  stderr: str
  wall_s: float
  test_passed: tuple[bool, ...] | None = None


def _world_accessible(path: str) -> bool:
  """Whether an unprivileged user can execute ``path`` (every ancestor o+x, the file o+rx)."""
  path = os.path.realpath(path)
  try:
    if (os.stat(path).st_mode & (stat.S_IROTH | stat.S_IXOTH)) != (stat.S_IROTH | stat.S_IXOTH):
      return False
    parent = os.path.dirname(path)
    while parent and parent != "/":
      if not os.stat(parent).st_mode & stat.S_IXOTH:
        return False
      parent = os.path.dirname(parent)
  except OSError:
    return False
  return True


@functools.lru_cache(maxsize=1)
def sandbox_capabilities() -> dict:
  """What isolation this host allows (probed once per process)."""
  is_root = os.geteuid() == 0
  unshare = shutil.which("unshare")
  prefix: list[str] = []
  if unshare:
    flags = ["-m", "-n", "-p", "-f", "--kill-child"]
    candidates = [[unshare, *flags]] if is_root else []
    candidates.append([unshare, "-r", *flags])
    for cand in candidates:
      try:
        probe = subprocess.run([*cand, "true"], capture_output=True, timeout=10)
      except (OSError, subprocess.TimeoutExpired):
        continue
      if probe.returncode == 0:
        prefix = cand
        break
  python = os.path.realpath(sys.executable)
  drop_user = is_root and (not prefix or "-r" not in prefix)
  if drop_user and not _world_accessible(python):
    fallback = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    python = fallback if fallback and _world_accessible(fallback) else python
    drop_user = _world_accessible(python)
  return {
    "unshare_prefix": tuple(prefix),
    "net_namespace": bool(prefix),
    "pid_namespace": bool(prefix),
    "mount_namespace": bool(prefix) and _can_hide(prefix, python),
    "drop_user": drop_user,
    "python": python,
  }


def _can_hide(prefix: list[str], python: str) -> bool:
  """Whether a tmpfs can be mounted inside the sandbox's mount namespace (probe on a temp dir)."""
  probe_dir = tempfile.mkdtemp(prefix="rlvr_sandbox_probe_")
  code = (
    "import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); "
    "sys.exit(libc.mount(b'tmpfs', sys.argv[1].encode(), b'tmpfs', 15, b'size=4k') != 0)"
  )
  try:
    probe = subprocess.run([*prefix, python, "-I", "-S", "-c", code, probe_dir], timeout=10)
    return probe.returncode == 0
  except (OSError, subprocess.TimeoutExpired):
    return False
  finally:
    shutil.rmtree(probe_dir, ignore_errors=True)


def default_hidden_paths() -> tuple[str, ...]:
  """Directories hidden from programs when a mount namespace is available: the trainer's working
  directory, the project holding this package, the home directory, /root and /home; minus any that
  contain the sandbox interpreter or the temporary directory."""
  package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  candidates = [os.getcwd(), package_root, os.path.expanduser("~"), "/root", "/home"]
  keep = [
    os.path.realpath(sandbox_capabilities()["python"]),
    os.path.realpath(tempfile.gettempdir()),
  ]
  out = []
  for path in candidates:
    path = os.path.realpath(path)
    inside = any(k == path or k.startswith(path.rstrip("/") + "/") for k in keep)
    if path != "/" and os.path.isdir(path) and not inside and path not in out:
      out.append(path)
  return tuple(out)


def _rlimits(limits: SandboxLimits) -> list[tuple[str, int, int]]:
  """(name, soft, hard). CPU: SIGXCPU at the soft limit (exit 152), SIGKILL one second later."""
  cpu = int(max(1, limits.cpu_s))
  return [
    ("RLIMIT_CPU", cpu, cpu + 1),
    *[
      (name, int(value), int(value))
      for name, value in (
        ("RLIMIT_AS", limits.memory_bytes),
        ("RLIMIT_FSIZE", limits.file_size_bytes),
        ("RLIMIT_NOFILE", limits.max_open_files),
        ("RLIMIT_NPROC", limits.max_processes),
        ("RLIMIT_CORE", 0),
      )
    ],
  ]


def _kill_tree(proc: subprocess.Popen) -> None:
  for target in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
    try:
      target()
    except (ProcessLookupError, PermissionError, OSError):
      pass


def _feed(pipe, data: bytes) -> None:
  try:
    pipe.write(data)
  except (BrokenPipeError, OSError):
    pass
  finally:
    try:
      pipe.close()
    except OSError:
      pass


def run_python(
  source: str,
  *,
  stdin: str = "",
  tests: list[str] | None = None,
  per_test_s: float = 2.0,
  limits: SandboxLimits = SandboxLimits(),
) -> SandboxResult:
  """Runs ``source`` in the sandbox.

  Without ``tests``: as a script with ``stdin``; compare ``stdout`` yourself. With ``tests``
  (Python snippets, typically ``assert f(2) == 4``): the program is executed as a module, then each
  snippet in order with ``per_test_s`` each; ``test_passed`` holds one verdict per snippet.
  """
  caps = sandbox_capabilities()
  workdir = tempfile.mkdtemp(prefix="rlvr_sandbox_")
  cfg_r, cfg_w = os.pipe()
  res_r, res_w = os.pipe()
  nonce = secrets.token_hex(16)
  try:
    with open(os.path.join(workdir, "solution.py"), "w", encoding="utf-8", errors="replace") as f:
      f.write(source)
    if caps["drop_user"]:
      os.chown(workdir, NOBODY, NOBODY)
      os.chown(os.path.join(workdir, "solution.py"), NOBODY, NOBODY)
    hide = limits.hidden_paths if limits.hidden_paths is not None else default_hidden_paths()
    cfg = {
      "hide": list(hide) if caps["mount_namespace"] else [],
      "rlimits": _rlimits(limits),
      "uid": NOBODY if caps["drop_user"] else None,
      "gid": NOBODY,
      "mode": "stdio" if tests is None else "asserts",
      "nonce": nonce,
      "tests": list(tests or []),
      "per_test_s": float(per_test_s),
      "result_fd": res_w,
    }
    env = {
      "PATH": "/usr/bin:/bin",
      "HOME": workdir,
      "TMPDIR": workdir,
      "LANG": "C.UTF-8",
      "PYTHONHASHSEED": "0",
      "PYTHONIOENCODING": "utf-8",
      "PYTHONDONTWRITEBYTECODE": "1",
    }
    cmd = [
      *caps["unshare_prefix"],
      caps["python"],
      "-I",
      "-S",
      "-c",
      HARNESS,
      str(cfg_r),
    ]
    start = time.monotonic()
    proc = subprocess.Popen(
      cmd,
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      cwd=workdir,
      env=env,
      pass_fds=(cfg_r, res_w),
      start_new_session=True,
    )
    os.close(cfg_r)
    os.close(res_w)
    cfg_r = res_w = -1
    try:
      with os.fdopen(cfg_w, "wb") as f:
        f.write(json.dumps(cfg).encode())
    except BrokenPipeError:
      pass  # the sandbox died before reading its configuration: its exit status says why
    cfg_w = -1
    feeder = threading.Thread(target=_feed, args=(proc.stdin, stdin.encode()), daemon=True)
    feeder.start()
    status, out, err, res = _pump(proc, res_r, limits, start)
    res_r = -1
    wall = time.monotonic() - start
    returncode = proc.returncode
    if status is None:
      if returncode == 0:
        status = "ok"
      elif returncode == 152:
        status = "cpu_limit"
      elif returncode is None or returncode < 0:
        status = "signal"
      else:
        status = "error"
    passed = None
    if tests is not None:
      verdicts = {}
      for line in res.decode(errors="replace").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == nonce and parts[1].isdigit():
          verdicts[int(parts[1])] = parts[2] == "1"
      passed = tuple(verdicts.get(i, False) for i in range(len(tests)))
    return SandboxResult(
      status, returncode, out.decode(errors="replace"), err.decode(errors="replace"), wall, passed
    )
  finally:
    for fd in (cfg_r, cfg_w, res_r, res_w):
      if fd >= 0:
        try:
          os.close(fd)
        except OSError:
          pass
    shutil.rmtree(workdir, ignore_errors=True)


def _pump(proc: subprocess.Popen, res_fd: int, limits: SandboxLimits, start: float):
  """Reads stdout/stderr/results until exit, timeout or output cap; returns (status, out, err, res)."""
  sel = selectors.DefaultSelector()
  buffers = {"out": bytearray(), "err": bytearray(), "res": bytearray()}
  sel.register(proc.stdout, selectors.EVENT_READ, "out")
  sel.register(proc.stderr, selectors.EVENT_READ, "err")
  sel.register(res_fd, selectors.EVENT_READ, "res")
  status = None
  open_streams = 3
  while open_streams:
    remaining = limits.timeout_s - (time.monotonic() - start)
    if remaining <= 0:
      status = "timeout"
      break
    for key, _ in sel.select(timeout=min(remaining, 0.5)):
      fd = key.fd if isinstance(key.fileobj, int) else key.fileobj.fileno()
      chunk = os.read(fd, 65536)
      if not chunk:
        sel.unregister(key.fileobj)
        open_streams -= 1
        continue
      buffers[key.data] += chunk
    if len(buffers["out"]) + len(buffers["err"]) > limits.max_output_bytes:
      status = "output_limit"
      break
  if status is not None:
    _kill_tree(proc)
  # Streams are closed (or we gave up): wait for the process (it may still run with closed pipes).
  try:
    proc.wait(timeout=max(0.05, limits.timeout_s - (time.monotonic() - start)))
  except subprocess.TimeoutExpired:
    status = status or "timeout"
    _kill_tree(proc)
    proc.wait()
  _kill_tree(proc)  # descendants left in the process group
  sel.close()
  for stream in (proc.stdout, proc.stderr):
    stream.close()
  os.close(res_fd)
  cap = limits.max_output_bytes
  return status, bytes(buffers["out"][:cap]), bytes(buffers["err"][:cap]), bytes(buffers["res"])
