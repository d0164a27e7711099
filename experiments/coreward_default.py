"""Co-Reward on the embedded default task: agreement across paraphrased prompts, no answers.

Purpose: Co-Reward (arXiv 2508.00410; ``rewards.CoReward``) on the default task
(experiments/default.py): the train stream comes in paraphrase pairs (``data.task.paraphrase``:
``27+48=`` and ``48+27=`` share a ``pair_key``), and a sample is rewarded 1 when its answer equals
the majority answer of the OTHER version's 8 samples (cross-referenced, so a group cannot reward
itself for agreeing with itself). No reference answer enters the reward; it appears only in the
held-out evaluation and the monitors (the reward reports the true outcome as ``correct``), so
``rl.zero_variance`` is ``keep``. The collapse monitor is logged under ``reward/``:
``agreement_rate``, ``answer_diversity``, ``cross_agreement``, ``label_accuracy``.

Command:
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/python -m rlvr_jax.main \\
    --config=experiments/coreward_default.py

Wall time (measured on the loaded, shared 2-core machine): RL phase 93 s plus the warm start.
Expected result (docs/results.md, "Co-Reward"; compared with TTRL on the same paired stream at
equal steps): held-out greedy accuracy 0.604 -> 0.567 (TTRL 0.554), agreement rising to ~0.92;
``a+b`` / ``b+a`` agree from the start (cross_agreement 0.94), so Co-Reward behaves like TTRL.
"""

import os

from rlvr_jax import cli
from rlvr_jax.train.reward_config import reward_component


def _default_config():
  """experiments/default.py's config, loaded by path (experiments/ is not a package)."""
  return cli.load_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), "default.py"))


def get_config():
  c = _default_config()
  c.workdir = "runs/coreward_default"
  c.data.task.paraphrase = True
  c.reward.name = ""
  # Held-out groups have no partner: their own vote (unpaired='self'; evaluation reads only the
  # true outcome, never this reward).
  c.reward.components.co_reward = reward_component("co_reward", unpaired="self")
  c.reward.example_fields = ("pair_key",)
  c.rl.zero_variance = "keep"
  c.optim.learning_rate = 1e-4  # as experiments/ttrl_default.py (1e-3 collapses a pseudo-reward)
  return c
