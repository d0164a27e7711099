"""Shared by the sandbox tests: the host's sandbox capabilities, the skip when the strong sandbox
is unavailable, a fast ``run_python``, and the look-up of a sandbox uid's leftover processes."""

import os
import time

import pytest

from rlvr_jax.rewards import code_sandbox

CAPS = code_sandbox.sandbox_capabilities()
NEEDS_STRONG_SANDBOX = pytest.mark.skipif(
  not CAPS["strong"], reason=f"the strong sandbox is unavailable here: {CAPS['missing']}"
)
FAST = code_sandbox.SandboxLimits(timeout_s=3.0, cpu_s=3)


def run_python(source, **kwargs):
  """``code_sandbox.run_python`` with the ``FAST`` limits unless others are given."""
  kwargs.setdefault("limits", FAST)
  return code_sandbox.run_python(source, **kwargs)


def processes_of_uid(uid: int, *, zombies: bool = False) -> dict[int, bytes]:
  """Host processes whose real uid is ``uid``: pid -> the start of its command line.

  Zombies are left out unless ``zombies``: they have exited and run nothing; only their exit
  status waits for a parent to reap it (under load, the adoptive init of a killed PID namespace
  reaps them seconds later)."""
  found = {}
  for entry in os.listdir("/proc"):
    try:
      with open(f"/proc/{entry}/status") as f:
        fields = dict(x.split(":", 1) for x in f if ":" in x)
      if int(fields["Uid"].split()[0]) != uid or (
        fields["State"].split()[0] == "Z" and not zombies
      ):
        continue
      with open(f"/proc/{entry}/cmdline", "rb") as f:
        found[int(entry)] = f.read()[:100]
    except (OSError, KeyError, ValueError):
      continue
  return found


def assert_no_live_processes(uid: int, wait_s: float = 10.0) -> None:
  """No live process of ``uid`` within ``wait_s`` (the wait covers SIGKILL delivery on a loaded
  machine; the sandboxed programs of these tests run far longer, so a survivor is still there)."""
  deadline = time.monotonic() + wait_s
  while processes_of_uid(uid) and time.monotonic() < deadline:
    time.sleep(0.05)
  assert processes_of_uid(uid) == {}
