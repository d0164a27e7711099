"""Shared by the sandbox tests: the host's sandbox capabilities, the skip when the strong sandbox
is unavailable, and a fast ``run_python``."""

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
