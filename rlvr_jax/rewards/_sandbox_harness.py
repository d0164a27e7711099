"""Harness run *inside* the sandbox process (passed to ``python -c``; imports only the stdlib).

It reads its configuration from an inherited pipe (not argv, not a file the program can read),
closes it, mounts empty read-only tmpfs over the directories to hide (inside its own mount
namespace, so the host never sees them), applies resource limits, drops to an unprivileged user when it started as root, then
runs the program: ``stdio`` mode executes it as ``__main__``; ``asserts`` mode executes it as a
module and then each test snippet, writing ``<nonce> <i> <0|1>`` lines to an inherited result pipe.
A program that exits early leaves tests without a verdict, which count as failed.
"""

HARNESS = r"""
import json, os, resource, signal, sys
_fd = int(sys.argv[1]); _rfd = int(sys.argv[2])
with os.fdopen(_fd, "rb") as _f:
  _cfg = json.loads(_f.read())
if _cfg["hide"]:
  import ctypes
  _libc = ctypes.CDLL(None, use_errno=True)
  for _p in _cfg["hide"]:
    # MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC: an empty read-only tmpfs over the directory.
    if _libc.mount(b"tmpfs", _p.encode(), b"tmpfs", 15, b"size=4k,mode=555") != 0:
      sys.stderr.write("sandbox: cannot hide %s (errno %d)\n" % (_p, ctypes.get_errno()))
      os._exit(97)
for _name, _soft, _hard in _cfg["rlimits"]:
  _res_id = getattr(resource, _name)
  _cap = resource.getrlimit(_res_id)[1]  # a limit can only be lowered: clamp to the current hard
  if _cap != resource.RLIM_INFINITY:
    _soft, _hard = min(_soft, _cap), min(_hard, _cap)
  resource.setrlimit(_res_id, (_soft, _hard))
if _cfg["uid"] is not None:
  os.setgroups([])
  os.setgid(_cfg["gid"])
  os.setuid(_cfg["uid"])
os.umask(0o077)
# RLIMIT_CPU: the soft limit delivers SIGXCPU (reported as exit code 152), the hard one SIGKILL.
signal.signal(signal.SIGXCPU, lambda signum, frame: os._exit(152))
sys.argv = ["solution.py"]
with open("solution.py", encoding="utf-8") as _f:
  _src = _f.read()
if _cfg["mode"] == "stdio":
  os.close(_rfd)
  _g = {"__name__": "__main__", "__builtins__": __builtins__}
  del _cfg, _f, _fd, _rfd, _name, _soft, _hard, _res_id, _cap
  exec(compile(_src, "solution.py", "exec"), _g)
else:
  _res = os.fdopen(_rfd, "w", buffering=1)
  _nonce, _tests, _per = _cfg["nonce"], _cfg["tests"], _cfg["per_test_s"]
  del _cfg
  _g = {"__name__": "solution", "__builtins__": __builtins__}
  exec(compile(_src, "solution.py", "exec"), _g)
  def _alarm(signum, frame):
    raise TimeoutError("test timed out")
  signal.signal(signal.SIGALRM, _alarm)
  for _i, _t in enumerate(_tests):
    _ok = 0
    signal.setitimer(signal.ITIMER_REAL, _per)
    try:
      exec(compile(_t, "test_%d" % _i, "exec"), _g)
      _ok = 1
    except BaseException:
      pass
    finally:
      signal.setitimer(signal.ITIMER_REAL, 0)
    _res.write("%s %d %d\n" % (_nonce, _i, _ok))
"""
