"""Built-in procedural tasks with disjoint train / held-out splits.

Every problem is a pure function of ``(seed, split, index)``: ``make_example(task, index, ...)``
draws candidates from ``np.random.default_rng([seed, split, index])`` until one falls in the
requested split. The split of a problem is a stable hash of its *content* (the operands), so a
held-out problem never appears in training, whatever the seed or the index.

Records are plain dicts: ``prompt`` (text before any chat template), ``answer`` (the reference
answer as a string), ``task``, and task-specific fields (``numbers``, ``target`` for countdown;
``demonstration``, the supervised target when it is more than the answer, for the "worked" style;
``pair_key`` for paraphrase pairs).
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from rlvr_jax.rewards.tasks import evaluate_expression

SPLITS = ("train", "heldout")
STYLES = ("bare", "worked", "word")
BOXED_INSTRUCTION = "Put your final answer within \\boxed{}."

_NAMES = ("Tom", "Anna", "Sam", "Mia", "Leo", "Ava", "Ben", "Zoe")
_ITEMS = ("apples", "pencils", "stickers", "marbles", "books", "coins", "cards", "shells")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """A procedural task.

  Attributes:
    name: "arithmetic" or "countdown".
    style: for arithmetic, "bare" (``"12+7="``, answer then EOS; for character models),
      "worked" (bare prompt, addition only; the demonstration is column working, then ``>``,
      then the answer: ``"27+48="`` -> ``"1507>75"``, see ``worked_solution``) or "word" (a
      one-sentence word problem asking for a ``\\boxed{}`` answer).
    ops: the operators to draw from (arithmetic: any of "+-*").
    min_value, max_value: operand range, inclusive.
    num_terms: number of operands (arithmetic, style "bare"; countdown: numbers given).
    heldout_fraction: fraction of the problem space (by content hash) reserved for held-out.
    zero_pad: write "bare" operands zero-padded to the width of ``max_value`` (``07+41=``), so
      every digit sits at a fixed position (much easier for a tiny from-scratch transformer).
    paraphrase: two-operand addition in pairs: records 2k and 2k + 1 are the same problem with
      the operands in both orders (``"27+48="`` and ``"48+27="``), sharing ``pair_key`` (for
      Co-Reward's cross-prompt agreement). A pair is in a split only when both orders are, so no
      order of a held-out problem is trained on; the held-out set is the unpaired one's.
  """

  name: str = "arithmetic"
  style: str = "bare"
  ops: str = "+"
  min_value: int = 0
  max_value: int = 99
  num_terms: int = 2
  heldout_fraction: float = 0.1
  zero_pad: bool = False
  paraphrase: bool = False

  def validate(self):
    if self.name not in TASKS:
      raise ValueError(
        f"data.task.name={self.name!r}: unknown task; expected one of {sorted(TASKS)}"
      )
    if self.style not in STYLES:
      raise ValueError(f"data.task.style={self.style!r}: expected one of {STYLES}")
    worked_or_pairs = self.style == "worked" or self.paraphrase
    if worked_or_pairs and (self.name != "arithmetic" or self.ops != "+" or self.num_terms != 2):
      raise ValueError(
        f"data.task.style={self.style!r}, paraphrase={self.paraphrase}: the worked style and "
        "paraphrase pairs exist for two-operand addition only (name='arithmetic', ops='+', "
        f"num_terms=2); got name={self.name!r}, ops={self.ops!r}, num_terms={self.num_terms}"
      )
    if self.paraphrase and self.style == "word":
      raise ValueError("data.task.paraphrase: needs style 'bare' or 'worked', not 'word'")
    if not self.ops or any(o not in "+-*" for o in self.ops):
      raise ValueError(f"data.task.ops={self.ops!r}: expected a non-empty subset of '+-*'")
    if not 0 <= self.min_value <= self.max_value:
      raise ValueError(
        f"data.task.min_value={self.min_value}, max_value={self.max_value}: need 0 <= min <= max"
      )
    if self.num_terms < 2:
      raise ValueError(f"data.task.num_terms={self.num_terms}: need at least 2")
    if not 0.0 < self.heldout_fraction < 1.0:
      raise ValueError(f"data.task.heldout_fraction={self.heldout_fraction}: need 0 < f < 1")


def split_of(key: str, heldout_fraction: float) -> str:
  """'heldout' or 'train' from a stable hash of the problem's content ``key``."""
  h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
  return "heldout" if (h % 1_000_000) < heldout_fraction * 1_000_000 else "train"


def _arithmetic(spec: TaskSpec, rng: np.random.Generator) -> dict:
  values = [int(v) for v in rng.integers(spec.min_value, spec.max_value + 1, spec.num_terms)]
  ops = [spec.ops[int(i)] for i in rng.integers(0, len(spec.ops), spec.num_terms - 1)]
  fmt = (lambda v: str(v).zfill(len(str(spec.max_value)))) if spec.zero_pad else str
  expr = fmt(values[0]) + "".join(o + fmt(v) for o, v in zip(ops, values[1:], strict=True))
  plain = str(values[0]) + "".join(o + str(v) for o, v in zip(ops, values[1:], strict=True))
  answer = int(evaluate_expression(plain))
  if spec.style == "bare":
    return {"prompt": f"{expr}=", "answer": str(answer), "key": expr}
  if spec.style == "worked":
    demo = worked_solution(expr)
    return {"prompt": f"{expr}=", "answer": str(answer), "key": expr, "demonstration": demo}
  a, b, op = values[0], values[1], ops[0]
  answer = {"+": a + b, "-": a - b, "*": a * b}[op]
  name = _NAMES[int(rng.integers(len(_NAMES)))]
  item = _ITEMS[int(rng.integers(len(_ITEMS)))]
  if op == "+":
    text = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?"
  elif op == "-":
    a, b = max(a, b), min(a, b)
    answer = a - b
    text = f"{name} has {a} {item} and gives away {b}. How many {item} does {name} have left?"
  else:
    text = f"{name} has {a} bags with {b} {item} in each bag. How many {item} are there in total?"
  return {"prompt": f"{text} {BOXED_INSTRUCTION}", "answer": str(answer), "key": f"{a}{op}{b}"}


def _countdown(spec: TaskSpec, rng: np.random.Generator) -> dict:
  """Numbers and a target reachable with + - * using every number once (left to right)."""
  numbers = [
    int(v) for v in rng.integers(max(spec.min_value, 1), spec.max_value + 1, spec.num_terms)
  ]
  target = numbers[0]
  for v in numbers[1:]:
    op = "+-*"[int(rng.integers(3))]
    target = {"+": target + v, "-": target - v, "*": target * v}[op]
  order = rng.permutation(len(numbers))
  shown = [numbers[i] for i in order]
  # rewards.CountdownReward scores the expression in the last <answer>...</answer> tag.
  prompt = (
    f"Using the numbers {shown}, each exactly once, and + - * ( ), write an expression equal to "
    f"{target}. Give the expression inside <answer></answer>."
  )
  return {
    "prompt": prompt,
    "answer": str(target),
    "numbers": shown,
    "target": target,
    "key": f"{sorted(shown)}->{target}",
  }


TASKS = {"arithmetic": _arithmetic, "countdown": _countdown}


def _swapped(spec: TaskSpec, ex: dict) -> dict:
  """The same addition with its operands in the other order (its paraphrase)."""
  a, b = ex["key"].split("+")
  key = f"{b}+{a}"
  out = {**ex, "prompt": f"{key}=", "key": key}
  if "demonstration" in ex:
    out["demonstration"] = worked_solution(key)
  return out


def _paraphrase_pair(spec: TaskSpec, index: int, *, seed: int, split: str) -> dict:
  """Record ``index`` of a paraphrase stream: pair ``index // 2``, in the original order for even
  indices and swapped for odd ones; both orders lie in ``split``."""
  plain = dataclasses.replace(spec, paraphrase=False)
  rng = np.random.default_rng([seed, SPLITS.index(split), index // 2, 2])
  for _ in range(10_000):
    ex = TASKS[spec.name](plain, rng)
    other = _swapped(plain, ex)
    if all(split_of(e["key"], spec.heldout_fraction) == split for e in (ex, other)):
      out = other if index % 2 else ex
      out["pair_key"] = "+".join(sorted(ex["key"].split("+")))
      out["task"] = spec.name
      return out
  raise ValueError(f"task {spec} has no {split} paraphrase pairs (try a larger value range)")


def make_example(spec: TaskSpec, index: int, *, seed: int, split: str) -> dict:
  """The ``index``-th problem of ``split`` for ``seed`` (deterministic, split-disjoint)."""
  if split not in SPLITS:
    raise ValueError(f"split={split!r}: expected one of {SPLITS}")
  if spec.paraphrase:
    return _paraphrase_pair(spec, index, seed=seed, split=split)
  rng = np.random.default_rng([seed, SPLITS.index(split), index])
  for _ in range(10_000):
    ex = TASKS[spec.name](spec, rng)
    if split_of(ex["key"], spec.heldout_fraction) == split:
      ex["task"] = spec.name
      return ex
  raise ValueError(f"task {spec} has no {split} problems (try a larger value range)")


def heldout_set(spec: TaskSpec, num: int, *, seed: int) -> list[dict]:
  """``num`` distinct held-out problems (fewer if the held-out space is smaller). With
  ``paraphrase`` the unpaired set, each record its own ``pair_key`` (an evaluation group has no
  partner: Co-Reward falls back to the group's own vote with ``unpaired='self'``)."""
  if spec.paraphrase:
    plain = heldout_set(dataclasses.replace(spec, paraphrase=False), num, seed=seed)
    return [{**r, "pair_key": r["key"]} for r in plain]
  out, seen = [], set()
  for i in range(num * 20):
    ex = make_example(spec, i, seed=seed, split="heldout")
    if ex["key"] not in seen:
      seen.add(ex["key"])
      out.append(ex)
    if len(out) == num:
      break
  return out


def no_carry_sum(expression: str) -> str:
  """The answer of ``"a+b"`` computed digit by digit without carries (a flawed teacher).

  ``"57+68"`` -> ``"15"`` (7+8 -> 5, 5+6 -> 1), whereas the true sum is 125. Used by the default
  experiment's warm start to plant a systematic error that RL must fix from rewards alone.
  """
  a, b = expression.split("+")
  width = max(len(a), len(b))
  digits = [
    str((int(x) + int(y)) % 10) for x, y in zip(a.zfill(width), b.zfill(width), strict=True)
  ]
  return "".join(digits).lstrip("0") or "0"


def worked_solution(expression: str, *, carry: bool = True) -> str:
  """Column working, ``>``, then the answer, for ``"a+b"`` (the "worked" style's demonstration).

  Columns from the units up, each written as two digits: the column's digit sum plus the carry
  coming in, so the answer's digits are the working's second digits (last column first) after a
  final carry. ``"27+48"`` -> ``"1507>75"`` (7+8 = 15, 2+4+1 = 07). ``carry=False`` is the
  flawed teacher: no carry is passed on (``"1506>65"``), working and answer both wrong but
  consistent, so the answer's likelihood after the working depends on the working (RLPR).
  """
  a, b = expression.split("+")
  width = max(len(a), len(b))
  cols, digits, c = [], [], 0
  for x, y in zip(reversed(a.zfill(width)), reversed(b.zfill(width)), strict=True):
    s = int(x) + int(y) + c
    cols.append(f"{s:02d}")
    digits.append(str(s % 10))
    c = s // 10 if carry else 0
  answer = (str(c) if c else "") + "".join(reversed(digits))
  return "".join(cols) + ">" + (answer.lstrip("0") or "0")
