"""Dr.GRPO arm of the length comparison: ``experiments/smollm2_length_grpo.py`` with Dr.GRPO's
advantage (group mean subtracted, no standard-deviation division) and objective (token sums
divided by the run constant C = 128 new tokens instead of each completion's length).

Command:
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/python -m rlvr_jax.main \\
    --config=experiments/smollm2_length_dr_grpo.py

Expected result (seed 0, 2026-11-25, 2-core Intel Xeon): held-out pass@1 0.142 +- 0.014 ->
0.654 +- 0.023, greedy accuracy 0.330 -> 0.815; completions 79 -> 30 tokens, wrong answers
31.3 +- 0.9 tokens against 29.7 +- 0.3 for right ones after RL (1-2 tokens apart from step 21
on); 59 min for the whole command while sharing the cores (peak RSS about 12.5 GB). Details and
curves: docs/results.md ("Dr.GRPO against GRPO: the length of wrong answers").
"""

import os

from rlvr_jax import cli


def get_config():
  here = os.path.dirname(os.path.abspath(__file__))
  c = cli.load_config(os.path.join(here, "smollm2_length_grpo.py"))
  c.workdir = "runs/smollm2_length_dr_grpo"
  c.rl.advantage = "dr_grpo"
  c.objective.name = "dr_grpo"
  return c
