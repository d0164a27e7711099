"""``experiments/smollm2_learn.py`` with the PPO clip made live, for the clip-higher comparison.

In ``smollm2_learn.py`` / ``smollm2_clip_higher.py`` (lr 5e-6, two updates per rollout batch) the
ratio almost never leaves [0.8, 1.2] (about 1 token in 10,000), so that pair could not test DAPO's
mechanism. Here each rollout batch of P = 4 prompts x G = 8 samples is split into four optimizer
updates (one group each) at lr 1e-5, so the later updates run on a policy that has moved and the
clip bounds bite. Training and sampling run on a bfloat16 copy of float32 master weights
(``model.compute_dtype``), which halves the run's wall time; the proximal log-probs are recomputed
by the trainer in the same precision, so the first update's ratio is 1 up to rounding.
Symmetric clip 0.2 here; ``experiments/smollm2_live_clip_higher.py`` is the same run with DAPO's
clip-higher (0.2 / 0.28).

Command:
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/python -m rlvr_jax.main \\
    --config=experiments/smollm2_live_clip.py

Expected result (seed 0, 2026-11-25, 2-core Intel Xeon, 40 RL steps = 160 updates): held-out
pass@1 0.149 +- 0.015 -> 0.669 +- 0.029, greedy accuracy 0.330 -> 0.710, entropy 0.85 -> 0.10;
0.31% of tokens clipped above and 0.53% below per step on average; 56 min with the clip-higher run
going at the same time on the 2 cores. Details and curves: docs/results.md ("Clip-higher against
the symmetric clip").
"""

import os

from rlvr_jax import cli


def get_config():
  c = cli.load_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), "smollm2_learn.py"))
  c.workdir = "runs/smollm2_live_clip"
  c.model.compute_dtype = "bfloat16"
  c.rl.num_minibatches = 4
  c.rl.num_microbatches = 1
  c.optim.learning_rate = 1e-5
  c.rl.num_steps = 40  # four updates per batch: 160 updates, more than the 120 of the first pair
  return c
