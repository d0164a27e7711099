"""Test-wide settings: offline hubs, 8 simulated CPU devices, float32 matmuls, and the limits of
an opt-in persistent XLA compilation cache."""

import os

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

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
