"""MathReward against the grader table (tests/data/math_grader_table.py): every row in-process,
the fallback option, and the whole table once through the RewardRuntime (worker processes)."""

import collections
import importlib.util
import pathlib
import sys

import numpy as np
import pytest

from rlvr_jax import rewards
from rlvr_jax.rewards import math_extract

_TABLE_PATH = pathlib.Path(__file__).parent / "data" / "math_grader_table.py"
_spec = importlib.util.spec_from_file_location("math_grader_table", _TABLE_PATH)
table = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = table  # dataclasses look their module up there
_spec.loader.exec_module(table)
ROWS = table.load()


def _row_id(row):
  return f"{row.family}:{row.why[:40]}:{row.verdict}"


def test_table_covers_the_families_both_ways():
  assert len(ROWS) >= 150
  by_family = collections.defaultdict(list)
  for row in ROWS:
    by_family[row.family].append(row.verdict)
  assert len(by_family) >= 10
  two_sided = [f for f, verdicts in by_family.items() if any(verdicts) and not all(verdicts)]
  assert len(two_sided) >= 10, by_family.keys()
  assert 0.35 < np.mean([r.verdict for r in ROWS]) < 0.75
  assert len({(r.completion, r.reference) for r in ROWS}) == len(ROWS), "duplicate rows"


def test_bad_row_is_named():
  with pytest.raises(ValueError, match="row 1: bad field"):
    table.load([("f", "c", "r", True, "why"), ("f", "c", "r", "maybe", "why")])
  with pytest.raises(ValueError, match="row 0: expected 5 fields"):
    table.load([("f", "c", "r", True)])


@pytest.mark.parametrize("row", ROWS, ids=_row_id)
def test_row(row):
  score = rewards.MathReward().score_item("q", row.completion, answer=row.reference)
  assert bool(score["correct"]) is row.verdict, (row.why, score["extracted_answer"])


def test_last_number_fallback_is_opt_in_and_never_rescues_a_malformed_answer():
  default, lenient = rewards.MathReward(), rewards.MathReward(fallback="last_number")
  unmarked = "Adding them, we get 42."
  assert default.score_item("q", unmarked, answer="42")["has_answer"] == 0.0
  assert lenient.score_item("q", unmarked, answer="42")["correct"] == 1.0
  assert lenient.score_item("q", "6 times 7 is 41", answer="42")["correct"] == 0.0
  # A marked answer always wins over the fallback, and a malformed one is not replaced by it.
  assert lenient.score_item("q", r"it is 42, so \boxed{41}", answer="42")["correct"] == 0.0
  # So the fallback changes no verdict outside the unmarked family (malformed ones included).
  assert sum(r.family == "malformed" and not r.verdict for r in ROWS) >= 10
  for row in ROWS:
    if row.family != "unmarked":
      score = lenient.score_item("q", row.completion, answer=row.reference)
      assert bool(score["correct"]) is row.verdict, row
  # The unmarked rows the default rejects are credited by the fallback exactly when their last
  # number is the reference.
  unmarked_rows = [r for r in ROWS if r.family == "unmarked"]
  for row in unmarked_rows:
    expected = math_extract.last_number(row.completion) == row.reference
    credited = lenient.score_item("q", row.completion, answer=row.reference)["correct"]
    assert credited == float(expected), row
  assert sum(math_extract.last_number(r.completion) == r.reference for r in unmarked_rows) >= 3


def test_find_final_answer_reports_mode_and_malformed():
  find = math_extract.find_final_answer
  assert find(r"x \boxed{3} or \boxed{4}.") == math_extract.FinalAnswer(r"3 \text{ or } 4", "boxed")
  assert find("x \\boxed{3}.\n\\boxed{4}") == math_extract.FinalAnswer("4", "boxed")
  assert find(r"so \boxed{3").malformed
  assert find("The answer is $\\frac{3}{").malformed
  assert find("The answer is 3. Actually, the answer is 4.") == math_extract.FinalAnswer(
    "4", "answer_line"
  )
  assert find("no marker 5") == math_extract.FinalAnswer(None)
  assert find("no marker 5", fallback="last_number") == math_extract.FinalAnswer("5", "last_number")
  assert find("#### 1,234") == math_extract.FinalAnswer("1234", "gsm8k")


def test_table_through_the_reward_runtime_matches_in_process():
  completions = [r.completion for r in ROWS]
  answers = [r.reference for r in ROWS]
  reward = rewards.MathReward()
  with rewards.RewardRuntime(num_workers=1, timeout_s=20.0) as runtime:
    result = runtime.run(reward, ["q"] * len(ROWS), completions, answer=answers)
  assert not result.failures
  np.testing.assert_array_equal(result.info["correct"], [float(r.verdict) for r in ROWS])
