"""PRIME on the embedded default task: implicit process rewards from a second model trained online.

Purpose: the default task (experiments/default.py) with PRIME's dense credit (arXiv 2502.01456;
METHODS.md §5.8) instead of the outcome-only GRPO advantage. A second parameter tree π_φ (the
implicit PRM, a copy of the warm-started policy) gives token rewards β (log π_φ − log π_ref); it
is trained in the same RL step by cross-entropy on the verifier outcome; advantages are PRIME's
leave-one-out returns of process + outcome rewards, whitened over the batch.

Command:
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/python -m rlvr_jax.main \\
    --config=experiments/prime_default.py

Expected result: compare with experiments/default.py (outcome-only GRPO) at the same 150 steps
and seed; docs/results.md records both runs, and the PRM's own metrics (``prm/loss``,
``prm/accuracy``: does σ(β Σ log π_φ/π_ref) predict the outcome).
"""

import os

from rlvr_jax import cli


def _default_config():
  """experiments/default.py's config, loaded by path (experiments/ is not a package)."""
  return cli.load_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), "default.py"))


def get_config():
  c = _default_config()
  c.workdir = "runs/prime_default"
  c.implicit_prm.enabled = True
  c.rl.advantage = "prime"
  c.rl.zero_variance = "keep"  # PRIME's process reward gives signal in all-equal groups too
  return c
