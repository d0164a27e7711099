"""The embedded default: GRPO fixes a systematic arithmetic error of a tiny model in minutes on CPU.

Purpose: show RL with verifiable rewards working end to end on this 2-core CPU. A from-scratch
Llama-style model (2 layers, width 64, ~0.1 M params, character tokenizer) gets a short supervised
warm start on two-number addition (0-49 + 0-49) from a *flawed teacher* that forgets the carry in
70% of its demonstrations (``57+68=`` -> ``15`` instead of ``125``). The warm-started model
therefore answers carry problems wrongly most of the time. GRPO (G = 8 samples per prompt, exact-
match reward computed in reward worker processes) then learns from the reward alone to carry,
and held-out accuracy (problems never seen in training, split by content hash) rises.

Command:
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/python -m rlvr_jax.main --config=default

Expected result (2-core CPU, 1-4 minutes in total, depending on the load): held-out greedy
accuracy 0.475 before RL -> 0.858 after 150 RL steps, pass@1 (temperature 1) 0.447 -> 0.839 on
session 6's Intel Xeon (bit-identical on re-runs there; seeds 1 and 2: 0.562 -> 0.917 and
0.533 -> 0.804). Sessions 3-4's AMD Zen 5 machine gave 0.463 -> 0.950 with the same code, and
session 14's AMD EPYC (AVX-512 BF16, no AMX) 0.567 -> 0.942 (pass@1 0.500 -> 0.897, 57 s): the
numbers depend on the CPU (summary.json's "platform"; README "What is reproducible").
The run prints both and writes runs/default/summary.json, metrics.jsonl, curves.png, config.json,
TensorBoard events and checkpoints. See docs/results.md for the recorded runs.
"""

from rlvr_jax.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/default"
  c.model.source = "tiny"
  c.model.hidden_size = 64
  c.model.intermediate_size = 256
  c.model.num_layers = 2
  c.model.num_heads = 4
  c.model.num_kv_heads = 2
  c.model.head_dim = 16
  c.tokenizer.kind = "char"
  c.tokenizer.alphabet = "0123456789+-*="
  c.data.task.name = "arithmetic"
  c.data.task.ops = "+"
  c.data.task.max_value = 49
  c.data.num_eval = 256
  c.data.task.zero_pad = True
  c.warm_start.num_steps = 600
  c.warm_start.clean_steps = 300
  c.warm_start.batch_size = 64
  c.warm_start.learning_rate = 3e-3
  c.warm_start.drop_carry_prob = 0.7
  c.sampling.num_samples = 8
  c.sampling.temperature = 1.0
  c.sampling.max_new_tokens = 5
  c.rl.num_steps = 150
  c.rl.prompts_per_step = 32
  c.rl.advantage = "grpo"
  c.rl.zero_variance = "mask"
  c.objective.name = "grpo"
  c.optim.learning_rate = 1e-3
  c.optim.b2 = 0.99
  c.optim.grad_clip = 1.0
  c.eval.every = 25
  c.eval.num_samples = 4
  c.checkpoint.every = 50
  return c
