"""Format reward (METHODS.md §5.2): 1 if the completion matches a template, else 0.

Templates:
  ``think_answer``: exactly one ``<think>...</think>`` followed by exactly one
    ``<answer>...</answer>``, nothing but whitespace around them (dot matches newline).
  ``answer``: exactly one ``<answer>...</answer>`` and nothing after it.
  ``boxed``: exactly one ``\\boxed{...}`` with balanced braces.
  any other string: a regular expression that must match the whole completion (DOTALL).
Off by default in the recipes: strict format terms hurt zero-RL on weak base models (SimpleRL-Zoo).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from rlvr_jax.rewards import protocol
from rlvr_jax.rewards.math_reward import _as_text, extract_boxed

_THINK_ANSWER_RE = re.compile(
  r"\s*<think>(?:(?!</?think>|</?answer>).)*</think>\s*<answer>(?:(?!</?answer>|</?think>).)*"
  r"</answer>\s*",
  re.DOTALL,
)
_ANSWER_RE = re.compile(r"(?:(?!</?answer>).)*<answer>(?:(?!</?answer>).)*</answer>\s*", re.DOTALL)


def format_ok(completion: str, template: str = "think_answer") -> bool:
  """Whether ``completion`` follows ``template`` (see module docstring)."""
  text = _as_text(completion)
  if template == "think_answer":
    return _THINK_ANSWER_RE.fullmatch(text) is not None
  if template == "answer":
    return _ANSWER_RE.fullmatch(text) is not None
  if template == "boxed":
    return len(re.findall(r"\\boxed\s*\{", text)) == 1 and extract_boxed(text) is not None
  return re.fullmatch(template, text, re.DOTALL) is not None


@dataclasses.dataclass(frozen=True)
class FormatReward(protocol.ItemReward):
  """``ok_value`` if the completion follows ``template``, else ``bad_value`` (use -1 for the
  "override" mode of §5.2 combined additively, or a gate in :class:`CombinedReward`)."""

  template: str = "think_answer"
  ok_value: float = 1.0
  bad_value: float = 0.0
  name: str = "format"

  def __post_init__(self):
    if self.template not in ("think_answer", "answer", "boxed"):
      re.compile(self.template)  # a bad pattern fails here, at construction, not in a worker

  def score_item(self, prompt: str, completion: str, **_: Any) -> dict:
    ok = format_ok(completion, self.template)
    return {"reward": self.ok_value if ok else self.bad_value, "format_ok": float(ok)}

  def combine(self, scores, **fields: Any) -> protocol.RewardOutput:
    return protocol.RewardOutput(
      rewards=protocol.scores_column(scores, "reward"),
      info={"format_ok": protocol.scores_column(scores, "format_ok")},
    )
