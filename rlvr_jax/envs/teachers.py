"""Scripted teacher policies for warm-start demonstrations of multi-turn episodes.

A teacher is a ``play.PolicyFn``: it reads each live row's context (decoded to text) and returns
its next action ids. The multi-turn trainer plays ``warm_start.num_steps`` batches of teacher
episodes with ``envs.play_episodes`` and fits the action tokens (``policy_mask``) before RL.
"""

from __future__ import annotations

import random
import re

_HINT_RE = re.compile(r"(-?\d+)\s*(higher|lower)")


def guess_number_teacher(tokenizer, *, low: int = 1, high: int = 16, mode: str = "random",
                         seed: int = 0):  # fmt: skip
  """A teacher for ``GuessNumberEnv``: keeps the interval the hints allow and guesses in it.

  ``mode="bisect"``: the midpoint (binary search, the optimum: at most ceil(log2(n + 1)) turns);
  ``"random"``: a uniform guess in the interval (consistent but slower: about 2 ln n turns), the
  flawed teacher the RL run starts from.
  """
  if mode not in ("bisect", "random"):
    raise ValueError(f"mode must be 'bisect' or 'random', got {mode!r}")
  rng = random.Random(seed)
  eos = list(tokenizer.eos_ids[:1])

  def policy(contexts, budgets):
    out = {}
    for b, ids in contexts.items():
      lo, hi = low, high
      for value, hint in _HINT_RE.findall(tokenizer.decode(list(ids))):
        if hint == "higher":
          lo = max(lo, int(value) + 1)
        else:
          hi = min(hi, int(value) - 1)
      hi = max(hi, lo)
      guess = (lo + hi) // 2 if mode == "bisect" else rng.randint(lo, hi)
      action = tokenizer.encode(str(guess), add_special_tokens=False) + eos
      out[b] = (action[: budgets[b]], None)
    return out

  return policy
