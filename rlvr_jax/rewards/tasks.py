"""Built-in procedural tasks (arithmetic, countdown): generators and answer rewards.

Generators are pure Python, deterministic given a seed (an int or a ``numpy.random.Generator``),
and return plain dicts the data pipeline can use directly:

  make_arithmetic_problem(rng, ...) -> {"prompt_text", "answer"}
  make_countdown_problem(rng, ...)  -> {"prompt_text", "numbers", "target"}

Countdown expressions are checked with ``ast`` and evaluated with exact fractions, never ``eval``.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections import Counter
from fractions import Fraction
from typing import Any

import numpy as np

from rlvr_jax.rewards import protocol
from rlvr_jax.rewards.math_reward import _ANSWER_TAG_RE, _as_text, extract_answer, parse_number

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def _rng(rng: Any) -> np.random.Generator:
  if isinstance(rng, np.random.Generator):
    return rng
  if isinstance(rng, int | np.integer):
    return np.random.default_rng(int(rng))
  raise TypeError(f"rng must be an int seed or numpy.random.Generator, got {type(rng)}")


def make_arithmetic_problem(
  rng: Any, *, num_terms: int = 3, max_value: int = 99, ops: str = "+-*"
) -> dict[str, Any]:
  """An integer expression like ``12 + 7 * 3`` (standard operator precedence).

  Returns {"prompt_text": str, "answer": str (the integer value)}.
  """
  if num_terms < 2:
    raise ValueError(f"num_terms must be >= 2, got {num_terms}")
  bad = set(ops) - set(_OPS)
  if not ops or bad:
    raise ValueError(f"ops must be a non-empty subset of '+-*', got {ops!r}")
  gen = _rng(rng)
  terms = [int(v) for v in gen.integers(0, max_value + 1, size=num_terms)]
  chosen = [ops[int(i)] for i in gen.integers(0, len(ops), size=num_terms - 1)]
  expression = " ".join(
    [str(terms[0])] + [f"{op} {t}" for op, t in zip(chosen, terms[1:], strict=True)]
  )
  value = _safe_eval(expression)
  prompt = (
    f"Compute {expression}. Think step by step, then give the final answer as an integer in "
    "<answer></answer> tags."
  )
  return {"prompt_text": prompt, "answer": str(int(value))}


def make_countdown_problem(
  rng: Any, *, num_numbers: int = 4, max_number: int = 99, max_target: int = 999
) -> dict[str, Any]:
  """Countdown: reach ``target`` with + - * / using each of ``numbers`` at most once.

  The target is built from a random expression over all the numbers (exact division only), so a
  solution always exists. Returns {"prompt_text", "numbers": list[int], "target": int}.
  """
  if num_numbers < 2:
    raise ValueError(f"num_numbers must be >= 2, got {num_numbers}")
  gen = _rng(rng)
  while True:
    numbers = [int(v) for v in gen.integers(1, max_number + 1, size=num_numbers)]
    order = [numbers[int(i)] for i in gen.permutation(num_numbers)]
    value = Fraction(order[0])
    for number in order[1:]:
      op = "+-*/"[int(gen.integers(0, 4))]
      if op == "/" and value % number == 0:
        value = value / number
      elif op == "-" and value - number > 0:
        value = value - number
      elif op == "*" and value * number <= max_target:
        value = value * number
      else:
        value = value + number
    if 0 < value <= max_target and value.denominator == 1:
      break
  target = int(value)
  prompt = (
    f"Using the numbers {numbers}, create an equation that equals {target}. You can use basic "
    "arithmetic operations (+, -, *, /) and each number at most once. Show your work, then give "
    "the expression in <answer></answer> tags, for example <answer>(1 + 2) / 3</answer>."
  )
  return {"prompt_text": prompt, "numbers": numbers, "target": target}


_ALLOWED_BINOPS = {
  ast.Add: lambda a, b: a + b,
  ast.Sub: lambda a, b: a - b,
  ast.Mult: lambda a, b: a * b,
  ast.Div: lambda a, b: a / b,
}


def _safe_eval(expression: str, used: list[int] | None = None) -> Fraction:
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
    value = _safe_eval(expression, used)
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
    return {
      "reward": float(correct),
      "correct": float(correct),
      "has_answer": float(pred is not None),
    }
