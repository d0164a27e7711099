"""Test-wide settings: offline hubs, 8 simulated CPU devices, float32 matmuls, and one persistent
XLA compilation cache for the whole test run."""

import os

# Must be set before jax is imported anywhere.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()

# The persistent compilation cache (environment variables, so that the processes tests start
# share it too). Many tests compile the same tiny-model programs (the sampler, the scoring pass,
# parameter init) in different processes: pytest-xdist's workers, the slow suite after the fast one,
# `python -m rlvr_jax.main` subprocesses; each program is compiled once per test run instead. The
# directory is `.jax_cache/` in the checkout (ignored by git; a fresh clone, as in CI, starts
# empty; entries are keyed by the program, the compile options and the jax version, so an old one
# is never wrong). A size limit turns on JAX's file lock, which the xdist workers need because they
# read and write it concurrently; least recently used entries go first.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(_REPO, ".jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 << 30))

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
