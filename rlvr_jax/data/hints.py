"""GHPO's guided hints: a prompt whose every rollout failed is retried with part of its reference
solution appended (Liu et al., "GHPO: Adaptive Guidance for Stable and Efficient LLM
Reinforcement Learning", arXiv 2507.10628; METHODS.md 6.4).

For prompt x with reference solution s* (the record's ``solution`` field, ids or text):

  x' = x + marker + s*[:ceil(omega |s*|)],   omega in HINT_FRACTIONS = (0.25, 0.5, 0.75),

stepping to the next fraction while a hinted group still has no success (``next_stage``). The
hint is part of the prompt, so its tokens never enter the loss. What the paper leaves open and is
chosen here: the fraction counts the solution's tokenizer ids when ``tokenize`` is given, else its
whitespace-separated words; the stages advance within one RL step (a failed hinted group is
resampled at the next fraction, up to the last); a group that still fails at the last fraction is
kept as it is (a zero-variance group, handled by ``rl.zero_variance``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

HINT_FRACTIONS = (0.25, 0.5, 0.75)
DEFAULT_MARKER = "\nHint (the start of a solution): "


def needs_hint(correct) -> np.ndarray:
  """[P] bool: groups with no success, from ``correct`` [P, G] (NaN or False = no success)."""
  c = np.asarray(correct, np.float64)
  if c.ndim != 2:
    raise ValueError(f"correct must be [P, G], got shape {c.shape}")
  return ~np.any(np.nan_to_num(c, nan=0.0) > 0, axis=1)


def hint_prefix(
  solution: str, fraction: float, *, tokenize: Callable[[str], Sequence[int]] | None = None,
  detokenize: Callable[[Sequence[int]], str] | None = None,
) -> str:  # fmt: skip
  """The first ceil(``fraction`` x n) units of ``solution``: tokenizer ids when ``tokenize`` and
  ``detokenize`` are given, else whitespace-separated words (joined by single spaces)."""
  if not 0.0 < fraction <= 1.0:
    raise ValueError(f"hint fraction must be in (0, 1], got {fraction}")
  if (tokenize is None) != (detokenize is None):
    raise ValueError("give both tokenize and detokenize, or neither")
  if tokenize is not None:
    ids = list(tokenize(solution))
    return detokenize(ids[: math.ceil(fraction * len(ids))])
  words = solution.split()
  return " ".join(words[: math.ceil(fraction * len(words))])


def hinted_prompt(prompt: str, solution: str, stage: int, *, marker: str = DEFAULT_MARKER,
                  fractions: Sequence[float] = HINT_FRACTIONS, **tokenizer) -> str:  # fmt: skip
  """``prompt`` + ``marker`` + the hint of stage ``stage`` (0-based: ``fractions[stage]``)."""
  if not 0 <= stage < len(fractions):
    raise ValueError(f"hint stage {stage} is outside 0..{len(fractions) - 1}")
  if not solution or not solution.strip():
    raise ValueError("GHPO needs a reference solution: the record's 'solution' field is empty")
  return prompt + marker + hint_prefix(solution, fractions[stage], **tokenizer)


def next_stage(stage: int, any_success: bool, *, num_stages: int = len(HINT_FRACTIONS)):
  """The stage to sample a group at next, or None when it is done: after a success, or after
  the last stage."""
  if any_success or stage + 1 >= num_stages:
    return None
  return stage + 1
