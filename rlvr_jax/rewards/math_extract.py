r"""Finding the final answer of a math completion (the extraction half of :mod:`math_reward`).

Extraction modes, each a way of *marking* a final answer:
  ``boxed``        the last ``\boxed{...}`` / ``\fbox{...}`` (brace matched; ``\boxed 3`` takes
                   one TeX token). Boxes joined to the last one within its sentence ("\boxed{3}
                   or \boxed{4}") are kept together as several answers.
  ``answer_tag``   the last ``<answer>...</answer>`` (a box inside it wins).
  ``answer_line``  the text after the last "answer is" / "answer:" / "final answer" marker ("The
                   final answer is $x$.", "Final Answer: x", "**Answer:** x", a "**Final
                   Answer**" heading), up to the end of its sentence or a justification
                   (", since ...", "because ...", "(twelve)"); a display block
                   (``\[...\]``, ``$$...$$``) right after the marker is taken whole.
  ``gsm8k``        the last ``#### <number>``.
Modes are tried in order; the first that finds its marker decides, even when what follows the
marker is malformed (a box cut off by the length limit is a wrong answer, not a reason to go
looking for another one).

``fallback="last_number"`` takes the last number in the text when no mode found a marker. It is
off by default: an instruct model is told to mark its final answer, and the last number of an
unmarked text is often a number from the working (verl's MATH reward reads only the last
``\boxed{}``, its GSM8K reward only ``####`` unless ``method="flexible"``; TRL's and Open-R1's
``accuracy_reward`` call math-verify with ``try_extract_without_anchor=False``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

FALLBACKS = ("none", "last_number")
MARKED_MODES = ("boxed", "answer_tag", "answer_line", "gsm8k")
SEVERAL_SEPARATOR = r" \text{ or } "  # joins several boxed answers of one sentence

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])\s*")
_ANSWER_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
# "final answer(s)" (a heading too), or "answer(s)" followed by "is" / "are" / ":"; not "to
# answer this".
_ANSWER_MARK_RE = re.compile(
  r"(?:\bfinal\s+answers?\b|\banswers?(?=[\s*]*(?:is\b|are\b|:)))"
  r"[\s*]*(?:is\b|are\b)?[\s*]*:?[\s*]*",
  re.IGNORECASE,
)
# A justification after the answer on its line: "The answer is 3, since ...", "12 (twelve)".
_CLAUSE_RE = re.compile(
  r",?\s+(?:since|because|as|which|so that|given that|where)\b"
  r"|\s+\((?=\s*[a-zA-Z]{2,}[a-zA-Z\s]*\))"
)
_DISPLAY_RE = re.compile(r"\\\[(.*?)\\\]|\$\$(.*?)\$\$", re.DOTALL)
_GSM8K_RE = re.compile(r"####\s*\$?\s*([-−]?[0-9][0-9,]*(?:\.[0-9]+)?)")
_NUMBER_RE = re.compile(r"[-−]?[0-9][0-9,]*(?:\.[0-9]+)?|[-−]?\.[0-9]+")
_SENTENCE_END_RE = re.compile(r"[.!?](?:\s|$)|\n")
_TEX_TOKEN_RE = re.compile(r"\\[a-zA-Z]+|\S")


@dataclasses.dataclass(frozen=True)
class FinalAnswer:
  """What a completion marks as its final answer.

  ``text``: the answer (None when nothing was found); ``mode``: the mode that found it;
  ``malformed``: the marker was found but its answer is cut off (an unclosed box, an unclosed
  ``$``), so ``text`` is the raw remainder and never counts as correct.
  """

  text: str | None
  mode: str | None = None
  malformed: bool = False


def _box_at(text: str, start: int) -> tuple[str | None, int]:
  """(content, end) of the box whose argument starts at ``start``; (None, -1) if unclosed."""
  if start >= len(text):
    return None, -1
  if text[start] != "{":
    token = _TEX_TOKEN_RE.match(text, start)
    return (token.group(), token.end()) if token else (None, -1)
  depth = 0
  for pos in range(start, len(text)):
    if text[pos] == "{":
      depth += 1
    elif text[pos] == "}":
      depth -= 1
      if depth == 0:
        return text[start + 1 : pos].strip(), pos + 1
  return None, -1


def extract_boxed(text: str) -> str | None:
  """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``); None if absent or unclosed."""
  matches = list(_BOX_RE.finditer(text))
  return _box_at(text, matches[-1].end())[0] if matches else None


def _final_boxed(text: str) -> FinalAnswer | None:
  matches = list(_BOX_RE.finditer(text))
  if not matches:
    return None
  content, _ = _box_at(text, matches[-1].end())
  if content is None:
    return FinalAnswer(text[matches[-1].start() :][:200], "boxed", malformed=True)
  several = [content]
  # Walk back over boxes joined to the last one within its sentence ("\boxed{3} or \boxed{4}").
  for prev, nxt in zip(matches[-2::-1], matches[:0:-1], strict=False):
    prev_content, prev_end = _box_at(text, prev.end())
    if prev_content is None or prev_end > nxt.start():
      break
    between = text[prev_end : nxt.start()]
    if _SENTENCE_END_RE.search(between) or len(between) > 80:
      break
    several.insert(0, prev_content)
  if not all(several):
    return FinalAnswer(content, "boxed", malformed=True)
  return FinalAnswer(SEVERAL_SEPARATOR.join(several), "boxed")


def _final_answer_tag(text: str) -> FinalAnswer | None:
  matches = _ANSWER_TAG_RE.findall(text)
  if not matches:
    return None
  inner = matches[-1]
  return (
    _final_boxed(inner) or _final_answer_line(inner) or FinalAnswer(inner.strip(), "answer_tag")
  )


def _final_answer_line(text: str) -> FinalAnswer | None:
  marks = list(_ANSWER_MARK_RE.finditer(text))
  if not marks:
    return None
  rest = text[marks[-1].end() :]
  display = _DISPLAY_RE.match(rest)  # "The final answer is:\n\\[ x \\]"
  if display:
    rest = (display[1] if display[1] is not None else display[2]).strip()
  rest = rest.split("\n", 1)[0]
  end = _SENTENCE_END_RE.search(rest)
  answer = rest[: end.start()] if end else rest
  clause = _CLAUSE_RE.search(answer)
  answer = (answer[: clause.start()] if clause else answer).strip().strip("*").strip()
  if answer.count("$") % 2:  # "$\frac{3}{" cut off before the closing dollar
    return FinalAnswer(answer, "answer_line", malformed=True)
  answer = answer.replace("$", "").strip()
  boxed = _final_boxed(answer)
  if boxed is not None:
    return dataclasses.replace(boxed, mode="answer_line")
  return FinalAnswer(answer or None, "answer_line")


def _final_gsm8k(text: str) -> FinalAnswer | None:
  matches = _GSM8K_RE.findall(text)
  return FinalAnswer(matches[-1].replace(",", ""), "gsm8k") if matches else None


def last_number(text: str) -> str | None:
  """The last number in the text (commas inside it dropped by the caller's normalisation)."""
  matches = _NUMBER_RE.findall(text[-2000:]) or _NUMBER_RE.findall(text)
  return matches[-1].rstrip(",") if matches else None


_FINDERS = {
  "boxed": _final_boxed,
  "answer_tag": _final_answer_tag,
  "answer_line": _final_answer_line,
  "gsm8k": _final_gsm8k,
}


def check_modes(modes: Sequence[str], fallback: str) -> None:
  """Raise ValueError for unknown extraction modes or fallback."""
  if "last_number" in modes:
    raise ValueError(
      "extract mode 'last_number' is now the option fallback='last_number' (tried only when no "
      f"marked answer is found); marked modes: {list(MARKED_MODES)}"
    )
  unknown = [m for m in modes if m not in _FINDERS]
  if unknown:
    raise ValueError(f"unknown extraction modes {unknown}; choose from {list(MARKED_MODES)}")
  if fallback not in FALLBACKS:
    raise ValueError(f"fallback={fallback!r}; choose from {list(FALLBACKS)}")


def find_final_answer(
  text: str, modes: Sequence[str] = MARKED_MODES, *, fallback: str = "none"
) -> FinalAnswer:
  """The final answer marked by the first mode that finds its marker (see module docstring)."""
  check_modes(modes, fallback)
  for mode in modes:
    found = _FINDERS[mode](text)
    if found is not None:
      if found.text is None or not found.text.strip():
        return FinalAnswer(None, mode)
      return dataclasses.replace(found, text=found.text.strip())
    # A mode whose marker is absent lets the next mode look.
  if fallback == "last_number":
    number = last_number(text)
    return FinalAnswer(number, "last_number" if number else None)
  return FinalAnswer(None)


def extract_answer(text: str, modes: Sequence[str] = ("boxed", "last_number")) -> str | None:
  """The first answer found by the given modes, tried in order (``last_number`` allowed here).

  Kept for the task rewards (``ArithmeticReward``); :class:`MathReward` uses
  :func:`find_final_answer`, which also reports malformed answers.
  """
  for mode in modes:
    if mode == "last_number":
      answer = last_number(text)
    elif mode in _FINDERS:
      found = _FINDERS[mode](text)
      answer = None if found is None or found.malformed else found.text
    else:
      raise ValueError(f"unknown extraction mode {mode!r}")
    if answer is not None and answer.strip():
      return answer.strip()
  return None


def as_text(completion: Any) -> str:
  """Completions may arrive as bytes (binary garbage): decode leniently, never raise."""
  if isinstance(completion, bytes):
    return completion.decode("utf-8", errors="replace")
  return str(completion)
