"""Label-free group rewards: TTRL majority vote and Co-Reward cross-prompt agreement, their
collapse-monitor metrics, failures, and selection through the registry and CombinedReward."""

import numpy as np
import pytest

from rlvr_jax import rewards
from rlvr_jax.rewards import registry


def _tag(x):
  return f"so <answer>{x}</answer>"


def test_answer_key_canonical_forms():
  assert rewards.answer_key("3/4") == rewards.answer_key("0.75") == rewards.answer_key("0.750")
  assert rewards.answer_key("1,000") == rewards.answer_key("1000")
  assert rewards.answer_key("  ") is None and rewards.answer_key(None) is None
  assert rewards.answer_key("x+1") != rewards.answer_key("x+2")


def test_majority_ties_go_to_first_seen():
  assert rewards.majority(["a", "b", "b", "a"]) == ("a", 2)
  assert rewards.majority([None, "b", "c", "c"]) == ("c", 2)
  assert rewards.majority([None, None]) == (None, 0)


def test_majority_vote_rewards_and_monitor():
  completions = [
    _tag(3),
    _tag("3.0"),
    _tag(4),
    "no answer here",  # group 0: majority 3
    _tag(5),
    _tag(6),
    _tag(6),
    _tag(5),
  ]  # group 1: tie 5 / 6 -> 5 (seen first)
  out = rewards.MajorityVoteReward(extract=("answer_tag",)).evaluate(
    ["q"] * 8, completions, group_size=4, answer=["3"] * 4 + ["6"] * 4
  )
  np.testing.assert_array_equal(out.rewards, [1, 1, 0, 0, 1, 0, 0, 1])
  m = out.metrics
  assert m["agreement_rate"] == pytest.approx((2 / 4 + 2 / 4) / 2)
  assert m["answer_diversity"] == pytest.approx((2 / 3 + 2 / 4) / 2)
  assert m["no_answer_rate"] == pytest.approx(1 / 8)
  assert m["label_accuracy"] == pytest.approx(0.5)  # 3 right, 5 wrong (gold 6)
  # reward_accuracy: how often the pseudo-reward equals the true 0/1 outcome.
  true = np.array([1, 1, 0, 0, 0, 1, 1, 0])
  assert m["reward_accuracy"] == pytest.approx(np.mean((out.rewards > 0.5) == true))
  np.testing.assert_array_equal(out.info["true_correct"], true)
  np.testing.assert_array_equal(out.info["correct"], true)  # for evaluation and monitoring
  hidden = rewards.MajorityVoteReward(extract=("answer_tag",), report_correct=False).evaluate(
    ["q"] * 8, completions, group_size=4, answer=["3"] * 4 + ["6"] * 4
  )
  assert "correct" not in hidden.info
  np.testing.assert_array_equal(hidden.rewards, out.rewards)


def test_majority_vote_without_answers_and_failed_items():
  reward = rewards.MajorityVoteReward()
  scores = [{"key": "n:1"}, None, {"key": "n:1"}, {"key": "n:2"}]
  out = reward.combine(scores, group_size=4)
  assert np.isnan(out.rewards[1]) and list(out.rewards[[0, 2, 3]]) == [1, 1, 0]
  assert "label_accuracy" not in out.metrics
  with pytest.raises(ValueError, match="group_size"):
    reward.combine(scores)


def test_collapse_monitor_reads_a_collapsed_group():
  out = rewards.MajorityVoteReward().evaluate(["q"] * 4, [_tag(7)] * 4, group_size=4)
  assert out.metrics["agreement_rate"] == 1.0
  assert out.metrics["answer_diversity"] == 0.25
  np.testing.assert_array_equal(out.rewards, [1, 1, 1, 1])


def test_co_reward_uses_the_partner_groups_majority():
  # Groups 0 and 1 are a question and its rephrasing; group 2 is alone.
  completions = [
    _tag(3),
    _tag(3),
    _tag(4),
    _tag(4),  # own tie 3/4 -> 3
    _tag(4),
    _tag(4),
    _tag(4),
    _tag(3),  # majority 4
    _tag(9),
    _tag(9),
    _tag(1),
    _tag(1),
  ]
  pair_key = ["a"] * 8 + ["b"] * 4
  out = rewards.CoReward().evaluate(["q"] * 12, completions, group_size=4, pair_key=pair_key)
  # Group 0 is scored against group 1's majority (4), group 1 against group 0's (3).
  np.testing.assert_array_equal(out.rewards[:8], [0, 0, 1, 1, 0, 0, 0, 1])
  assert np.all(np.isnan(out.rewards[8:]))
  assert sorted(out.failures) == [8, 9, 10, 11]
  assert out.metrics["cross_agreement"] == 0.0  # own majorities 3 vs 4 disagree
  fallback = rewards.CoReward(unpaired="self").evaluate(
    ["q"] * 12, completions, group_size=4, pair_key=pair_key
  )
  np.testing.assert_array_equal(fallback.rewards[8:], [1, 1, 0, 0])
  with pytest.raises(ValueError, match="pair_key"):
    rewards.CoReward().evaluate(["q"] * 4, completions[:4], group_size=4)


def test_selectable_by_name_and_combined():
  assert isinstance(registry.build_library_reward("majority_vote"), rewards.MajorityVoteReward)
  assert isinstance(registry.build_library_reward("co_reward"), rewards.CoReward)
  combined = rewards.CombinedReward(
    {"vote": rewards.MajorityVoteReward(), "fmt": rewards.FormatReward()},
    weights={"vote": 1.0, "fmt": 0.1},
  )
  completions = [_tag(3), _tag(3), _tag(4), _tag(3)]
  out = combined.evaluate(["q"] * 4, completions, group_size=4)
  assert out.metrics["vote/agreement_rate"] == 0.75
  np.testing.assert_allclose(out.info["vote/reward"], [1, 1, 0, 1])


def test_config_refuses_zero_variance_mask_with_a_label_free_reward():
  from rlvr_jax.train import config as config_lib  # noqa: PLC0415

  c = config_lib.tiny_config("/tmp/unused")
  c.reward.name = "majority_vote"
  config_lib.validate(c)  # tiny_config keeps zero-variance groups
  c.rl.zero_variance = "mask"
  with pytest.raises(config_lib.ConfigError, match="rl.zero_variance.*leak labels"):
    config_lib.validate(c)
  c.reward.name = ""
  c.reward.components.vote = config_lib.reward_config.reward_component(
    "majority_vote", report_correct=False
  )
  config_lib.validate(c)
