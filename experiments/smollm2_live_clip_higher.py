"""``experiments/smollm2_live_clip.py`` with DAPO's clip-higher: the PPO ratio is clipped to
[1 - 0.2, 1 + 0.28] instead of [0.8, 1.2], everything else equal (seed, prompts, four updates per
rollout batch at lr 1e-5, bfloat16 compute). DAPO's claim: the higher upper bound lets
low-probability tokens with positive advantage grow, so the policy's entropy does not collapse the
way it does under the symmetric clip.

Command:
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/python -m rlvr_jax.main \\
    --config=experiments/smollm2_live_clip_higher.py

Expected result (seed 0, 2026-11-25, 2-core Intel Xeon): held-out pass@1 0.149 +- 0.015 ->
0.614 +- 0.029, entropy 0.85 -> 0.12 (0.10 with the symmetric clip: no entropy kept up); 0.14% of
tokens clipped above per step; 56 min side by side with the symmetric run. Details and curves:
docs/results.md ("Clip-higher against the symmetric clip").
"""

import os

from rlvr_jax import cli


def get_config():
  c = cli.load_config(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "smollm2_live_clip.py")
  )
  c.workdir = "runs/smollm2_live_clip_higher"
  c.objective.kwargs.clip_high = 0.28
  return c
