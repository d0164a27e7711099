"""Verifiable math answer reward (METHODS.md §5.1).

Extraction modes (each returns a string or None): ``boxed`` (last ``\\boxed{...}`` / ``\\fbox{...}``
with brace matching), ``answer_tag`` (last ``<answer>...</answer>``), ``answer_line`` (last
``Answer: ...``), ``gsm8k`` (last ``#### <number>``), ``last_number``.

Equivalence ladder, first success wins:
  1. normalised string equality (Minerva-style normalisation);
  2. numeric: integers, decimals, a/b, ``\\frac{a}{b}``, percentages are *not* rescaled;
     |x - y| <= tol * max(1, |y|) with tol = 1e-6; two plain numbers that differ are unequal
     without going further;
  3. symbolic and structured (sets, intervals, tuples, matrices) through ``math-verify``, with its
     own signal-based timeouts disabled and ours put in their place: a SIGALRM that raises
     :class:`~rlvr_jax.rewards.protocol.ItemTimeout` (a BaseException, so math-verify's blanket
     ``except Exception`` cannot turn it into a silent "wrong"). It only works on a main thread, so
     it is applied there (inside runtime workers) and skipped elsewhere; the runtime's per-item
     wall-clock timeout is the backstop that also covers hangs inside C code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
import signal
import threading
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from rlvr_jax.rewards import protocol
from rlvr_jax.rewards.protocol import ItemTimeout

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_ANSWER_LINE_RE = re.compile(r"answer\s*:\s*(.+)", re.IGNORECASE)
_GSM8K_RE = re.compile(r"####\s*\$?\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")
_NUMBER_RE = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?|-?\.[0-9]+")
_MAX_ANSWER_CHARS = 1000  # longer "answers" are treated as no answer (math-verify would crawl)


def extract_boxed(text: str) -> str | None:
  """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``); None if absent or unbalanced."""
  matches = list(_BOX_RE.finditer(text))
  if not matches:
    return None
  start = matches[-1].end()
  depth = 1
  for pos in range(start, len(text)):
    char = text[pos]
    if char == "{":
      depth += 1
    elif char == "}":
      depth -= 1
      if depth == 0:
        return text[start:pos].strip()
  return None


def extract_answer(text: str, modes: Sequence[str] = ("boxed", "last_number")) -> str | None:
  """The first answer found by the given extraction modes (tried in order)."""
  for mode in modes:
    answer = _EXTRACTORS[mode](text)
    if answer is not None and answer.strip():
      return answer.strip()
  return None


def _answer_tag(text: str) -> str | None:
  matches = _ANSWER_TAG_RE.findall(text)
  if not matches:
    return None
  inner = matches[-1]
  return extract_boxed(inner) or inner


def _answer_line(text: str) -> str | None:
  matches = _ANSWER_LINE_RE.findall(text)
  return matches[-1].strip().rstrip(".") if matches else None


def _gsm8k(text: str) -> str | None:
  matches = _GSM8K_RE.findall(text)
  return matches[-1].replace(",", "") if matches else None


def _last_number(text: str) -> str | None:
  matches = _NUMBER_RE.findall(text[-2000:]) or _NUMBER_RE.findall(text)
  return matches[-1].rstrip(",") if matches else None


_EXTRACTORS = {
  "boxed": extract_boxed,
  "answer_tag": _answer_tag,
  "answer_line": _answer_line,
  "gsm8k": _gsm8k,
  "last_number": _last_number,
}

# --- normalisation ---------------------------------------------------------------------------------

_UNIT_WORDS = (
  "degrees|degree|cm|centimeters|centimeter|meters|meter|km|kilometers|inches|inch|feet|foot|"
  "units|unit|sq|square|dollars|dollar|cents|cent|hours|hour|minutes|minute|seconds|second|mph|"
  "kg|grams|gram|pounds|pound|mm|miles|mile|ft|m|s"
)
_UNIT_RE = re.compile(
  rf"(?:\\(?:text|mbox|mathrm)\{{\s*(?:{_UNIT_WORDS})\^?\d?\s*\}})|(?<=[\d}}])\s*(?:{_UNIT_WORDS})(?:\^?\d)?\b"
)
_UNWRAP_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox|overline|boxed|displaystyle)\s*\{([^{}]*)\}")


def normalize_answer(answer: str) -> str:
  """Minerva-style string normalisation (METHODS.md §5.1 steps 1-8)."""
  text = str(answer).strip()
  if "=" in text:
    text = text.split("=")[-1]
  text = text.replace("\\!", "").replace("\\;", "").replace("\\,", "").replace("\\ ", "")
  text = text.replace("{,}", "").replace("\\$", "").replace("$", "")
  text = text.replace("\\left", "").replace("\\right", "").replace("\\dfrac", "\\frac")
  text = text.replace("\\tfrac", "\\frac").replace("^\\circ", "").replace("^{\\circ}", "")
  text = text.replace("°", "").replace("\\%", "").replace("%", "")
  text = _UNIT_RE.sub("", text)
  for _ in range(3):
    text = _UNWRAP_RE.sub(r"\1", text)
  text = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", text)
  text = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", text)
  text = re.sub(r"\\sqrt(\d)", r"\\sqrt{\1}", text)
  text = text.replace(" ", "").rstrip(".")
  if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", text):
    text = text.replace(",", "")
  return text.strip()


_FRAC_RE = re.compile(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}")


def parse_number(text: str) -> Fraction | None:
  """Exact value of an integer, decimal, a/b or ``\\frac{a}{b}`` string; None otherwise."""
  text = text.strip()
  try:
    if re.fullmatch(r"-?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d{1,3})?", text):
      return Fraction(text)
    match = re.fullmatch(r"(-?\d+)/(-?\d+)", text)
    if match:
      return Fraction(int(match[1]), int(match[2]))
    match = _FRAC_RE.fullmatch(text)
    if match:
      value = Fraction(int(match[2]), int(match[3]))
      return -value if match[1] else value
  except (ValueError, ZeroDivisionError):
    return None
  return None


@contextlib.contextmanager
def _alarm(seconds: float | None):
  """Raise ItemTimeout after ``seconds`` (main thread only; a no-op elsewhere)."""
  if not seconds or threading.current_thread() is not threading.main_thread():
    yield
    return

  def handler(signum, frame):
    raise ItemTimeout(f"math-verify exceeded {seconds}s")

  previous = signal.signal(signal.SIGALRM, handler)
  signal.setitimer(signal.ITIMER_REAL, seconds)
  try:
    yield
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def _wrap_latex(s: str) -> str:
  return s if "$" in s or "\\boxed" in s else f"${s}$"


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str):
  """Parsed reference answer; cached because the G samples of a prompt share it (sympy objects
  are immutable). A parse cut short by the alarm raises, so it is never cached."""
  import math_verify  # noqa: PLC0415

  return math_verify.parse(_wrap_latex(gold), parsing_timeout=None)


def _math_verify_equal(pred: str, gold: str, timeout_s: float | None) -> bool:
  import math_verify  # noqa: PLC0415  (heavy: sympy + antlr; imported in workers on first use)
  import math_verify.grader
  import math_verify.parser

  # We disable math-verify's own signal timeouts on purpose (ours replace them): skip its warning.
  math_verify.grader.TIMEOUT_WARNING_SHOWN = math_verify.parser.TIMEOUT_WARNING_SHOWN = True

  with _alarm(timeout_s):
    gold_parsed = _parse_gold(gold)
    pred_parsed = math_verify.parse(_wrap_latex(pred), parsing_timeout=None)
    if not gold_parsed or not pred_parsed:
      return False
    return bool(math_verify.verify(gold_parsed, pred_parsed, timeout_seconds=None))


def math_equal(
  pred: str | None,
  gold: str,
  *,
  tol: float = 1e-6,
  use_math_verify: bool = True,
  timeout_s: float | None = 5.0,
) -> bool:
  """Whether the extracted answer ``pred`` equals the reference ``gold`` (the ladder above).

  Raises ItemTimeout if the symbolic step runs past ``timeout_s`` (on a main thread).
  """
  if pred is None or not str(pred).strip() or len(pred) > _MAX_ANSWER_CHARS:
    return False
  gold = str(gold)
  gold = extract_boxed(gold) or gold
  pred_norm, gold_norm = normalize_answer(pred), normalize_answer(gold)
  if pred_norm and pred_norm == gold_norm:
    return True
  x, y = parse_number(pred_norm), parse_number(gold_norm)
  if x is not None and y is not None:
    if x.denominator == 1 and y.denominator == 1:
      return x == y  # integers are exact: 999999 is not 1000000
    return abs(x - y) <= tol * max(1, abs(y))
  if not use_math_verify:
    return False
  return _math_verify_equal(pred, gold, timeout_s)


_WARMUP_PAIRS = (
  ("\\frac{1}{2}", "0.5"),
  ("(x+1)^2", "x^2+2x+1"),
  ("\\sqrt{8}", "2\\sqrt{2}"),
  ("[1,2)", "[1, 2)"),
  ("\\{1, 2\\}", "\\{2, 1\\}"),
  ("x = 3", "3"),
)


@dataclasses.dataclass(frozen=True)
class MathReward(protocol.ItemReward):
  """Math answer correctness. Needs the example field ``answer`` (per row).

  Reward: ``correct_value`` if correct, ``wrong_value`` if an answer was extracted but is wrong,
  ``no_answer_value`` (default: ``wrong_value``) if nothing could be extracted. DAPO uses
  (1, -1, -1). Scores carry ``correct`` (the outcome) and ``has_answer``.
  """

  extract: tuple[str, ...] = ("boxed", "last_number")
  correct_value: float = 1.0
  wrong_value: float = 0.0
  no_answer_value: float | None = None
  use_math_verify: bool = True
  verify_timeout_s: float | None = 5.0
  tol: float = 1e-6
  name: str = "math"

  def __post_init__(self):
    unknown = [m for m in self.extract if m not in _EXTRACTORS]
    if unknown:
      raise ValueError(f"unknown extraction modes {unknown}; choose from {sorted(_EXTRACTORS)}")

  def warmup(self) -> None:
    """Imports math-verify and runs one check of each kind (1-2 s cold: sympy's simplification,
    radicals, sets and intervals load lazily), called by reward workers before their first item
    so that none of it counts against an item's timeout."""
    if self.use_math_verify:
      for pred, gold in _WARMUP_PAIRS:
        _math_verify_equal(pred, gold, None)

  def score_item(self, prompt: str, completion: str, *, answer: Any = None, **_: Any) -> dict:
    if answer is None:
      raise ValueError("MathReward needs the example field answer= (reference answers per row)")
    pred = extract_answer(_as_text(completion), self.extract)
    correct = math_equal(
      pred,
      str(answer),
      tol=self.tol,
      use_math_verify=self.use_math_verify,
      timeout_s=self.verify_timeout_s,
    )
    if correct:
      reward = self.correct_value
    elif pred is None:
      reward = self.wrong_value if self.no_answer_value is None else self.no_answer_value
    else:
      reward = self.wrong_value
    return {
      "reward": reward,
      "correct": float(correct),
      "has_answer": float(pred is not None),
      "extracted_answer": None if pred is None else pred[:200],
    }

  def combine(self, scores, **fields: Any) -> protocol.RewardOutput:
    extracted = np.array([None if s is None else s["extracted_answer"] for s in scores], object)
    info = {
      "correct": protocol.scores_column(scores, "correct"),
      "has_answer": protocol.scores_column(scores, "has_answer"),
      "extracted_answer": extracted,
    }
    return protocol.RewardOutput(rewards=protocol.scores_column(scores, "reward"), info=info)


def _as_text(completion: Any) -> str:
  """Completions may arrive as bytes (binary garbage): decode leniently, never raise."""
  if isinstance(completion, bytes):
    return completion.decode("utf-8", errors="replace")
  return str(completion)
