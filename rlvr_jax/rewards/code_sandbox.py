"""Run model-written Python in a sandbox process. Never ``exec`` it in the trainer.

The threat model (docs/design.md, "The code sandbox"): the program is hostile and tries to escape,
to persist, to read the host, to change another program's verdict or to exhaust the machine. Each
run gets (``_sandbox_harness.py`` builds it; this module is the parent's side):

  * new mount, PID, network, IPC and UTS namespaces; a private root on a size-limited tmpfs with
    only read-only binds of the system directories and the interpreter's standard library, its own
    ``/proc``, ``/tmp``, ``/var/tmp``, ``/dev/shm`` and working directory, all gone when it ends
    (no host directory is written, so a killed worker leaves nothing behind);
  * a uid/gid of its own (``UID_BASE`` + the monitor's host pid: unique among live runs), no
    supplementary groups, ``no_new_privs`` and a seccomp deny-list (x86_64);
  * rlimits (CPU, address space, file size, open files, processes, no core dumps) and, where
    cgroups are writable, a per-run cgroup capping memory (tmpfs included) and process count;
  * a wall-clock timeout and an output cap enforced here: on expiry the monitor is killed, which
    kills the namespace's init, which kills every process of the run (``setsid`` included);
  * verdicts computed here from values the program's process serialised (see ``code_verdict``).

``sandbox_capabilities()`` says which of these this host allows. Code is refused when any is
missing unless the caller passes ``allow_weak_sandbox=True`` (then a warning is logged).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import platform
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from rlvr_jax.rewards import code_verdict

log = logging.getLogger(__name__)
HARNESS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_harness.py")
UID_BASE = 1 << 24  # + the monitor's host pid (< 2**22): a uid no account or other run uses
CGROUP_NAME = "rlvr_sandbox"
EXIT_SETUP = 97
PROTECTIONS = ("namespaces", "private_root", "fresh_uid", "seccomp", "cgroup")
_NS_FLAGS = 0x00020000 | 0x20000000 | 0x40000000 | 0x08000000 | 0x04000000  # NS PID NET IPC UTS


class WeakSandboxError(RuntimeError):
  """Raised when code would run in a sandbox missing protections the caller did not waive."""


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
  """Per-run limits. ``timeout_s`` is wall clock; ``cpu_s`` is RLIMIT_CPU per process;
  ``memory_bytes`` is RLIMIT_AS per process and the run's cgroup memory cap; ``scratch_bytes`` /
  ``scratch_inodes`` bound everything the run can write (one tmpfs for its whole file tree)."""

  timeout_s: float = 5.0
  cpu_s: int = 5
  memory_bytes: int = 1 << 30
  file_size_bytes: int = 8 << 20
  max_processes: int = 32
  max_open_files: int = 64
  max_output_bytes: int = 1 << 20
  scratch_bytes: int = 64 << 20
  scratch_inodes: int = 4096


@dataclasses.dataclass(frozen=True)
class SandboxResult:
  """status: "ok" (exit 0), "error" (non-zero exit), "signal" (killed by a signal, e.g. SIGSEGV),
  "cpu_limit" (RLIMIT_CPU reached), "timeout" (wall clock), "output_limit" (stdout + stderr over
  the cap). ``test_passed``: one verdict per test, decided by the parent."""

  status: str
  returncode: int | None
  stdout: str
  stderr: str
  wall_s: float
  test_passed: tuple[bool, ...] | None = None


# --- capabilities ---------------------------------------------------------------------------------


def _cgroup_bases() -> tuple[str, list[str]]:
  """("v1" | "v2" | "", the parent directories of per-run cgroups), created on first use."""
  if os.geteuid() != 0:
    return "", []
  root = "/sys/fs/cgroup"
  try:
    if os.path.exists(os.path.join(root, "cgroup.controllers")):
      base = os.path.join(root, CGROUP_NAME)
      os.makedirs(base, exist_ok=True)
      for directory in (root, base):
        with open(os.path.join(directory, "cgroup.subtree_control"), "w") as f:
          f.write("+memory +pids")
      return "v2", [base]
    bases = [os.path.join(root, c, CGROUP_NAME) for c in ("memory", "pids")]
    if not all(os.path.isdir(os.path.dirname(b)) for b in bases):
      return "", []
    for base in bases:
      os.makedirs(base, exist_ok=True)
    return "v1", bases
  except OSError:
    return "", []


def _sweep_cgroups(bases: list[str]) -> None:
  """Removes per-run cgroups whose monitor is gone (a worker killed mid-run), killing leftovers."""
  for base in bases:
    for name in os.listdir(base) if os.path.isdir(base) else []:
      if name.isdigit() and not os.path.exists(f"/proc/{name}"):
        _remove_cgroup(os.path.join(base, name))


def _bind_sources(python_lib: str) -> tuple[list[str], dict[str, str]]:
  """Read-only binds (system directories + the standard library) and top-level symlinks."""
  binds, links = [], {}
  for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
    if os.path.islink(top):
      links[top] = os.readlink(top)
    elif os.path.isdir(top):
      binds.append(top)
  if not any(python_lib == b or python_lib.startswith(b + "/") for b in binds):
    binds.append(python_lib)
  return binds, links


@functools.lru_cache(maxsize=1)
def sandbox_capabilities() -> dict:
  """Which protections this host allows (probed once per process by building a real sandbox).

  Keys: one bool per name in ``PROTECTIONS``, ``missing`` (their names where False), ``strong``
  (nothing missing), ``cgroup_version``, ``reason`` (why namespaces failed, if they did)."""
  version, bases = _cgroup_bases()
  _sweep_cgroups(bases)
  caps_seccomp = platform.machine() == "x86_64"
  caps = {
    "namespaces": False,
    "private_root": False,
    "fresh_uid": os.geteuid() == 0,
    "seccomp": caps_seccomp,
    "cgroup": bool(bases),
    "cgroup_version": version,
    "cgroup_bases": tuple(bases),
    "reason": "",
  }
  if os.geteuid() == 0:
    # Full set first; on failure drop the optional parts one at a time to name what is missing.
    fallbacks = [{}, {"cgroup": False, "cgroup_bases": ()}, {"seccomp": False}]
    reasons = []
    for drop in fallbacks:
      caps.update(drop)
      trial = {**caps, "namespaces": True, "private_root": True}
      try:
        result, _ = _run(trial, "print('ok')", "stdio", "", [], 1.0, SandboxLimits(timeout_s=20))
        if result.stdout.strip() == "ok":
          caps.update(namespaces=True, private_root=True)
          break
        reasons.append((result.stderr or result.status).strip()[-300:])
      except OSError as e:
        reasons.append(str(e)[-300:])
    else:
      caps.update(cgroup=bool(bases), cgroup_bases=tuple(bases), seccomp=caps_seccomp)
    caps["reason"] = "; ".join(reasons)
  else:
    caps["reason"] = "not root: no namespaces or fresh uids (user namespaces are not used)"
  caps["missing"] = tuple(p for p in PROTECTIONS if not caps[p])
  caps["strong"] = not caps["missing"]
  return caps


def check_sandbox(allow_weak_sandbox: bool) -> dict:
  """The capabilities; raises :class:`WeakSandboxError` if protections are missing and not waived,
  logs a warning (once per process) if they are waived."""
  caps = sandbox_capabilities()
  if caps["missing"]:
    what = f"the code sandbox lacks {', '.join(caps['missing'])} on this host"
    if caps["reason"]:
      what += f" ({caps['reason']})"
    if not allow_weak_sandbox:
      raise WeakSandboxError(f"{what}; pass allow_weak_sandbox=True to run code rewards anyway")
    _warn_once(what)
  return caps


@functools.cache
def _warn_once(message: str) -> None:
  log.warning("running model-written code in a WEAK sandbox: %s", message)


# --- running a program ----------------------------------------------------------------------------


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


def _item_budget_s() -> float | None:
  """Seconds left of the reward runtime's budget for the current item (None outside a worker)."""
  from rlvr_jax.rewards._worker import item_seconds_left  # noqa: PLC0415  (avoids an import cycle)

  return item_seconds_left()


def run_python(
  source: str,
  *,
  stdin: str = "",
  tests: list[str] | None = None,
  per_test_s: float = 2.0,
  limits: SandboxLimits = SandboxLimits(),
  allow_weak_sandbox: bool = False,
) -> SandboxResult:
  """Runs ``source`` in the sandbox.

  Without ``tests``: as a script with ``stdin``; compare ``stdout`` yourself. With ``tests``
  (``assert`` snippets such as ``assert f(2) == 4``): the program runs as a module, then the
  program-dependent parts of each test (``f(2)``) are evaluated inside, ``per_test_s`` per test,
  and the tests themselves are decided here (``code_verdict``); ``test_passed`` holds one verdict
  per test. The wall-clock limit is ``limits.timeout_s``, cut to what is left of the reward
  runtime's item budget when called inside a worker.
  """
  caps = check_sandbox(allow_weak_sandbox)
  plan = code_verdict.compile_tests(tests) if tests is not None else None
  budget = _item_budget_s()
  timeout_s = limits.timeout_s if budget is None else max(0.0, min(limits.timeout_s, budget))
  if timeout_s <= 0:
    failed = None if plan is None else tuple(False for _ in plan.tests)
    return SandboxResult("timeout", None, "", "item budget exhausted", 0.0, failed)
  mode, probes = ("stdio", []) if plan is None else ("probes", plan.probes)
  result, values = _run(caps, source, mode, stdin, probes, per_test_s, limits, timeout_s)
  if plan is None:
    return result
  return dataclasses.replace(result, test_passed=tuple(code_verdict.decide(plan, values)))


def _run(caps, source, mode, stdin, probes, per_test_s, limits, timeout_s=None):
  """One sandboxed run; returns (SandboxResult without verdicts, probe values or None)."""
  timeout_s = limits.timeout_s if timeout_s is None else timeout_s
  python_lib = os.path.dirname(os.__file__)
  binds, links = _bind_sources(python_lib)
  roots = ("/tmp", "/mnt", "/media", "/srv", "/opt", "/var")
  root_mount = next(r for r in roots if not any(b.startswith(r + "/") for b in binds))
  workdir = None if caps["namespaces"] else tempfile.mkdtemp(prefix="rlvr_sandbox_")
  cfg_r, cfg_w = os.pipe()
  res_r, res_w = os.pipe()
  st_r, st_w = os.pipe()
  env = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": workdir or "/sandbox",
    "TMPDIR": workdir or "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONHASHSEED": "0",
    "PYTHONIOENCODING": "utf-8",
    "PYTHONDONTWRITEBYTECODE": "1",
  }
  start = time.monotonic()
  proc = None
  try:
    proc = subprocess.Popen(
      [sys.executable, "-I", "-S", HARNESS_PATH, str(cfg_r), str(os.getpid())],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      cwd="/",
      env=env,
      pass_fds=(cfg_r, res_w, st_w),
      start_new_session=True,
    )
    child_res_fd, child_st_fd = res_w, st_w  # pass_fds keeps descriptor numbers
    for fd in (cfg_r, res_w, st_w):
      os.close(fd)
    cfg_r = res_w = st_w = -1
    uid = UID_BASE + proc.pid if caps["fresh_uid"] else None
    if workdir and uid is not None:
      os.chown(workdir, uid, uid)
    cgroups = [os.path.join(b, str(proc.pid)) for b in caps["cgroup_bases"]]
    mem = int(limits.memory_bytes) + int(limits.scratch_bytes)
    cfg = {
      "namespaces": _NS_FLAGS if caps["namespaces"] else 0,
      "root_mountpoint": root_mount,
      "binds": binds,
      "symlinks": links,
      "scratch_bytes": int(limits.scratch_bytes),
      "scratch_inodes": int(limits.scratch_inodes),
      "workdir": workdir,
      "cgroups": cgroups,
      "cgroup_limits": {
        "pids.max": int(limits.max_processes) + 2,
        "memory.limit_in_bytes": mem,
        "memory.memsw.limit_in_bytes": mem,
        "memory.max": mem,
        "memory.swap.max": 0,
      },
      "uid": uid,
      "seccomp": caps["seccomp"],
      "rlimits": _rlimits(limits),
      "env": env,
      "mode": mode,
      "source": source,
      "probes": probes,
      "per_test_s": float(per_test_s),
      "result_fd": child_res_fd,
      "status_fd": child_st_fd,
    }
    try:
      with os.fdopen(cfg_w, "wb") as f:
        cfg_w = -1
        f.write(json.dumps(cfg).encode())
    except BrokenPipeError:
      pass  # the sandbox died before reading its configuration: its exit status says why
    feeder = threading.Thread(target=_feed, args=(proc.stdin, stdin.encode()), daemon=True)
    feeder.start()
    status, out, err, res = _pump(proc, res_r, limits, timeout_s, start)
    res_r = -1
    _remove_cgroups(cgroups)
    wall = time.monotonic() - start
    returncode = proc.returncode
    if status is None:
      if returncode == 0:
        status = "ok"
      elif returncode == 152:
        status = "cpu_limit"
      elif returncode is None or returncode < 0 or returncode > 128:
        status = "signal"
      else:
        status = "error"
    os.set_blocking(st_r, False)
    try:
      set_up = os.read(st_r, 2) == b"ok"
    except BlockingIOError:
      set_up = False
    if returncode == EXIT_SETUP and not set_up:
      raise OSError(f"the sandbox could not be built: {err.decode(errors='replace').strip()}")
    values = code_verdict.parse_values(res, [len(p) for p in probes]) if mode == "probes" else None
    text = (out.decode(errors="replace"), err.decode(errors="replace"))
    return SandboxResult(status, returncode, *text, wall), values
  finally:
    if proc is not None and proc.poll() is None:
      _kill(proc)
    for fd in (cfg_r, cfg_w, res_r, res_w, st_r, st_w):
      if fd >= 0:
        try:
          os.close(fd)
        except OSError:
          pass
    if workdir:
      shutil.rmtree(workdir, ignore_errors=True)


def _kill(proc: subprocess.Popen) -> None:
  """SIGKILL the monitor (and its session): its death kills the namespace's init, then the rest."""
  for target in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
    try:
      target()
    except (ProcessLookupError, PermissionError, OSError):
      pass


def _remove_cgroup(path: str, wait_s: float = 2.0) -> None:
  """Kills whatever is left in a per-run cgroup, then removes it."""
  deadline = time.monotonic() + wait_s
  while os.path.isdir(path):
    try:
      os.rmdir(path)
      return
    except OSError:
      pass
    try:
      with open(os.path.join(path, "cgroup.procs")) as f:
        for pid in f.read().split():
          try:
            os.kill(int(pid), signal.SIGKILL)
          except OSError:
            pass
    except OSError:
      pass
    if time.monotonic() > deadline:
      log.warning("could not remove sandbox cgroup %s", path)
      return
    time.sleep(0.01)


def _remove_cgroups(paths: list[str]) -> None:
  for path in paths:
    _remove_cgroup(path)


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


def _pump(proc: subprocess.Popen, res_fd: int, limits: SandboxLimits, timeout_s: float, start):
  """Reads stdout/stderr/results until exit, timeout or output cap; returns (status, out, err, res)."""
  sel = selectors.DefaultSelector()
  buffers = {"out": bytearray(), "err": bytearray(), "res": bytearray()}
  sel.register(proc.stdout, selectors.EVENT_READ, "out")
  sel.register(proc.stderr, selectors.EVENT_READ, "err")
  sel.register(res_fd, selectors.EVENT_READ, "res")
  status = None
  open_streams = 3
  res_cap = 4 * limits.max_output_bytes + (1 << 20)
  while open_streams:
    remaining = timeout_s - (time.monotonic() - start)
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
    if len(buffers["res"]) > res_cap:
      status = "output_limit"
      break
  if status is not None:
    _kill(proc)
  # Every stream is closed, so every process of the run is gone (or we gave up and killed it).
  try:
    proc.wait(timeout=max(0.05, timeout_s - (time.monotonic() - start)))
  except subprocess.TimeoutExpired:
    status = status or "timeout"
    _kill(proc)
    proc.wait()
  sel.close()
  for stream in (proc.stdout, proc.stderr):
    stream.close()
  os.close(res_fd)
  cap = limits.max_output_bytes
  return status, bytes(buffers["out"][:cap]), bytes(buffers["err"][:cap]), bytes(buffers["res"])
