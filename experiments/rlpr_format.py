"""RLPR with its format term on the worked task: R = 0.9 Δ + 0.1 r_fmt (still no verifier).

Purpose: experiments/rlpr_default.py uses Δ alone, which scores only the working before ``>``;
this is RLPR's full reward R = (1 − c_f) Δ + c_f r_fmt with c_f = 0.1 (arXiv 2506.18254),
r_fmt = 1 when the completion is exactly ``dddd>d{1,3}`` (a host format component). The exact-match
check is a component with weight 0: it only supplies the true outcome for the held-out
evaluation and the ``accuracy/mean`` monitor.

Command:
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/python -m rlvr_jax.main \\
    --config=experiments/rlpr_format.py

Wall time (measured on the loaded, shared 2-core machine): RL phase 725 s plus the warm start.
Expected result (docs/results.md, "RLPR"): held-out greedy accuracy 0.596 -> 0.967 at step 25,
0.95-0.99 through step 150 (0.950 at 150); without the format term the run drifts after ~105.
"""

import os

from rlvr_jax import cli
from rlvr_jax.train.reward_config import reward_component


def _rlpr_config():
  """experiments/rlpr_default.py's config, loaded by path (experiments/ is not a package)."""
  here = os.path.dirname(os.path.abspath(__file__))
  return cli.load_config(os.path.join(here, "rlpr_default.py"))


def get_config():
  c = _rlpr_config()
  c.workdir = "runs/rlpr_format"
  c.model_reward.replace = False
  c.model_reward.weight = 0.9  # 1 − c_f
  c.reward.name = ""
  c.reward.components.check = reward_component("arithmetic", weight=0.0)  # monitor only
  c.reward.components.format = reward_component("format", weight=0.1, template=r"\d{4}>\d{1,3}")
  return c
