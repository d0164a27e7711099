"""Math answer checking: extraction, normalisation, and a table of answer pairs with verdicts."""

import numpy as np
import pytest

from rlvr_jax.rewards import math_reward
from rlvr_jax.rewards.math_reward import MathReward, extract_answer, extract_boxed, math_equal

# (predicted answer, reference answer, expected verdict). Expected verdicts are the mathematically
# right ones, decided by hand, not read off the implementation.
ANSWER_TABLE = [
  # fractions and decimals
  ("0.5", r"\frac12", True),
  (r"\frac{1}{2}", "0.5", True),
  (r"\dfrac{3}{4}", "3/4", True),
  (r"\frac{2}{4}", r"\frac{1}{2}", True),
  (r"\frac{-1}{2}", "-0.5", True),
  (r"-\frac{1}{2}", "-0.5", True),
  ("0.3333333", r"\frac13", True),
  ("0.333", r"\frac13", False),  # looks right, is not within 1e-6
  ("1/3", "3", False),
  ("3.0", "3", True),
  ("-0", "0", True),
  ("1e3", "1000", True),
  ("2.50", "5/2", True),
  # integers: exact, never within a relative tolerance
  ("999999", "1000000", False),
  ("1000001", "1000000", False),
  ("1001", "1000", False),
  ("-3", "3", False),
  ("12", "21", False),
  ("1,000", "1000", True),
  ("1,234,567", "1234567", True),
  # equations, text, units
  ("x=3", "3", True),
  ("y=2x+1", "2x+1", True),
  ("10 cm", "10", True),
  (r"10\text{ cm}", "10", True),
  (r"90^\circ", "90", True),
  (r"90^{\circ}", "90", True),
  (r"\$5", "5", True),
  ("5 dollars", "5", True),
  (r"50\%", "50", True),
  (r"\text{(A)}", "A", True),
  (r"\textbf{12}", "12", True),
  ("A", "B", False),
  ("11 cm", "10", False),
  # LaTeX and symbolic forms
  (r"\sqrt{2}/2", r"\frac{\sqrt{2}}{2}", True),
  (r"\frac{\sqrt{2}}{1}", r"\sqrt{2}", True),
  (r"2\sqrt{2}", r"\sqrt{8}", True),
  (r"3\sqrt{3}", r"\sqrt{27}", True),
  (r"\sqrt{3}", "1.732", False),  # a rounded value is not the exact answer
  (r"\frac{\pi}{2}", r"\pi/2", True),
  (r"\pi", "3.14159", False),
  ("x^2+2x+1", "(x+1)^2", True),
  ("x^2+1", "(x+1)^2", False),
  ("1+x", "x+1", True),
  ("0.1+0.2", "0.3", True),
  (r"\log_2 8", "3", True),
  (r"2^{10}", "1024", True),
  (r"2^{10}", "1000", False),
  (r"\sqrt{2}", r"\sqrt{3}", False),
  (r"\begin{pmatrix}1\\2\end{pmatrix}", r"\begin{pmatrix}1\\2\end{pmatrix}", True),
  (r"\begin{pmatrix}1\\2\end{pmatrix}", r"\begin{pmatrix}2\\1\end{pmatrix}", False),
  # sets and intervals
  (r"\{1,2\}", r"\{2,1\}", True),
  (r"\{1,2\}", r"\{1,3\}", False),
  ("[0,1)", "[0, 1)", True),
  ("(0,1)", "[0,1]", False),
  (r"(-\infty, 2]", r"(-\infty,2]", True),
  (r"(-\infty, 2)", r"(-\infty,2]", False),
  (r"x \in [1, 3]", "[1,3]", True),
  (r"[1,3] \cup [5,6]", r"[1,3]\cup[5,6]", True),
  (r"[1,3] \cup [5,6]", r"[1,3]", False),
  (r"\infty", r"\infty", True),
  (r"-\infty", r"\infty", False),
  # nothing extracted
  (None, "3", False),
  ("", "3", False),
]


@pytest.mark.parametrize("pred, gold, expected", ANSWER_TABLE)
def test_answer_table(pred, gold, expected):
  assert math_equal(pred, gold) is expected


def test_table_is_large_and_balanced():
  assert len(ANSWER_TABLE) >= 50
  verdicts = [v for *_, v in ANSWER_TABLE]
  assert sum(verdicts) >= 20 and len(verdicts) - sum(verdicts) >= 20


def test_math_verify_disabled_falls_back_to_string_and_numbers():
  assert math_equal("0.5", r"\frac12", use_math_verify=False)
  assert not math_equal(r"2\sqrt{2}", r"\sqrt{8}", use_math_verify=False)


@pytest.mark.parametrize(
  "text, expected",
  [
    (r"so \boxed{\frac{1}{2}} done", r"\frac{1}{2}"),
    (r"\boxed{1} then \boxed{ 2 }", "2"),
    (r"\fbox{7}", "7"),
    (r"\boxed{\frac{1}{2}", None),  # unbalanced
    ("no box", None),
  ],
)
def test_extract_boxed(text, expected):
  assert extract_boxed(text) == expected


def test_extraction_modes():
  assert extract_answer("I think 3, no 42.") == "42"
  assert extract_answer("a \\boxed{7} and 9") == "7"
  assert extract_answer("<answer>12</answer> 9", ("answer_tag",)) == "12"
  assert extract_answer("Answer: 1/2.\nthanks", ("answer_line",)) == "1/2"
  assert extract_answer("blah #### 1,234", ("gsm8k",)) == "1234"
  assert extract_answer("no numbers here", ("boxed", "last_number")) is None
  # The ground truth may itself be boxed.
  assert math_equal("5", r"\boxed{5}")


def test_normalization_steps():
  norm = math_reward.normalize_answer
  assert norm(r"\text{ 5 } \mbox{cm}") == "5"
  assert norm(r"\frac12") == r"\frac{1}{2}"
  assert norm(r"\sqrt2") == r"\sqrt{2}"
  assert norm("$1,000$") == "1000"
  assert norm(r"k = \left( 1, 2 \right)") == "(1,2)"


def test_math_reward_values_and_outcome():
  completions = [r"\boxed{4}", r"\boxed{5}", "no answer here", "the result is 4"]
  answers = ["4"] * 4
  dapo = MathReward(correct_value=1.0, wrong_value=-1.0, extract=("boxed",))
  out = dapo.evaluate(["q"] * 4, completions, answer=answers)
  np.testing.assert_array_equal(out.rewards, [1, -1, -1, -1])
  np.testing.assert_array_equal(out.info["correct"], [1, 0, 0, 0])
  np.testing.assert_array_equal(out.info["has_answer"], [1, 1, 0, 0])
  assert list(out.info["extracted_answer"]) == ["4", "5", None, None]
  # Default: only a marked answer counts, so the unmarked "4" is no answer.
  default = MathReward(no_answer_value=-0.5)
  np.testing.assert_array_equal(default(["q"] * 4, completions, answer=answers), [1, 0, -0.5, -0.5])
  lenient = MathReward(no_answer_value=-0.5, fallback="last_number")
  np.testing.assert_array_equal(lenient(["q"] * 4, completions, answer=answers), [1, 0, -0.5, 1])
  with pytest.raises(ValueError, match="answer="):
    default(["q"], ["x"])
  with pytest.raises(ValueError, match="unknown extraction"):
    MathReward(extract=("boxd",))
  with pytest.raises(ValueError, match="fallback='last_number'"):
    MathReward(extract=("boxed", "last_number"))
  with pytest.raises(ValueError, match="fallback="):
    MathReward(fallback="first_number")


def test_in_worker_style_timeout_raises_item_timeout():
  # On the main thread our SIGALRM timeout fires and surfaces as ItemTimeout, not as "wrong".
  from rlvr_jax.rewards.runtime import ItemTimeout

  with pytest.raises(ItemTimeout):
    math_equal(r"(x+1)^{100000}", "1", timeout_s=0.3)
  # In-process evaluation turns the item's own timeout into NaN, never into "wrong".
  out = MathReward(verify_timeout_s=0.3).evaluate(
    ["q", "q"], [r"\boxed{(x+1)^{100000}}", r"\boxed{1}"], answer=["1", "1"]
  )
  assert np.isnan(out.rewards[0]) and out.rewards[1] == 1.0
  assert np.isnan(out.info["correct"][0])
