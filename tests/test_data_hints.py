"""GHPO's hints (``data.hints``): which groups get one, the prefix at each fraction (words and
tokenizer ids), the prompt, the stage schedule, and the errors."""

import numpy as np
import pytest

from rlvr_jax.data import hints

SOLUTION = "12 + 7 = 19 so Leo has 19 pencils"  # 10 words


def test_needs_hint_only_for_groups_without_a_success():
  correct = np.array([[0, 0, 0], [0, 1, 0], [np.nan, 0, 0], [np.nan, 1, np.nan]])
  np.testing.assert_array_equal(hints.needs_hint(correct), [True, False, True, False])
  with pytest.raises(ValueError, match=r"\[P, G\]"):
    hints.needs_hint([0, 1])


@pytest.mark.parametrize(("fraction", "words"), [(0.25, 3), (0.5, 5), (0.75, 8), (1.0, 10)])
def test_hint_prefix_takes_the_ceiling_of_the_fraction_in_words(fraction, words):
  # ceil(0.25 x 10) = 3, ceil(0.5 x 10) = 5, ceil(0.75 x 10) = 8.
  assert hints.hint_prefix(SOLUTION, fraction) == " ".join(SOLUTION.split()[:words])


def test_hint_prefix_in_tokenizer_ids():
  chars = lambda text: [ord(c) for c in text]
  back = lambda ids: "".join(map(chr, ids))
  assert hints.hint_prefix("abcdefg", 0.5, tokenize=chars, detokenize=back) == "abcd"  # ceil 3.5
  with pytest.raises(ValueError, match="both"):
    hints.hint_prefix("abc", 0.5, tokenize=chars)


def test_hinted_prompt_and_stages():
  p = hints.hinted_prompt("Q?", SOLUTION, 1, marker=" | ")
  assert p == "Q? | 12 + 7 = 19"
  assert hints.next_stage(0, any_success=False) == 1
  assert hints.next_stage(1, any_success=False) == 2
  assert hints.next_stage(2, any_success=False) is None  # the last fraction: keep the group
  assert hints.next_stage(0, any_success=True) is None
  with pytest.raises(ValueError, match="stage 3"):
    hints.hinted_prompt("Q?", SOLUTION, 3)
  with pytest.raises(ValueError, match="'solution' field is empty"):
    hints.hinted_prompt("Q?", "  ", 0)
  with pytest.raises(ValueError, match=r"\(0, 1\]"):
    hints.hint_prefix(SOLUTION, 0.0)
