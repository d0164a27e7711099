"""Answer rewards of the built-in procedural tasks (arithmetic, countdown).

The problems themselves come from ``rlvr_jax.data.tasks`` (deterministic, with train / held-out
splits). Expressions are checked with ``ast`` and evaluated with exact fractions, never ``eval``
(``evaluate_expression``).
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections import Counter
from fractions import Fraction

from rlvr_jax.rewards import protocol
from rlvr_jax.rewards.math_reward import _ANSWER_TAG_RE, _as_text, extract_answer, parse_number

_ALLOWED_BINOPS = {
  ast.Add: lambda a, b: a + b,
  ast.Sub: lambda a, b: a - b,
  ast.Mult: lambda a, b: a * b,
  ast.Div: lambda a, b: a / b,
}


def evaluate_expression(expression: str, used: list[int] | None = None) -> Fraction:
  """Exact value of an expression made only of integers, + - * / and parentheses.

  Raises ValueError for anything else (names, calls, powers, floats) or division by zero. The
  integer literals are appended to ``used`` when given.
  """
  if len(expression) > 300:
    raise ValueError("expression too long")
  tree = ast.parse(expression.strip(), mode="eval")

  def walk(node: ast.AST) -> Fraction:
    if isinstance(node, ast.BinOp) and type(node.op) in _ALLOWED_BINOPS:
      left, right = walk(node.left), walk(node.right)
      if isinstance(node.op, ast.Div) and right == 0:
        raise ValueError("division by zero")
      return _ALLOWED_BINOPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
      value = walk(node.operand)
      return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Constant) and type(node.value) is int:
      if used is not None:
        used.append(node.value)
      return Fraction(node.value)
    raise ValueError(f"disallowed syntax: {type(node).__name__}")

  return walk(tree.body)


def check_countdown(expression: str | None, numbers: list[int], target: int) -> tuple[bool, bool]:
  """(valid, correct): valid if the expression parses, uses only +-*/ and each given number at
  most once; correct if it is valid and evaluates exactly to ``target``."""
  if expression is None:
    return False, False
  expression = expression.split("=")[0].replace("×", "*").replace("÷", "/")
  used: list[int] = []
  try:
    value = evaluate_expression(expression, used)
  except (ValueError, SyntaxError, RecursionError):
    return False, False
  available = Counter(int(n) for n in numbers)
  if any(count > available[n] for n, count in Counter(used).items()):
    return False, False
  return True, value == Fraction(int(target))


@dataclasses.dataclass(frozen=True)
class CountdownReward(protocol.ItemReward):
  """Countdown answer reward (TinyZero-style): ``correct_value`` if the last ``<answer>``
  expression is valid and hits the target, ``format_value`` if it is valid but misses, else 0.
  Needs the per-row fields ``numbers`` and ``target``."""

  correct_value: float = 1.0
  format_value: float = 0.1
  name: str = "countdown"

  def score_item(self, prompt: str, completion: str, *, numbers=None, target=None, **_) -> dict:
    if numbers is None or target is None:
      raise ValueError("CountdownReward needs the example fields numbers= and target=")
    matches = _ANSWER_TAG_RE.findall(_as_text(completion))
    valid, correct = check_countdown(matches[-1] if matches else None, numbers, target)
    reward = self.correct_value if correct else (self.format_value if valid else 0.0)
    return {"reward": reward, "correct": float(correct), "has_answer": float(valid)}


@dataclasses.dataclass(frozen=True)
class ArithmeticReward(protocol.ItemReward):
  """1 if the extracted answer (``<answer>`` tag, then ``\\boxed{}``, then the last number) is
  exactly the integer ``answer``, else 0. Needs the per-row field ``answer``."""

  extract: tuple[str, ...] = ("answer_tag", "boxed", "last_number")
  name: str = "arithmetic"

  def score_item(self, prompt: str, completion: str, *, answer=None, **_) -> dict:
    if answer is None:
      raise ValueError("ArithmeticReward needs the example field answer=")
    pred = extract_answer(_as_text(completion), self.extract)
    value = None
    if pred is not None:
      value = parse_number(re.sub(r"(?<=\d),(?=\d{3})", "", pred).strip().rstrip("."))
    correct = value is not None and value == Fraction(str(answer).strip())
    marked = tuple(m for m in self.extract if m != "last_number")
    return {
      "reward": float(correct),
      "correct": float(correct),
      "has_answer": float(pred is not None),
      # the answer is in the asked-for form (tag / box), not only a number found in the text
      "formatted": float(bool(marked) and extract_answer(_as_text(completion), marked) is not None),
    }
