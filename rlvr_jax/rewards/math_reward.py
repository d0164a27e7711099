r"""Verifiable math answer reward (METHODS.md §5.1).

The final answer is found by :mod:`rlvr_jax.rewards.math_extract` (marked answers only unless
``fallback="last_number"``), then compared with the reference by this ladder:

  0. clean both sides (:func:`clean_answer`): unicode minus / root / pi / vulgar fractions, ``$``,
     ``\left``, ``\dfrac``, LaTeX spaces, thousands separators (``1,000``, ``1{,}000``,
     ``1\,000``, ``1 000``), units and currency after a number, degrees, a trailing percent sign
     (remembered), ``\text{}`` / ``\mathbf{}`` wrappers, ``x =`` on the left, ``(B)`` choices;
  1. split each side at top-level ``,`` ``;`` "or" "and" and expand ``\pm``. Several predicted
     answers against one reference are credited only if every one of them is right (hedging
     "3 or 4" is wrong); lists against lists match as multisets (solutions are unordered; tuples
     and intervals are bracketed, so they stay one part);
  2. a predicted answer that is malformed (unbalanced brackets, a dangling operator, an empty
     group, digits split by a space that is not a thousands separator) is wrong;
  3. normalised string equality;
  4. exact numbers: integers, decimals, ``1e3``, ``a \times 10^{b}``, ``a/b``, ``\frac{a}{b}``,
     ``a:b``, mixed numbers (``2\frac{1}{2}`` = 5/2), repeating decimals (``0.\overline{3}``).
     Integers compare exactly; otherwise |x - y| <= tol * max(1, |y|), tol = 1e-6. Percent: a
     predicted ``p%`` matches a reference p and a reference p/100; a bare predicted p matches a
     reference ``p%`` only as p. Two numbers that differ are unequal without going further;
  5. symbolic and structured (sets, intervals, tuples, matrices) through ``math-verify``, with its
     own signal-based timeouts disabled and ours put in their place: a SIGALRM that raises
     :class:`~rlvr_jax.rewards.protocol.ItemTimeout` (a BaseException, so math-verify's blanket
     ``except Exception`` cannot turn it into a silent "wrong"). It only works on a main thread, so
     it is applied there (inside runtime workers) and skipped elsewhere; the runtime's per-item
     wall-clock timeout is the backstop that also covers hangs inside C code.

The table of verdicts this ladder is held to is ``tests/data/math_grader_table.py``
(``tools/bench_grader.py`` scores it against math-verify alone; docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
import signal
import threading
import unicodedata
from fractions import Fraction
from typing import Any

import numpy as np

from rlvr_jax.rewards import protocol
from rlvr_jax.rewards.math_extract import (
  _ANSWER_TAG_RE,  # noqa: F401  (re-exported for rewards.tasks)
  MARKED_MODES,
  FinalAnswer,
  check_modes,
  extract_answer,
  extract_boxed,
  find_final_answer,
)
from rlvr_jax.rewards.math_extract import as_text as _as_text
from rlvr_jax.rewards.protocol import ItemTimeout

__all__ = [
  "FinalAnswer",
  "MathReward",
  "clean_answer",
  "extract_answer",
  "extract_boxed",
  "find_final_answer",
  "math_equal",
  "normalize_answer",
  "parse_number",
]

_MAX_ANSWER_CHARS = 1000  # longer "answers" are treated as no answer (math-verify would crawl)

# --- cleaning --------------------------------------------------------------------------------------

_UNICODE = {
  "\u2212": "-",  # minus sign
  "\u2013": "-",  # en dash used as a minus
  "\u03c0": r"\pi ",
  "\u00b0": r"^\circ",
  "\u00d7": r"\times ",
  "\u00b7": r"\cdot ",
  "\u2044": "/",  # fraction slash
  "\u221e": r"\infty ",
}
_VULGAR_RE = re.compile("[\u00bc-\u00be\u2150-\u215e]")
_ROOT_RE = re.compile(r"√\s*(\d+(?:\.\d+)?|[a-zA-Z]|\(([^()]*)\)|\{([^{}]*)\})")
_TEXT_SQRT_RE = re.compile(r"(?<![\\a-zA-Z])sqrt\s*\(([^()]*)\)")
_SPACES_RE = re.compile(r"\\[,;:! ]|~|\\quad|\\qquad|\\thinspace")
_THOUSANDS_RE = re.compile(r"(?<![\d.,])(\d{1,3})((?:,\d{3})+|(?: \d{3})+)(?![\d,]| \d)")
_UNIT_WORDS = (
  "degrees|degree|centimeters|centimeter|cm|meters|meter|kilometers|km|mm|inches|inch|feet|foot|"
  "ft|yards|yard|miles|mile|units|unit|square|sq|dollars|dollar|cents|cent|hours|hour|hrs|hr|"
  "minutes|minute|min|seconds|second|sec|mph|kg|grams|gram|pounds|pound|lbs|lb|liters|liter|"
  "ml|days|day|weeks|week|years|year"
)
_TEXT_UNIT_RE = re.compile(
  r"(?<=[\w}])\s*\\(?:text|mathrm|mbox|textrm)\s*\{[\sa-zA-Z/.~]*\}(?:\^\{?\d\}?)?"
)
_WORD_UNIT_RE = re.compile(
  rf"(?<=[\d}}])\s*(?:{_UNIT_WORDS})(?:\s*/\s*(?:{_UNIT_WORDS}))?(?:\^\{{?\d\}}?|\d)?(?![a-zA-Z])"
)
# One-letter units only after a space and at the end: "3m" or "2 m + 1" may be algebra.
_LETTER_UNIT_RE = re.compile(r"(?<=\d)\s+[msg](?:\s*/\s*[sh])?(?:\^\{?\d\}?|\d)?$")
_DEGREE_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|\\degree")
_PERCENT_RE = re.compile(r"(?:\\%|%|\\text\{\s*percent\s*\}|\s+percent)\s*$")
_UNWRAP_RE = re.compile(
  r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|boxed|displaystyle|bf|rm)\s*\{([^{}]*)\}"
)
_EQUATION_SPLIT_RE = re.compile(r"(?<![<>!=\\])=(?!=)")
_SEPARATOR_RE = re.compile(
  r",|;|\\text\{\s*(?:or|and)\s*\}|\s+(?:or|and)\s+|\\lor(?![a-zA-Z])|\\vee(?![a-zA-Z])"
)
_OPEN, _CLOSE = "([{", ")]}"


@dataclasses.dataclass(frozen=True)
class _Part:
  text: str  # cleaned LaTeX, spaces kept (what math-verify sees)
  norm: str  # without spaces (string equality and numbers)
  percent: bool


def _vulgar(match: re.Match) -> str:
  num, den = unicodedata.normalize("NFKC", match.group()).split("\u2044")
  return rf" \frac{{{num}}}{{{den}}}"


def _clean_whole(text: str) -> str:
  """Cleaning that must precede the split into parts (it changes commas and spaces)."""
  text = str(text).strip()
  for old, new in _UNICODE.items():
    text = text.replace(old, new)
  text = _VULGAR_RE.sub(_vulgar, text)
  text = _ROOT_RE.sub(lambda m: rf"\sqrt{{{m.group(2) or m.group(3) or m.group(1)}}}", text)
  text = _TEXT_SQRT_RE.sub(r"\\sqrt{\1}", text)
  text = text.replace(r"\$", "").replace("$", "").replace(r"\[", "").replace(r"\]", "")
  text = text.replace(r"\left", "").replace(r"\right", "").replace(r"\displaystyle", "")
  text = text.replace(r"\dfrac", r"\frac").replace(r"\tfrac", r"\frac")
  text = text.replace(r"\varnothing", r"\emptyset").replace(r"\{\}", r"\emptyset")
  text = text.replace(r"\text{,}", ",").replace("{,}", ",")
  text = _SPACES_RE.sub(" ", text).strip()
  text = re.sub(r"\s+", " ", text)
  return _THOUSANDS_RE.sub(lambda m: m.group(1) + re.sub("[, ]", "", m.group(2)), text)


def _clean_part(text: str) -> tuple[str, bool]:
  """(cleaned part, had a percent sign). See the module docstring, step 0."""
  text = text.strip().rstrip(".").strip()
  text = _EQUATION_SPLIT_RE.split(text)[-1].strip()  # "x = 3" -> "3"
  percent = _PERCENT_RE.search(text) is not None
  text = _PERCENT_RE.sub("", text)
  text = _DEGREE_RE.sub("", text)
  text = _TEXT_UNIT_RE.sub("", text)
  text = _LETTER_UNIT_RE.sub("", _WORD_UNIT_RE.sub("", text)).strip()
  for _ in range(3):
    text = _UNWRAP_RE.sub(r"\1", text).strip()
  while len(text) > 1 and text[0] == "{" and text[-1] == "}" and _balanced(text[1:-1]):
    text = text[1:-1].strip()
  text = re.sub(r"^(?:(?:option|choice)\s*)?\(\s*([A-Ea-e])\s*\)$", r"\1", text, flags=re.I)  # (B)
  over = re.fullmatch(r"(.+?)\\over(?![a-zA-Z])(.+)", text)
  if over:
    text = rf"\frac{{{over[1].strip()}}}{{{over[2].strip()}}}"
  text = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", text)
  text = re.sub(r"\\frac\s*\{([^{}]*)\}\s*(\d)", r"\\frac{\1}{\2}", text)
  text = re.sub(r"\\sqrt\s*(\d+)", r"\\sqrt{\1}", text)
  text = re.sub(r"^(-?\d+) (\d+)/(\d+)$", r"\1\\frac{\2}{\3}", text)  # 2 1/2
  return text.strip().rstrip(".").strip(), percent


def _balanced(text: str) -> bool:
  depth = 0
  for char in text:
    depth += (char == "{") - (char == "}")
    if depth < 0:
      return False
  return depth == 0


def _split_top(text: str) -> list[str]:
  """Split at separators outside brackets (tuples, intervals, sets stay one part)."""
  parts, depth, start, pos = [], 0, 0, 0
  while pos < len(text):
    char = text[pos]
    if char in _OPEN:
      depth += 1
    elif char in _CLOSE:
      depth -= 1
    elif depth == 0:
      sep = _SEPARATOR_RE.match(text, pos)
      if sep:
        parts.append(text[start:pos])
        start = pos = sep.end()
        continue
    pos += 1
  parts.append(text[start:])
  return [p.strip() for p in parts]


def _expand_pm(text: str) -> list[str]:
  """``a \\pm b`` -> [a + b, a - b] (one sign; ``\\frac{-1 \\pm \\sqrt5}{2}`` works in place)."""
  signs = re.findall(r"\\(?:pm|mp)(?![a-zA-Z])", text)
  if len(signs) != 1:
    return [text]
  return [re.sub(r"\\(?:pm|mp)(?![a-zA-Z])", sign, text).strip() for sign in ("+", "-")]


def _parts(answer: str) -> list[_Part]:
  out = []
  for raw in _split_top(_clean_whole(answer)):
    text, percent = _clean_part(raw)
    for piece in _expand_pm(text):
      out.append(_Part(piece, piece.replace(" ", ""), percent))
  return out


def clean_answer(answer: str) -> list[str]:
  """The cleaned parts of an answer (one per listed answer), spaces kept."""
  return [p.text for p in _parts(answer)]


def normalize_answer(answer: str) -> str:
  """Minerva-style normalised string of a whole answer (cleaning above, spaces removed)."""
  return ",".join(p.norm for p in _parts(answer))


def _malformed(part: _Part) -> bool:
  """A cut-off or garbled answer: no credit even if its digits look right."""
  text = part.text
  if not text:
    return True
  if not _balanced(text) or sum(text.count(c) for c in "([") != sum(text.count(c) for c in ")]"):
    return True
  if re.search(r"(?:[-+*/^_=,.]|\\(?:cdot|times|div|frac|sqrt))\s*$", text):
    return True
  if re.search(r"(?<!\\)\{\s*\}|\d\.\.\d|(?:^|[^_^\d])\d+ \d", text):
    return True
  return False


# --- numbers ---------------------------------------------------------------------------------------

_FRAC_RE = re.compile(r"(-?)\\frac\{([-+]?\d+(?:\.\d+)?)\}\{([-+]?\d+(?:\.\d+)?)\}")
_MIXED_RE = re.compile(r"(-?)(\d+)\\frac\{(\d+)\}\{(\d+)\}")
_SCI_RE = re.compile(r"(?:(-?\d+(?:\.\d+)?)(?:\\times|\\cdot|\*))?10\^\{?([-+]?\d{1,3})\}?")
_REPEAT_RE = re.compile(r"(-?)(\d*)\.(\d*)\\overline\{(\d+)\}")


def parse_number(text: str) -> Fraction | None:
  """Exact value of a number written as in the module docstring (step 4); None otherwise."""
  text = text.strip().replace(" ", "")
  while len(text) > 2 and text[0] == "(" and text[-1] == ")":
    text = text[1:-1]
  text = text.lstrip("+")
  try:
    if re.fullmatch(r"-?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d{1,3})?", text):
      return Fraction(text)
    match = re.fullmatch(r"(-?\d+)/(-?\d+)", text) or re.fullmatch(r"(-?\d+):(\d+)", text)
    if match:
      return Fraction(int(match[1]), int(match[2]))
    match = _FRAC_RE.fullmatch(text)
    if match:
      value = Fraction(match[2]) / Fraction(match[3])
      return -value if match[1] else value
    match = _MIXED_RE.fullmatch(text)
    if match:
      value = int(match[2]) + Fraction(int(match[3]), int(match[4]))
      return -value if match[1] else value
    match = _SCI_RE.fullmatch(text)
    if match:
      return Fraction(match[1] or 1) * Fraction(10) ** int(match[2])
    match = _REPEAT_RE.fullmatch(text)
    if match:
      fixed, repeat = match[3], match[4]
      tail = Fraction(
        int(fixed + repeat) - int(fixed or 0), 10 ** len(fixed + repeat) - 10 ** len(fixed)
      )
      value = int(match[2] or 0) + tail
      return -value if match[1] else value
  except (ValueError, ZeroDivisionError):
    return None
  return None


def _numbers_equal(x: Fraction, y: Fraction, tol: float) -> bool:
  if x.denominator == 1 and y.denominator == 1:
    return x == y  # integers are exact: 999999 is not 1000000
  return abs(x - y) <= tol * max(1, abs(y))


# --- symbolic: math-verify under our timeout -------------------------------------------------------


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


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str):
  """Parsed reference answer; cached because the G samples of a prompt share it (sympy objects
  are immutable). A parse cut short by the alarm raises, so it is never cached."""
  import math_verify  # noqa: PLC0415

  return math_verify.parse(f"${gold}$", parsing_timeout=None)


def _math_verify_equal(pred: str, gold: str, timeout_s: float | None) -> bool:
  import math_verify  # noqa: PLC0415  (heavy: sympy + antlr; imported in workers on first use)
  import math_verify.grader
  import math_verify.parser

  # We disable math-verify's own signal timeouts on purpose (ours replace them): skip its warning.
  math_verify.grader.TIMEOUT_WARNING_SHOWN = math_verify.parser.TIMEOUT_WARNING_SHOWN = True

  with _alarm(timeout_s):
    gold_parsed = _parse_gold(gold)
    pred_parsed = math_verify.parse(f"${pred}$", parsing_timeout=None)
    if not gold_parsed or not pred_parsed:
      return False
    # allow_set_relation_comp: "x > 2" answers "(2, \\infty)" (math-verify's default allows it
    # only when the prediction is the set).
    verdict = math_verify.verify(
      gold_parsed, pred_parsed, timeout_seconds=None, allow_set_relation_comp=True
    )
    return bool(verdict)


# --- the ladder ------------------------------------------------------------------------------------


def _part_equal(p: _Part, g: _Part, tol: float, use_math_verify: bool, timeout_s) -> bool:
  if p.norm == g.norm:
    return True
  if re.fullmatch(r"[a-zA-Z]{2,}", p.norm) and p.norm.lower() == g.norm.lower():
    return True  # words ("Yes" / "yes"); single letters stay case sensitive (variables)
  x, y = parse_number(p.norm), parse_number(g.norm)
  if x is not None and y is not None:
    return _numbers_equal(x, y, tol) or (
      p.percent and not g.percent and _numbers_equal(x / 100, y, tol)
    )
  return use_math_verify and _math_verify_equal(p.text, g.text, timeout_s)


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
  preds, golds = _parts(str(pred)), _parts(gold)
  if any(_malformed(p) for p in preds):
    return False
  if len(golds) > 1 and len(preds) == 1:  # "(3, 4)" or "\{3, 4\}" for the listed values 3, 4
    inner = re.fullmatch(r"\(([^()]*)\)|\\\{(.*)\\\}", preds[0].text)
    if inner:
      preds = _parts(inner[1] if inner[1] is not None else inner[2])

  def equal(p: _Part, g: _Part) -> bool:
    return _part_equal(p, g, tol, use_math_verify, timeout_s)

  if len(preds) > 1 and len(golds) > 1:  # lists of solutions: unordered, each used once
    unmatched = list(golds)
    for p in preds:
      hit = next((i for i, g in enumerate(unmatched) if equal(p, g)), None)
      if hit is None:
        return False
      unmatched.pop(hit)
    return not unmatched
  if len(preds) > 1:
    tuple_gold = re.fullmatch(r"\(([^()]*)\)", golds[0].text)
    if tuple_gold:  # "x = 2, y = 3" for the pair (2, 3): in order
      coords = _parts(tuple_gold[1])
      return len(coords) == len(preds) and all(map(equal, preds, coords))
    # Several answers to one question: credited only if all are right ("3 or 4" is not).
    return all(equal(p, golds[0]) for p in preds)
  if len(golds) > 1:  # one answer for a list of several
    return False
  return equal(preds[0], golds[0])


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

  ``extract``: the marked-answer modes, tried in order (``math_extract``: boxed, answer_tag,
  answer_line, gsm8k). ``fallback``: ``"none"`` (default: a completion without a marked answer
  has no answer) or ``"last_number"`` (then take the last number in the text; for base models
  that were never told how to mark an answer). A marked answer that is cut off or malformed is
  never replaced by the fallback.

  Reward: ``correct_value`` if correct, ``wrong_value`` if an answer was found but is wrong,
  ``no_answer_value`` (default: ``wrong_value``) if no well-formed answer was found. DAPO uses
  (1, -1, -1). Scores carry ``correct`` (the outcome) and ``has_answer``.
  """

  extract: tuple[str, ...] = MARKED_MODES
  fallback: str = "none"
  correct_value: float = 1.0
  wrong_value: float = 0.0
  no_answer_value: float | None = None
  use_math_verify: bool = True
  verify_timeout_s: float | None = 5.0
  tol: float = 1e-6
  name: str = "math"

  def __post_init__(self):
    check_modes(self.extract, self.fallback)

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
    found = find_final_answer(_as_text(completion), self.extract, fallback=self.fallback)
    pred = None if found.malformed else found.text
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
      "extracted_answer": None if found.text is None else found.text[:200],
    }

  def combine(self, scores, **fields: Any) -> protocol.RewardOutput:
    extracted = np.array([None if s is None else s["extracted_answer"] for s in scores], object)
    info = {
      "correct": protocol.scores_column(scores, "correct"),
      "has_answer": protocol.scores_column(scores, "has_answer"),
      "extracted_answer": extracted,
    }
    return protocol.RewardOutput(rewards=protocol.scores_column(scores, "reward"), info=info)
