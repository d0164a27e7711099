"""The sandbox's own side, run as ``python -I -S _sandbox_harness.py <cfg_fd> <parent_pid>``.

Stdlib only (it runs with no site-packages). Three processes, all forked from this interpreter:

  M (monitor, root, outside the new PID namespace): dies with its parent (``PR_SET_PDEATHSIG``),
    joins the run's cgroup, ``unshare``s new mount, PID, network, IPC and UTS namespaces and forks I.
    It exits with I's exit code; killing M (the parent's timeout) kills I, hence the namespace.
  I (PID 1 of the new namespace, root, never runs model code, never changes credentials, so its
    parent-death signal stays armed): builds a private root on a size-limited tmpfs (read-only
    binds of the system directories and the interpreter's standard library, its own /proc, /tmp,
    /var/tmp, /dev/shm and the working directory ``/sandbox``), ``pivot_root``s into it, writes
    ``solution.py`` and forks P. When P exits, I exits, and the kernel kills every other process of
    the namespace (``setsid`` does not leave a PID namespace).
  P (the program): resource limits, a fresh uid/gid (no supplementary groups), ``no_new_privs``, a
    seccomp filter (x86_64) denying mount / namespace / ptrace / keyring / bpf / io_uring-class
    system calls, then the program. In ``probes`` mode it then evaluates each probe expression (the
    program-dependent parts of the tests, e.g. ``f(2)``) and writes each value, serialised with
    exact-type checks, to the result pipe. Verdicts are computed by the parent from these values:
    nothing the program controls decides whether a test passed, other than the values themselves.

The parent learns that set-up succeeded from a status pipe that P writes ``ok`` to and closes
just before the program starts; exit code 97 without it means the sandbox could not be built.

Without namespaces (``cfg["namespaces"] == 0``, a weak sandbox the caller must have accepted) the
same steps run minus the namespaces and the private root, in a host working directory.
"""

import ctypes
import json
import os
import resource
import signal
import struct
import sys
import types

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
LIBC.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
LIBC.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 1, 22, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
EXIT_SETUP = 97  # the sandbox could not be built (message on stderr)

# x86_64 system calls a program never needs and that widen the kernel's attack surface or reach
# outside the sandbox (numbers from asm/unistd_64.h).
DENIED_X86_64 = (
  101,
  103,
  153,
  155,
  161,
  163,
  165,
  166,
  167,
  168,
  169,
  172,
  173,
  175,
  176,
  179,
  212,
  246,
  248,
  249,
  250,
  272,
  298,
  300,
  303,
  304,
  308,
  310,
  311,
  312,
  313,
  320,
  321,
  323,
  425,
  426,
  427,
  428,
  429,
  430,
  431,
  432,
  433,
  442,
)  # ptrace syslog vhangup pivot_root chroot acct mount umount2 swapon swapoff reboot iopl ioperm
#  init/delete_module quotactl lookup_dcookie kexec_load add_key request_key keyctl unshare
#  perf_event_open fanotify_init name_to_handle_at open_by_handle_at setns process_vm_readv/writev
#  kcmp finit_module kexec_file_load bpf userfaultfd io_uring_* open_tree move_mount fs* mount_setattr
CLONE_NS_FLAGS = 0x80 | 0x20000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000
CLONE_NS_FLAGS |= 0x40000000  # NEWTIME NEWNS NEWCGROUP NEWUTS NEWIPC NEWUSER NEWPID NEWNET


def _fail(stage, err=None):
  err = ctypes.get_errno() if err is None else err
  os.write(2, f"sandbox: {stage} failed ({os.strerror(err)})\n".encode())
  os._exit(EXIT_SETUP)


def _check(ret, stage):
  if ret != 0:
    _fail(stage)


def _mount(src, dst, fstype, flags, data=None):
  enc = lambda s: None if s is None else s.encode()  # noqa: E731
  return LIBC.mount(enc(src), enc(dst), enc(fstype), flags, enc(data))


def _write(path, text):
  with open(path, "w") as f:
    f.write(text)


# --- M: the monitor -------------------------------------------------------------------------------


def monitor(cfg, parent_pid):
  LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
  if os.getppid() != parent_pid:  # the parent died before the line above
    os._exit(EXIT_SETUP)
  for directory in cfg["cgroups"]:  # per-run cgroup: memory and process count of the whole run
    try:
      os.mkdir(directory)
      for name, value in cfg["cgroup_limits"].items():
        if os.path.exists(os.path.join(directory, name)):
          _write(os.path.join(directory, name), str(value))
      _write(os.path.join(directory, "cgroup.procs"), str(os.getpid()))
    except OSError as e:
      _fail("cgroup " + directory, e.errno)
  if cfg["namespaces"]:
    _check(LIBC.unshare(cfg["namespaces"]), "unshare")
  pid = os.fork()
  if pid == 0:
    init(cfg)
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  _, status = os.waitpid(pid, 0)
  os._exit(_exit_code(status))


def _exit_code(status):
  return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


# --- I: PID 1 of the namespace --------------------------------------------------------------------


def init(cfg):
  LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
  if cfg["namespaces"]:
    workdir = "/sandbox"
    try:
      _private_root(cfg)
    except OSError as e:
      _fail(f"private root ({e})", e.errno)
  else:
    workdir = cfg["workdir"]
    LIBC.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans of the program come back to us
  path = os.path.join(workdir, "solution.py")
  with open(path, "w", encoding="utf-8", errors="replace") as f:
    f.write(cfg["source"])
  if cfg["uid"] is not None:
    os.chown(path, cfg["uid"], cfg["uid"])
  pid = os.fork()
  if pid == 0:
    program(cfg, workdir)
  while True:
    try:
      done, status = os.waitpid(-1, 0)
    except ChildProcessError:
      os._exit(EXIT_SETUP)
    if done == pid:
      break
  if not cfg["namespaces"]:
    _kill_uid(cfg["uid"])
  os._exit(_exit_code(status))  # PID 1 exits: the kernel kills the rest of the namespace


def _kill_uid(uid):
  """Without a PID namespace: kill every process of the run's private uid (kill(-1) as that uid)."""
  if uid is None:
    return
  pid = os.fork()
  if pid == 0:
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    os.kill(-1, signal.SIGKILL)
    os._exit(0)
  os.waitpid(pid, 0)


def _bind(src, dst, flags=MS_RDONLY | MS_NOSUID | MS_NODEV):
  if os.path.isdir(src):
    os.makedirs(dst, exist_ok=True)
  else:
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    open(dst, "a").close()
  _check(_mount(src, dst, None, MS_BIND), "bind " + src)
  _check(_mount(None, dst, None, MS_BIND | MS_REMOUNT | flags), "remount " + src)


def _private_root(cfg):
  """A tmpfs root holding only read-only binds of ``cfg["binds"]`` plus private scratch space."""
  _check(_mount(None, "/", None, MS_REC | MS_PRIVATE), "make / private")
  root = cfg["root_mountpoint"]
  opts = f"size={cfg['scratch_bytes']},nr_inodes={cfg['scratch_inodes']},mode=755"
  _check(_mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, opts), "tmpfs root")
  for src in cfg["binds"]:
    _bind(src, root + src)
  for name, target in cfg["symlinks"].items():
    os.symlink(target, root + name)
  for name in ("null", "zero", "full", "random", "urandom"):
    _bind("/dev/" + name, root + "/dev/" + name, MS_NOSUID | MS_NOEXEC)
  for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0")):
    os.symlink(target, root + "/dev/" + name)
  os.symlink("/proc/self/fd/1", root + "/dev/stdout")
  os.symlink("/proc/self/fd/2", root + "/dev/stderr")
  for name in ("/tmp", "/var/tmp", "/dev/shm"):
    os.makedirs(root + name, exist_ok=True)
    os.chmod(root + name, 0o1777)
  os.makedirs(root + "/sandbox")
  os.chown(root + "/sandbox", cfg["uid"], cfg["uid"])
  os.chmod(root + "/sandbox", 0o700)
  os.makedirs(root + "/proc")
  os.makedirs(root + "/etc", exist_ok=True)
  _write(root + "/etc/passwd", f"sandbox:x:{cfg['uid']}:{cfg['uid']}::/sandbox:/bin/sh\n")
  _write(root + "/etc/group", f"sandbox:x:{cfg['uid']}:\n")
  os.chdir(root)
  os.mkdir(".old")
  _check(LIBC.syscall(SYS_PIVOT_ROOT[os.uname().machine], b".", b".old"), "pivot_root")
  os.chdir("/")
  _check(LIBC.umount2(b"/.old", MNT_DETACH), "detach the host root")
  os.rmdir("/.old")
  _check(_mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC), "mount /proc")
  os.chmod("/", 0o755)


# --- P: the program -------------------------------------------------------------------------------


def _seccomp():
  """A deny-list filter (x86_64 only): denied calls fail with EPERM, clone3 with ENOSYS (so libc
  falls back to clone, whose namespace flags are checked), other ABIs (x32, i386) are denied."""
  ld = lambda k: struct.pack("HBBI", 0x20, 0, 0, k)  # noqa: E731  BPF_LD|BPF_W|BPF_ABS
  jump = lambda op, k, jt, jf: struct.pack("HBBI", op, jt, jf, k)  # noqa: E731
  ret = lambda k: struct.pack("HBBI", 0x06, 0, 0, k)  # noqa: E731  BPF_RET|BPF_K
  eperm, allow = 0x00050000 | 1, 0x7FFF0000
  prog = [ld(4), jump(0x15, 0xC000003E, 1, 0), ret(0x80000000)]  # arch == x86_64, else kill
  prog += [ld(0), jump(0x35, 0x40000000, 0, 1), ret(eperm)]  # x32 system calls
  for nr in DENIED_X86_64:
    prog += [jump(0x15, nr, 0, 1), ret(eperm)]
  prog += [jump(0x15, 435, 0, 1), ret(0x00050000 | 38)]  # clone3 -> ENOSYS
  prog += [jump(0x15, 56, 0, 3), ld(16), jump(0x45, CLONE_NS_FLAGS, 0, 1), ret(eperm)]
  prog += [ret(allow)]
  code = b"".join(prog)
  buf = ctypes.create_string_buffer(code, len(code))
  fprog = struct.pack("HxxxxxxQ", len(prog), ctypes.addressof(buf))
  fbuf = ctypes.create_string_buffer(fprog, len(fprog))
  _check(LIBC.prctl(PR_SET_SECCOMP, 2, ctypes.addressof(fbuf), 0, 0), "seccomp")


def program(cfg, workdir):
  os.setsid()
  os.chdir(workdir)
  for name, soft, hard in cfg["rlimits"]:
    res_id = getattr(resource, name)
    cap = resource.getrlimit(res_id)[1]  # a limit can only be lowered: clamp to the current hard
    if cap != resource.RLIM_INFINITY:
      soft, hard = min(soft, cap), min(hard, cap)
    resource.setrlimit(res_id, (soft, hard))
  if cfg["uid"] is not None:
    os.setgroups([])
    os.setresgid(cfg["uid"], cfg["uid"], cfg["uid"])
    os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
  _check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
  if cfg["seccomp"]:
    _seccomp()
  os.umask(0o077)
  os.environ.clear()
  os.environ.update(cfg["env"])
  signal.signal(signal.SIGINT, signal.SIG_DFL)
  # RLIMIT_CPU: the soft limit delivers SIGXCPU (reported as exit code 152), the hard one SIGKILL.
  signal.signal(signal.SIGXCPU, lambda signum, frame: os._exit(152))
  sys.argv = ["solution.py"]
  mode, probes, per_test_s = cfg["mode"], cfg["probes"], cfg["per_test_s"]
  results = os.fdopen(cfg["result_fd"], "w", buffering=1) if mode == "probes" else None
  if results is None:
    os.close(cfg["result_fd"])
  source = cfg["source"]
  # Set-up is done: say so on a pipe the program never sees (so that its own exit codes cannot
  # pass for a broken sandbox), then forget the configuration.
  os.write(cfg["status_fd"], b"ok")
  os.close(cfg["status_fd"])
  del cfg
  code = compile(source, "solution.py", "exec")
  module = types.ModuleType("__main__" if mode == "stdio" else "solution")
  module.__file__ = os.path.join(workdir, "solution.py")
  sys.modules["__main__"] = sys.modules[module.__name__] = module
  exec(code, module.__dict__)
  if results is None:
    return _flush_exit(0)

  def on_alarm(signum, frame):
    raise TimeoutError("test timed out")

  signal.signal(signal.SIGALRM, on_alarm)
  for test, exprs in enumerate(probes):
    signal.setitimer(signal.ITIMER_REAL, per_test_s)
    try:
      for j, expr in enumerate(exprs):
        try:
          value = encode(eval(compile(expr, f"test_{test}", "eval"), module.__dict__))
        except TimeoutError:
          raise
        except BaseException as e:  # noqa: BLE001  (the test fails; the parent sees the type name)
          value = ["E", type(e).__name__[:100]]
        results.write(json.dumps([test, j, value]) + "\n")
    except TimeoutError:
      pass
    finally:
      signal.setitimer(signal.ITIMER_REAL, 0)
  return _flush_exit(0)


def _flush_exit(code):
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except BaseException:  # noqa: BLE001
      pass
  os._exit(code)


ITER_TYPES = frozenset(
  t.__name__ for t in (map, filter, zip, enumerate, reversed, types.GeneratorType)
) | {"list_iterator", "tuple_iterator", "dict_keyiterator", "range_iterator", "set_iterator"}


def encode(value, depth=0, budget=None):
  """Plain values only, by *exact* type (a subclass or a custom ``__eq__`` is refused), so the
  parent compares objects whose behaviour the program cannot change."""
  budget = budget if budget is not None else [1 << 20]
  budget[0] -= 1
  if depth > 64 or budget[0] < 0:
    raise ValueError("value too large or too deep")
  t = type(value)
  if value is None or t is bool:
    return ["N"] if value is None else ["B", value]
  if t is int:
    return ["i", hex(value)]
  if t is float:
    return ["f", repr(value)]
  if t is complex:
    return ["c", repr(value.real), repr(value.imag)]
  if t is str:
    budget[0] -= len(value) // 16
    return ["s", value]
  if t is bytes or t is bytearray:
    budget[0] -= len(value) // 16
    return ["y" if t is bytes else "Y", value.hex()]
  if t is range:
    return ["r", hex(value.start), hex(value.stop), hex(value.step)]
  rec = lambda v: encode(v, depth + 1, budget)  # noqa: E731
  if t in (list, tuple, set, frozenset):
    return [{list: "l", tuple: "t", set: "S", frozenset: "F"}[t], [rec(v) for v in value]]
  if t is dict or t.__module__ == "collections" and t.__name__ in ("OrderedDict", "defaultdict"):
    return ["d", [[rec(k), rec(v)] for k, v in dict.items(value)]]
  if t.__module__ == "collections" and t.__name__ == "Counter":
    return ["d", [[rec(k), rec(v)] for k, v in dict.items(value)]]
  if t.__module__ in ("builtins", "itertools") and t.__name__ in ITER_TYPES | {
    "count",
    "chain",
    "islice",
    "permutations",
    "combinations",
    "product",
    "accumulate",
  }:
    items = []
    for v in value:
      items.append(rec(v))
    return ["it", items]
  raise TypeError(f"cannot compare a {t.__name__} outside the sandbox")


if __name__ == "__main__":
  with os.fdopen(int(sys.argv[1]), "rb") as _f:
    _cfg = json.loads(_f.read())
  monitor(_cfg, int(sys.argv[2]))
