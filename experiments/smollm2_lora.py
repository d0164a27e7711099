"""``experiments/smollm2_learn.py`` with LoRA: SmolLM2-135M-Instruct learns arithmetic word problems
by training rank-16 adapters only (``config.lora``, train/lora_training.py), the base frozen.

Everything but the trained parameters is ``smollm2_learn``'s (the same data, prompt, reward,
sampling at temperature 0.7 with 128 new tokens, P = 4 prompts x G = 8 samples, two updates per
rollout batch, GRPO with the symmetric clip 0.2, 60 RL steps, 200 held-out problems), so the two
runs compare full fine-tuning and LoRA directly.

LoRA: rank 16 on all seven projections (q, k, v, o, gate, up, down: 4.9 M adapter parameters,
3.6% of the 134.5 M), alpha = 2 x rank = 32 (scale alpha / r = 2). Learning rate 1e-4, 20x the
full fine-tuning run's 5e-6: with the alpha / r parametrization the best LoRA learning rate is
about 10x the full fine-tuning one, for supervised learning and RL alike, and somewhat more for
short runs ("LoRA Without Regret", Schulman et al. 2025: B starts at 0, so the product A @ B, and
with it the update, grows only as B does in the first steps); 60 steps of 2 updates are a short
run. 1e-4 is also the low end of the usual LoRA range (1e-4 to 5e-4), where a run is least likely
to collapse the entropy of a model whose pass@1 starts near 0.15.

What the run keeps (``train.loop.Trainer`` with LoRA): the adapters (float32) and their AdamW
moments are the train state and the checkpoints; the float32 base is rebuilt from the GGUF file on
resume; the sampler reads the merged weights (computed once per RL step); at the end the adapters
are written as a PEFT folder, ``runs/smollm2_lora/peft_adapter``. Merged safetensors:

  from rlvr_jax import api
  from rlvr_jax.train import lora_training
  lora_training.export_merged(api.make_config("experiments/smollm2_lora.py"),
                              "runs/smollm2_lora/merged_hf")

Command:
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/python -m rlvr_jax.main \\
    --config=experiments/smollm2_lora.py

Expected result (seed 0, 2026-11-29, 2-core AMD EPYC): held-out pass@1 0.152 +- 0.014 ->
0.723 +- 0.028 (18 standard errors of the rise), greedy accuracy 0.335 -> 0.750, pass@4 0.430
-> 0.815, completions 78 -> 15 tokens, entropy 0.86 -> 0.08; 30 min for the whole command
(median RL step 26 s), peak RSS 9.4 GB; full fine-tuning (``smollm2_learn``) reaches pass@1
0.801. A checkpoint: 52 MB (adapters and their AdamW moments; 1.4 GB with full fine-tuning);
the ``peft_adapter`` folder: 19 MB. Details, curves and the step time and memory of both runs
side by side: docs/results.md ("SmolLM2 with LoRA").
"""

import os

from rlvr_jax import cli


def get_config():
  here = os.path.dirname(os.path.abspath(__file__))
  c = cli.load_config(os.path.join(here, "smollm2_learn.py"))
  c.workdir = "runs/smollm2_lora"
  c.lora.rank = 16
  c.lora.alpha = 32.0
  c.optim.learning_rate = 1e-4
  return c
