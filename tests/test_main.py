"""The absl entry point fails fast, before building anything, naming the bad field."""

import os
import subprocess
import sys


def test_main_rejects_bad_field_with_its_name():
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  out = subprocess.run(
    [sys.executable, "-m", "rlvr_jax.main", "--config=experiments/default.py",
     "--config.sampling.num_samples=1", "--config.workdir=/tmp/rlvr_jax_test_main"],
    capture_output=True, text=True, env=env, timeout=120,
  )  # fmt: skip
  assert out.returncode != 0
  assert "config.sampling.num_samples" in out.stderr and "G >= 2" in out.stderr


def test_main_requires_config():
  out = subprocess.run(
    [sys.executable, "-m", "rlvr_jax.main"], capture_output=True, text=True, timeout=120
  )
  assert out.returncode != 0 and "--config" in out.stderr
