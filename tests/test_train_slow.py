"""A short real run of the default experiment improves the reward (slow: a few minutes)."""

import importlib.util

import numpy as np
import pytest

from rlvr_jax.metrics import read_jsonl
from rlvr_jax.train import loop


@pytest.mark.slow
def test_short_default_run_improves_reward(tmp_path):
  spec = importlib.util.spec_from_file_location("default", "experiments/default.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  c.workdir = str(tmp_path / "run")
  c.rl.num_steps = 60
  c.eval.every = 0
  c.data.num_eval = 128
  c.logging.progress = False
  summary = loop.train(c, log=lambda s: None)
  records = [r for r in read_jsonl(f"{c.workdir}/metrics.jsonl") if "reward/mean" in r]
  first = np.mean([r["reward/mean"] for r in records[:10]])
  last = np.mean([r["reward/mean"] for r in records[-10:]])
  assert last > first + 0.05, (first, last)
  assert summary["eval_after"]["eval/pass@1"] > summary["eval_before"]["eval/pass@1"] + 0.03
  assert (tmp_path / "run" / "curves.png").stat().st_size > 10_000
