"""Label-free RL on the embedded default task: TTRL majority vote instead of the answer check.

Purpose: the default task (experiments/default.py: a tiny char-level model warm-started by a
teacher that forgets the carry in 70% of its demonstrations) trained with NO reference answers.
Each prompt's 8 samples vote; a sample is rewarded 1 if its answer is the group's most frequent
one (TTRL, arXiv 2504.16084; ``rewards.MajorityVoteReward``). The reference answers are used only
for held-out evaluation and the ``accuracy/mean`` monitor (the reward reports the true outcome as
``correct``), so ``rl.zero_variance`` must be ``keep`` (``mask`` would read labels).

Command:
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/python -m rlvr_jax.main \\
    --config=experiments/ttrl_default.py

Expected result (2-core CPU, a few minutes): held-out greedy accuracy about 0.48 -> 0.57 within
25 steps, then flat: majority vote sharpens the policy toward its own most frequent answers,
which helps where the majority is right and stops where it is the teacher's carry error
(``reward/label_accuracy``, ``reward/agreement_rate`` and ``reward/answer_diversity`` are the
collapse monitor). With the default's lr 1e-3 it collapses instead. docs/results.md records
both, and a milder warm start (``--config.warm_start.drop_carry_prob=0.3``) where it rises and
then declines.
"""

import os

from rlvr_jax import cli


def _default_config():
  """experiments/default.py's config, loaded by path (experiments/ is not a package)."""
  return cli.load_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), "default.py"))


def get_config():
  c = _default_config()
  c.workdir = "runs/ttrl_default"
  c.reward.name = "majority_vote"
  c.rl.zero_variance = "keep"
  # The default's lr 1e-3 overshoots on the first update (the true reward then corrects it; the
  # pseudo-reward amplifies it and collapses within 10-25 steps, docs/results.md).
  c.optim.learning_rate = 1e-4
  return c
