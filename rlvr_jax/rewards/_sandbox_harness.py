"""Harness run *inside* the sandbox process (passed to ``python -c``; imports only the stdlib).

It reads its configuration from an inherited pipe (not argv, not a file the program can read),
closes it, mounts empty read-only tmpfs over the directories to hide (inside its own mount
namespace, so the host never sees them), applies resource limits, drops to an unprivileged user when it started as root, then
runs the program: ``stdio`` mode executes it as ``__main__``; ``asserts`` mode executes it as a
module and then each test snippet, writing ``<nonce> <i> <0|1>`` lines to an inherited result pipe.
A program that exits early leaves tests without a verdict, which count as failed.
"""

HARNESS = r"""
import json, os, resource, signal, sys, types


def _setup():
  with os.fdopen(int(sys.argv[1]), "rb") as f:
    cfg = json.loads(f.read())
  if cfg["hide"]:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    for path in cfg["hide"]:
      # MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC: an empty read-only tmpfs over the directory.
      if libc.mount(b"tmpfs", path.encode(), b"tmpfs", 15, b"size=4k,mode=555") != 0:
        sys.stderr.write("sandbox: cannot hide %s (errno %d)\n" % (path, ctypes.get_errno()))
        os._exit(97)
  for name, soft, hard in cfg["rlimits"]:
    res_id = getattr(resource, name)
    cap = resource.getrlimit(res_id)[1]  # a limit can only be lowered: clamp to the current hard
    if cap != resource.RLIM_INFINITY:
      soft, hard = min(soft, cap), min(hard, cap)
    resource.setrlimit(res_id, (soft, hard))
  if cfg["uid"] is not None:
    os.setgroups([])
    os.setgid(cfg["gid"])
    os.setuid(cfg["uid"])
  os.umask(0o077)
  # RLIMIT_CPU: the soft limit delivers SIGXCPU (reported as exit code 152), the hard one SIGKILL.
  signal.signal(signal.SIGXCPU, lambda signum, frame: os._exit(152))
  sys.argv = ["solution.py"]
  return cfg


def _module(name):
  # The program gets its own module object, registered as __main__, so `import __main__` does not
  # reach this harness.
  module = types.ModuleType(name)
  module.__file__ = "solution.py"
  sys.modules["__main__"] = sys.modules[name] = module
  return module


def _run():
  cfg = _setup()
  with open("solution.py", encoding="utf-8") as f:
    code = compile(f.read(), "solution.py", "exec")
  if cfg["mode"] == "stdio":
    os.close(int(cfg["result_fd"]))
    exec(code, _module("__main__").__dict__)
    return
  results = os.fdopen(int(cfg["result_fd"]), "w", buffering=1)
  nonce, tests, per_test_s = cfg["nonce"], cfg["tests"], cfg["per_test_s"]
  del cfg
  namespace = _module("solution").__dict__
  exec(code, namespace)

  def on_alarm(signum, frame):
    raise TimeoutError("test timed out")

  signal.signal(signal.SIGALRM, on_alarm)
  for i, test in enumerate(tests):
    ok = 0
    signal.setitimer(signal.ITIMER_REAL, per_test_s)
    try:
      exec(compile(test, "test_%d" % i, "exec"), namespace)
      ok = 1
    except BaseException:
      pass
    finally:
      signal.setitimer(signal.ITIMER_REAL, 0)
    results.write("%s %d %d\n" % (nonce, i, ok))


_run()
"""
