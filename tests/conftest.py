"""Test-wide settings: offline hubs, 8 simulated CPU devices, float32 matmuls, the folder of the
trainer's persistent compilation cache, and a bound on the memory mappings of a test process."""

import os
import tempfile

import pytest

# Must be set before jax is imported anywhere.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()

# Opt-in persistent XLA compilation cache: `export JAX_COMPILATION_CACHE_DIR=$PWD/.jax_cache` (ignored
# by git) makes pytest-xdist's workers and the `python -m rlvr_jax.main` subprocesses of the tests
# share compiled programs across processes and runs; the limits below then apply (a size limit
# turns on JAX's file lock, which concurrent workers need). Not on by default, nor in CI: in one
# session-9 run of the fast suite a worker aborted inside XLA's executable serialization (a cache
# write), which did not happen again when rerun; and within a process jit's own cache already
# shares most compiles between tests.
if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
  os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 << 30))

# The trainer's persistent compilation cache (rlvr_jax.compilation, on by default): the tests'
# runs share one folder of this machine's temporary directory instead of ~/.cache, so pytest-xdist's
# workers and the `python -m rlvr_jax.main` subprocesses load what another one compiled.
os.environ.setdefault(
  "RLVR_JAX_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"rlvr_jax_tests_xla_{os.getuid()}")
)

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

from rlvr_jax import compilation  # noqa: E402

# A test process must stay far from the kernel's limit on memory mappings (vm.max_map_count,
# 65,530 by default), where XLA:CPU can no longer map a compiled program and the process dies.
# Each executable XLA:CPU keeps is mapped in pieces. Runs and train steps give theirs back
# (rlvr_jax.compilation); what stays is one program per function and static configuration of the
# module-level jits (the sampler and forward per model shape) and of the tests' own jits, hundreds
# of configurations over the suite. Like a notebook that sweeps model shapes, the test process
# releases those (compilation.release) after a test module once it holds RELEASE_ABOVE mappings;
# a test after which the process holds more than MAX_MAPPINGS (a single module's leak) fails.
RELEASE_ABOVE = 20_000
MAX_MAPPINGS = 30_000


def memory_mappings() -> int | None:
  """The number of this process's memory mappings (Linux), else None."""
  try:
    with open("/proc/self/maps", "rb") as f:
      return sum(1 for _ in f)
  except OSError:
    return None


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  yield
  count = memory_mappings()
  if count is not None and count > RELEASE_ABOVE:
    compilation.release()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
  result = yield
  count = memory_mappings()
  if count is not None and count > MAX_MAPPINGS:
    compilation.release()  # one failure, not one for every later test of the process
    raise AssertionError(
      f"this test process holds {count} memory mappings after {item.nodeid} (limit "
      f"{MAX_MAPPINGS}): compiled programs are accumulating instead of being given back"
    )
  return result
