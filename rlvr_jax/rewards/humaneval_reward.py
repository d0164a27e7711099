"""HumanEval scoring: the program is the problem prompt completed by the model, run against the
problem's ``check`` in the code sandbox (``CodeReward``).

Per-row fields (``rlvr_jax.data.humaneval`` records): ``tests`` (one snippet: the asserts of the
problem's ``check`` over ``entry_point``, all of which must pass), ``code_prefix`` (the problem prompt) and ``entry_point``. The completion's
code (last fenced block, else the whole text) either continues the prompt or redefines the whole
function (``program``); reward = correct = 1 if ``check`` passes, else 0.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from rlvr_jax.rewards.code_reward import CodeReward, extract_code
from rlvr_jax.rewards.math_reward import _as_text


def program(code_prefix: str, code: str, entry_point: str) -> str:
  """The program to test for model ``code`` (already taken out of any code fence).

  If ``code`` defines ``entry_point`` itself (instruct models write the whole function), it runs
  after the prompt's own imports and helpers, with the prompt's stub closed by a ``pass`` body
  and then redefined by ``code``; otherwise ``code`` is the body that continues the prompt (the
  original HumanEval protocol).
  """
  if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE):
    return f"{code_prefix}    pass\n\n\n{code}\n"
  return code_prefix + code


@dataclasses.dataclass(frozen=True)
class HumanEvalReward(CodeReward):
  """``CodeReward`` on the program built from the HumanEval prompt and the completion."""

  name: str = "humaneval"

  def score_item(
    self,
    prompt: str,
    completion: str,
    *,
    tests=None,
    code_prefix=None,
    entry_point=None,
    **row: Any,
  ) -> dict:
    if code_prefix is None or entry_point is None:
      raise ValueError(
        "HumanEvalReward needs the example fields code_prefix= and entry_point= (HumanEval "
        "records from rlvr_jax.data.humaneval)"
      )
    code = extract_code(_as_text(completion))
    source = program(code_prefix, code, entry_point)
    # The composed program has no code fence, so CodeReward's extract_code keeps all of it.
    return super().score_item(prompt, source, tests=tests, **row)
