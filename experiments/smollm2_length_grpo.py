"""GRPO arm of the Dr.GRPO length comparison: SmolLM2-135M-Instruct on arithmetic word problems.

Dr.GRPO's claim (arXiv 2503.20783): GRPO divides each completion's token sum by its own length
(``seq_mean_token_mean``), so a wrong answer's per-token penalty shrinks as it grows, and the
length of wrong answers keeps growing; its standard-deviation scaling also weights groups
unevenly. Dr.GRPO divides by a run constant instead (``seq_mean_token_sum_norm``, C =
``sampling.max_new_tokens``) and drops the standard deviation, and the length of wrong answers
stays down. This run is ``experiments/smollm2_learn.py`` (GRPO, symmetric clip 0.2, two updates per
rollout batch, lr 5e-6, 128 new tokens, where a quarter of the untrained model's completions are
truncated) on bfloat16 compute for 40 RL steps; ``experiments/smollm2_length_dr_grpo.py`` changes
the advantage and the objective only. Each step logs ``length/correct_mean`` and
``length/incorrect_mean``; the held-out evaluation reports ``eval/length_correct`` and
``eval/length_incorrect`` with their standard errors.

Command:
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/python -m rlvr_jax.main \\
    --config=experiments/smollm2_length_grpo.py

Expected result (seed 0, 2026-11-25, 2-core Intel Xeon, alone on the machine): held-out pass@1
0.142 +- 0.014 -> 0.665 +- 0.024, greedy accuracy 0.330 -> 0.795; completions 79 -> 18 tokens,
wrong answers 22.3 +- 1.4 tokens against 16.7 +- 0.2 for right ones after RL; in training, wrong
answers grow from about 27 to 35 tokens over steps 17-30 while right ones stay at 23-24; 40 min
for the whole command (median RL step 45 s, peak RSS about 12.5 GB). Details and curves:
docs/results.md ("Dr.GRPO against GRPO: the length of wrong answers").
"""

import os

from rlvr_jax import cli


def get_config():
  c = cli.load_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), "smollm2_learn.py"))
  c.workdir = "runs/smollm2_length_grpo"
  c.model.compute_dtype = "bfloat16"
  c.rl.num_steps = 40
  return c
