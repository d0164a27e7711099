"""RL on a reasoning-gym task: a tiny character model learns to spell words backward.

Purpose: run the trainer on reasoning-gym data end to end. The prompts are entries of its
``spell_backward`` generator (English words of 3-5 letters), the held-out problems come from
another seed with no word shared with the train set, and the reward is the task's own
``score_answer`` (1 for the exact reversal, partial credit for a near miss). The prompt is the
entry's word (``"{metadata[word]}="``, e.g. ``"splat="``) so a character model can read it; the
model answers right after ``=`` (``answer_format="raw"``). A from-scratch 2-layer model gets a short
supervised warm start on the train entries, then GRPO.

Command:
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/python -m rlvr_jax.main \
    --config=experiments/reasoning_gym.py

Expected result: held-out greedy accuracy (exact reversals of unseen words) rises during RL; see
docs/results.md for a recorded run. Another task: ``--config.data.reasoning_gym.tasks=<name>``
with its fields as ``--config.data.reasoning_gym.task_config_json='{"<name>": {...}}'`` (a chat
model and ``answer_format="answer_tag"`` for tasks whose questions need words).
"""

import string

from rlvr_jax.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/reasoning_gym"
  c.model.update(
    source="tiny",
    hidden_size=64,
    intermediate_size=256,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
  )
  c.tokenizer.kind = "char"
  c.tokenizer.alphabet = string.ascii_letters + "="
  c.data.source = "reasoning_gym"
  c.reward.name = "reasoning_gym"  # the task's own score_answer
  c.data.reasoning_gym.tasks = "spell_backward"
  c.data.reasoning_gym.task_config = {"spell_backward": dict(min_word_len=3, max_word_len=5)}
  c.data.reasoning_gym.size = 4000
  c.data.reasoning_gym.answer_format = "raw"
  c.data.reasoning_gym.prompt_template = "{metadata[word]}="
  c.data.num_eval = 200
  c.warm_start.update(num_steps=100, batch_size=64, learning_rate=3e-3)
  c.sampling.update(num_samples=8, temperature=1.0, max_new_tokens=6)
  c.rl.update(num_steps=60, prompts_per_step=32, advantage="grpo", zero_variance="mask")
  c.objective.name = "grpo"
  c.optim.update(learning_rate=1e-3, grad_clip=1.0)
  c.eval.update(every=20, num_samples=4)
  c.checkpoint.every = 20
  return c
