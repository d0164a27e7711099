"""Format, length shaping (DAPO overlong, cosine, LASER/LASER-D), combination, procedural tasks,
VeRPO weights: golden values from METHODS.md §5 and independent float64 references."""

import numpy as np
import pytest

from rlvr_jax import rewards
from rlvr_jax.data.tasks import TaskSpec, make_example
from rlvr_jax.rewards import length, tasks


def test_overlong_penalty_golden_in_tokens():
  lengths = np.array([16000, 16384, 17408, 20480])
  np.testing.assert_allclose(
    length.overlong_penalty(lengths, max_len=20480, buffer_len=4096), [0, 0, -0.25, -1], atol=1e-6
  )
  # The reward counts tokens from completion_lengths, never characters of the text.
  reward = rewards.OverlongReward(max_len=100, buffer_len=20)
  out = reward(["q"] * 2, ["a" * 1000, "b"], completion_lengths=[90, 100])
  np.testing.assert_allclose(out, [-0.5, -1.0])
  with pytest.raises(ValueError, match="completion_lengths"):
    reward(["q"], ["a"])


def test_cosine_golden():
  correct = np.array([1, 0, 1, 1, 0, 1])
  n = np.array([3584, 3584, 7168, 0, 0, 14320])
  np.testing.assert_allclose(
    length.cosine_length_reward(correct, n, max_len=14336),
    [1.853553, -8.535534, 1.5, 2, -10, -10],
    atol=1e-5,
  )


def test_cosine_reward_dense_repetition_token_rewards():
  reward = rewards.CosineReward(max_len=1000, repetition_ngram=2, repetition_penalty=-0.05)
  ids = [[1, 2, 3, 1, 2], [4, 5, 6]]
  out = reward.evaluate(
    ["q", "q"],
    [r"\boxed{1}", r"\boxed{2}"],
    answer=["1", "1"],
    completion_lengths=[5, 3],
    completion_token_ids=ids,
  )
  np.testing.assert_allclose(
    out.token_rewards, [[0, 0, 0, -0.05, -0.05], [0, 0, 0, 0, 0]], atol=1e-7
  )
  np.testing.assert_array_equal(out.info["correct"], [1, 0])
  padded = rewards.pad_token_rewards(out.token_rewards, 8)
  assert padded.shape == (2, 8) and padded[:, 5:].sum() == 0


def test_cosine_sequence_repetition_penalty_wrong_answers_only():
  assert length.word_ngram_repetition("a b a b a b", ngram=2) == pytest.approx(1 - 2 / 5)
  assert length.word_ngram_repetition("one two", ngram=3) == 0.0
  reward = rewards.CosineReward(
    max_len=1000, sequence_repetition_penalty=-1.0, sequence_repetition_ngram=2
  )
  text = "a b a b a b "
  out = reward(
    ["q"] * 2,
    [text + r"\boxed{1}", text + r"\boxed{2}"],
    answer=["1", "1"],
    completion_lengths=[0, 0],
  )
  # n = 0: correct -> 2, unpenalised. Wrong -> -10 + P * repetition; the words
  # a b a b a b \boxed{2} have 6 bigrams of which 3 are distinct: repetition 0.5.
  np.testing.assert_allclose(out, [2.0, -10.5], atol=1e-6)
  with pytest.raises(ValueError, match="<= 0"):
    rewards.CosineReward(sequence_repetition_penalty=0.5)


def test_laser_golden():
  correct = np.array([1, 1, 0, 0])
  boxed = np.array([1, 1, 1, 0])
  n = np.array([3000, 5000, 100, 100])
  np.testing.assert_allclose(length.laser_reward(correct, boxed, n, 4096), [1.5, 1.0, -0.5, -1.0])
  np.testing.assert_allclose(
    length.laser_reward(correct, boxed, n, 4096, mode="hybrid"), [1.5, 0.5, -0.5, -1.0]
  )


def test_laser_d_bucket_and_target_golden():
  # G = 8, a = 6/8 -> easy, n_b = 5; c(4096) = 0.10 and c(5120) = 0.25 -> L_T = 5120.
  group = 8
  correct = np.array([1, 1, 1, 1, 1, 1, 0, 0] * 5, dtype=np.float64)
  lengths = np.full(40, 9000)
  # 40 easy responses: 4 correct with n <= 4096 (c = 0.10), 6 more <= 5120 (c = 0.25).
  correct_rows = np.flatnonzero(correct)
  lengths[correct_rows[:4]] = 4000
  lengths[correct_rows[4:10]] = 5000
  assert set(length.laser_d_buckets(correct, group_size=group)) == {0}
  targets = length.laser_d_choose_targets(correct, lengths, group_size=group, max_len=16384)
  assert targets == (5120, 16384, 16384)  # medium and hard have no responses -> L_max
  buckets = length.laser_d_buckets(np.array([1, 1, 1, 0, 1, 0, 0, 0, 0]), group_size=3)
  np.testing.assert_array_equal(buckets, [0, 0, 0, 1, 1, 1, 2, 2, 2])
  # Failed rows (NaN) are excluded from the group accuracy: 1 of 2 valid -> medium.
  with_nan = length.laser_d_buckets(np.array([1, 0, np.nan]), group_size=3)
  np.testing.assert_array_equal(with_nan, [1, 1, 1])


def test_laser_d_reward_uses_bucket_targets():
  reward = rewards.LaserReward(bucket_targets=(100, 200, 300))
  completions = [r"\boxed{1}", r"\boxed{1}", r"\boxed{1}", r"\boxed{2}"]  # group 0 easy, 1 medium
  out = reward.evaluate(
    ["q"] * 4,
    completions,
    answer=["1", "1", "1", "1"],
    completion_lengths=[150, 50, 150, 10],
    group_size=2,
  )
  # easy target 100: 150 too long (+0), 50 short (+0.5); medium target 200: 150 short (+0.5).
  np.testing.assert_allclose(out.rewards, [1.0, 1.5, 1.5, -0.5])
  assert out.metrics["laser/bucket_frac/easy"] == 0.5


def test_format_templates():
  ok = "<think>reasoning\nmore</think>\n<answer>42</answer>\n"
  bad = [
    "<think>a</think><answer>1</answer> trailing",
    "<answer>1</answer><think>a</think>",
    "<think>a</think><think>b</think><answer>1</answer>",
    "<think>a<answer>1</answer>",
    "",
  ]
  assert rewards.format_ok(ok)
  assert not any(rewards.format_ok(b) for b in bad)
  assert rewards.format_ok(r"so \boxed{\frac{1}{2}}", "boxed")
  assert not rewards.format_ok(r"\boxed{1} \boxed{2}", "boxed")
  assert rewards.format_ok("ANSWER: 7", r"ANSWER: \d+")
  np.testing.assert_array_equal(
    rewards.FormatReward(bad_value=-1.0)(["q"] * 2, [ok, bad[0]]), [1, -1]
  )


def test_combined_reward_weights_gates_metrics():
  completions = [
    "<think>x</think><answer>\\boxed{3}</answer>",
    "<think>x</think><answer>\\boxed{4}</answer>",
    "\\boxed{3}",
  ]
  fields = {"answer": ["3", "3", "3"], "completion_lengths": [10, 10, 95]}
  combined = rewards.CombinedReward(
    {
      "math": rewards.MathReward(),
      "format": rewards.FormatReward(),
      "overlong": rewards.OverlongReward(max_len=100, buffer_len=10),
    },
    weights={"math": 1.0, "format": 0.5, "overlong": 1.0},
  )
  out = combined.evaluate(["q"] * 3, completions, **fields)
  np.testing.assert_allclose(out.rewards, [1.5, 0.5, 1.0 - 0.5])
  assert out.metrics["reward/math/mean"] == pytest.approx(2 / 3)
  assert out.metrics["reward/format/mean"] == pytest.approx(2 / 3)
  np.testing.assert_array_equal(out.info["correct"], [1, 0, 1])
  gated = rewards.CombinedReward(
    {"math": rewards.MathReward(), "format": rewards.FormatReward()}, gates=("format",)
  )
  np.testing.assert_allclose(gated(["q"] * 3, completions, **fields), [1, 0, 0])
  with pytest.raises(ValueError, match="unknown components"):
    rewards.CombinedReward({"math": rewards.MathReward()}, weights={"fmt": 1.0})


def test_verpo_golden_and_reward():
  passed = np.array([[1, 1, 1], [1, 0, 0]])
  np.testing.assert_allclose(
    rewards.verpo_rewards(passed, group_size=2), [1.5, 0.000499], atol=1e-6
  )
  # Independent float64 reference on random pass matrices, with a failed (NaN) row excluded.
  rng = np.random.default_rng(1)
  matrix = rng.integers(0, 2, size=(8, 5)).astype(np.float64)
  matrix[3] = np.nan
  got = rewards.verpo_rewards(matrix, group_size=4, lam=0.5, eps_w=1e-3)
  for p in range(2):
    rows = [r for r in range(4 * p, 4 * p + 4) if not np.isnan(matrix[r, 0])]
    rho = matrix[rows].mean(0)
    w = (1 - rho + 1e-3) / (1 - rho + 1e-3).sum()
    for r in rows:
      assert got[r] == pytest.approx(float(matrix[r].all()) + 0.5 * (w @ matrix[r]), abs=1e-6)
  assert np.isnan(got[3])


def test_arithmetic_reward_on_generated_problems():
  spec = TaskSpec(name="arithmetic", ops="+-*", num_terms=3, max_value=99)
  a = make_example(spec, 7, seed=0, split="train")
  assert a == make_example(spec, 7, seed=0, split="train")
  # Independent check of the stored answer with Python's own evaluator on trusted text.
  assert int(a["answer"]) == eval(a["key"])  # noqa: S307
  assert tasks.evaluate_expression(a["key"]) == int(a["answer"])
  reward = rewards.ArithmeticReward()
  completions = [f"<answer>{a['answer']}</answer>", "<answer>0.5</answer>", f"so {a['answer']}."]
  np.testing.assert_array_equal(reward(["q"] * 3, completions, answer=[a["answer"]] * 3), [1, 0, 1])
  # The info columns: the format flag counts only the marked forms (tag or box), not a bare number.
  completions.append(f"\\boxed{{{a['answer']}}}")
  out = reward.combine([reward.score_item("q", c, answer=a["answer"]) for c in completions])
  np.testing.assert_array_equal(out.info["correct"], [1, 0, 1, 1])
  np.testing.assert_array_equal(out.info["has_answer"], [1, 1, 1, 1])
  np.testing.assert_array_equal(out.info["formatted"], [1, 1, 0, 1])


def test_countdown_generator_and_checker():
  spec = TaskSpec(name="countdown", num_terms=4, min_value=1, max_value=99)
  problem = make_example(spec, 3, seed=0, split="train")
  assert problem == make_example(spec, 3, seed=0, split="train")
  assert len(problem["numbers"]) == 4
  check = tasks.check_countdown
  assert check("(3 + 5) * 2", [2, 3, 5, 7], 16) == (True, True)
  assert check("3 + 5 * 2", [2, 3, 5, 7], 16) == (True, False)
  assert check("(3 + 3) * 2", [2, 3, 5, 7], 12) == (False, False)  # 3 used twice
  assert check("8 * 2", [2, 3, 5, 7], 16) == (False, False)  # 8 not given
  assert check("7 / (5 - 5)", [5, 5, 7], 1) == (False, False)  # division by zero
  assert check("2 ** 3", [2, 3], 8) == (False, False)  # no powers
  assert check("__import__('os').system('x')", [1], 1) == (False, False)
  assert check("(7 - 5) / 2 = 1", [2, 5, 7], 1) == (True, True)
  assert check("7 / 2 * 2", [2, 2, 7], 7) == (True, True)  # exact fractions, not floats
  reward = rewards.CountdownReward()
  out = reward(
    ["q"] * 3,
    ["<answer>(3 + 5) * 2</answer>", "<answer>3 + 5</answer>", "16"],
    numbers=[[2, 3, 5, 7]] * 3,
    target=[16] * 3,
  )
  np.testing.assert_allclose(out, [1.0, 0.1, 0.0])


def test_countdown_generated_problems_are_solvable():
  # Brute force over expressions for small problems: every generated target is reachable.
  import itertools
  from fractions import Fraction

  def reachable(nums):
    values = set()
    if len(nums) == 1:
      return {nums[0]}
    for i in range(1, len(nums)):
      for left in reachable(nums[:i]):
        for right in reachable(nums[i:]):
          values |= {left + right, left - right, left * right}
          if right != 0:
            values.add(left / right)
    return values

  spec = TaskSpec(name="countdown", num_terms=3, min_value=1, max_value=20)
  for index in range(10):
    problem = make_example(spec, index, seed=0, split="train")
    nums = [Fraction(n) for n in problem["numbers"]]
    all_values = set()
    for perm in itertools.permutations(nums):
      for k in range(1, 4):
        all_values |= reachable(list(perm[:k]))
    assert Fraction(problem["target"]) in all_values
