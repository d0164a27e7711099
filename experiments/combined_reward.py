"""A combined reward from the config: exact match + a DAPO overlong penalty, gated by a format check.

Purpose: show ``config.reward.components`` end to end on the embedded default task
(``experiments/default.py``: tiny model, flawed-teacher warm start, two-number addition). The
reward is

    R = format * (exact + overlong)
    exact:    ArithmeticReward, 1 if the answer is exactly right, else 0
    overlong: OverlongReward with L_max = 8 tokens (sampling.max_new_tokens, the default),
              L_buf = 4: 0 up to 4 tokens, linear down to -1 at 8 (correct answers take 2-3
              tokens with EOS)
    format:   FormatReward gate, 1 if the completion is 1-3 digits and nothing else, else 0

with the budget raised from 5 to 8 new tokens so that rambling has room to be penalised.
``rl.zero_variance='keep'``: groups whose exact-match outcome is constant still carry the length
and format signal (``mask`` would drop them). Every component is logged as
``reward/<name>/mean`` and ``reward/<name>/failures`` (JSONL, TensorBoard, progress bar).

Command:
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/python -m rlvr_jax.main \
    --config=experiments/combined_reward.py
Any field is overridable, e.g. ``--config.reward.components.overlong.weight=0.5`` or
``--config.reward.components.overlong.kwargs.buffer_len=2``.

Expected result (2-core CPU, a few minutes): held-out greedy accuracy rises from about 0.5 to
about 0.9 as in the default run; the warm-started model already answers with short digit strings,
so the format gate and the length term start and stay near their best values (format about 1,
overlong about 0): they guard against drift rather than drive learning here. See
docs/results.md for a recorded run.
"""

import os

from rlvr_jax import cli
from rlvr_jax.train.reward_config import reward_component


def _default_config():
  """experiments/default.py's config, loaded by path (experiments/ is not a package)."""
  return cli.load_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), "default.py"))


def get_config():
  c = _default_config()
  c.workdir = "runs/combined_reward"
  c.sampling.max_new_tokens = 8
  c.rl.zero_variance = "keep"
  c.reward.name = ""  # the components below define the reward
  c.reward.components.exact = reward_component("arithmetic")
  c.reward.components.overlong = reward_component("overlong", buffer_len=4)
  c.reward.components.format = reward_component("format", gate=True, template="[0-9]{1,3}")
  return c
