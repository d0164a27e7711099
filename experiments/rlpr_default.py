"""RLPR on a worked variant of the default task: the reward is the reference answer's likelihood.

Purpose: RLPR (arXiv 2506.18254; METHODS.md §5.7) needs a policy that reasons before a free-form
answer. The default task (experiments/default.py) with ``data.task.style="worked"``: the tiny
char-level model writes column working, ``>``, then the sum (``27+48=`` -> ``1507>75``: 7+8 = 15,
2+4+1 = 07). Its warm start comes from the flawed teacher, whose working AND answer drop the carry
in 70% of the demonstrations (``1506>65``). RL then uses no answer check: the reward is

  Δ = max(0, p̄(x, z, y*) − p̄(x, ∅, y*)),

the policy's mean per-token probability of the reference answer y* spliced after its own
working z (up to the ``>`` marker), minus the same without working (``config.model_reward``,
``name="rlpr"``, ``replace=True``). The verifier reward appears only in the monitors
(``accuracy/mean``) and the held-out evaluation. The baseline is the same run with the
exact-match verifier reward (the second command).

Commands (RLPR, then the verifier baseline at equal steps):
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/python -m rlvr_jax.main \\
    --config=experiments/rlpr_default.py
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/python -m rlvr_jax.main \\
    --config=experiments/rlpr_default.py --config.model_reward.name= \\
    --config.model_reward.replace=False --config.workdir=runs/rlpr_verifier

Wall time (measured on the loaded, shared 2-core machine): RL phase 624 s for RLPR (two extra
spliced scoring passes per step) and 146 s for the verifier run, plus the warm start (1-4 min).
Expected result (docs/results.md, "RLPR"): held-out greedy accuracy 0.596 -> ~0.95 by step 25
with either reward; the verifier run stays there (0.983 at 150), the RLPR run drifts after step
~105 (0.571 at 150: Δ does not score what follows the marker).
"""

import os

from rlvr_jax import cli


def _default_config():
  """experiments/default.py's config, loaded by path (experiments/ is not a package)."""
  return cli.load_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), "default.py"))


def get_config():
  c = _default_config()
  c.workdir = "runs/rlpr_default"
  c.tokenizer.alphabet = "0123456789+-*=>"
  c.data.task.style = "worked"
  c.sampling.max_new_tokens = 10  # 4 working + '>' + up to 3 answer digits + EOS
  c.model_reward.name = "rlpr"
  c.model_reward.marker = ">"
  c.model_reward.replace = True  # no verifier in the reward
  c.rl.zero_variance = "keep"  # 'mask' would read the verifier's outcome
  return c
