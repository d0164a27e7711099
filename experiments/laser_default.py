"""LaSeR on the embedded default task: GRPO plus the last-token self-reward auxiliary loss.

Purpose: the default task (experiments/default.py) with LaSeR's auxiliary loss (arXiv
2510.14943; ``config.auxiliary_loss``, ``losses.last_token_self_reward_loss``): after each
completion's last token (its EOS) the policy's log-probability of a pre-specified token z_c
(``*``, which never appears in an answer) gives a self-reward r_s = β (log π(z_c | x, y) − c_ref),
trained by (α/N) Σ (r_s − r_v)² toward the verifier reward r_v on the same forward pass as the
policy loss. The model thereby learns to say, for free, whether its own answer is right:
``laser/sign_accuracy`` (r_s > ½ agrees with r_v > ½) is that self-verification accuracy on the
train batch; ``laser/mse`` and ``laser/self_reward`` are logged too. Reasoning is unchanged
(z_c is read after EOS, where sampling stops).

Command:
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/python -m rlvr_jax.main \\
    --config=experiments/laser_default.py

Wall time (measured on the loaded, shared 2-core machine): RL phase 280 s for 50 steps
(``--config.rl.num_steps=50``, the recorded run) plus the warm start.
Expected result (docs/results.md, "LaSeR"; 50 steps): held-out accuracy 0.475 -> 0.817, as the
default run's; log π(z_c) rises from −10.4 to −3.7 and the mean self-reward tracks the batch
accuracy, but sign accuracy (0.62) is not yet above the "always right" rate.
"""

import os

from rlvr_jax import cli


def _default_config():
  """experiments/default.py's config, loaded by path (experiments/ is not a package)."""
  return cli.load_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), "default.py"))


def get_config():
  c = _default_config()
  c.workdir = "runs/laser_default"
  c.auxiliary_loss.name = "last_token_self_reward"
  c.auxiliary_loss.token = "*"
  # β_v = 0.1 and c_ref = −10: r_s spans [0, 1] as log π(z_c) goes from −10 (an unused token of
  # this 17-token vocabulary) to 0. α = 1 (the paper's loss weight).
  c.auxiliary_loss.kwargs.beta = 0.1
  c.auxiliary_loss.kwargs.ref_logp = -10.0
  c.auxiliary_loss.kwargs.coef = 1.0
  return c
