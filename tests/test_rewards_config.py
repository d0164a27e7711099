"""Rewards from the config: every library reward by name, user rewards by import path, gates and
weights, errors before any compile, and bad reward outputs as counted failures."""

import dataclasses
import math

import numpy as np
import pytest

from rlvr_jax import rewards
from rlvr_jax.metrics import read_jsonl, reward_component_fields
from rlvr_jax.rewards import registry
from rlvr_jax.rewards.runtime import RewardRuntime
from rlvr_jax.train import build, reward_config
from rlvr_jax.train import config as config_lib
from rlvr_jax.train.config import ConfigError
from rlvr_jax.train.loop import train
from rlvr_jax.train.reward_config import reward_component
from rlvr_jax.train.reward_results import merge_reward_metrics, reward_fields

THIS = __name__  # importable by path in-process and in the workers (tests/ is on sys.path)


# --- user rewards referenced by import path ------------------------------------------------------
def brevity(prompts, completions, *, scale=1.0, **fields):
  """-scale * tokens: a user function with a keyword argument."""
  return -scale * np.asarray(fields["completion_lengths"], np.float32)


def needs_budget(prompts, completions, budget, **fields):
  return np.zeros(len(completions), np.float32)


def flaky(prompts, completions, **fields):
  """Raises on completions containing '7', NaN on '8', a string on '9', else 1."""
  text = completions[0]
  if "7" in text:
    raise RuntimeError("flaky reward saw a 7")
  if "8" in text:
    return np.array([np.nan])
  if "9" in text:
    return "nine"
  return np.ones(1, np.float32)


@dataclasses.dataclass(frozen=True)
class NeedsTarget(rewards.ItemReward):
  target: str

  def score_item(self, prompt, completion, **row):
    return {"reward": float(completion == self.target)}


@dataclasses.dataclass(frozen=True)
class NotADict(rewards.ItemReward):
  def score_item(self, prompt, completion, **row):
    return 1.0


@dataclasses.dataclass(frozen=True)
class WrongLength(rewards.ItemReward):
  def score_item(self, prompt, completion, **row):
    return {"reward": 1.0}

  def combine(self, scores, **fields):
    return rewards.RewardOutput(rewards=np.zeros(len(scores) + 1, np.float32))


def _components(**components):
  c = config_lib.tiny_config("/tmp/unused")
  c.reward.name = ""
  for key, spec in components.items():
    c.reward.components[key] = spec
  return c


# --- every path of a component --------------------------------------------------------------------
LIBRARY_KWARGS = {"code": {"limits": {"timeout_s": 3.0}}, "format": {"template": "answer"}}


@pytest.mark.parametrize("name", sorted(registry.REWARDS))
def test_every_library_reward_is_selectable_by_name(name):
  c = _components(r=reward_component(name, **LIBRARY_KWARGS.get(name, {})))
  if name in reward_config.SOURCE_REWARDS.values():  # verifiers that go with their data source
    with pytest.raises(config_lib.ConfigError, match="scores the records of data.source"):
      config_lib.validate(c)
    c.data.source = name
  config_lib.validate(c)
  combined = build.build_reward(c)
  reward = combined.rewards["r"]
  assert type(reward) is registry.REWARDS[name]
  budget = c.sampling.max_new_tokens
  if name in ("overlong", "cosine"):  # limits from the sampling budget, not 16k-token defaults
    assert reward.max_len == budget
  if name == "cosine":
    assert reward.exceed_margin == 0
  if name == "overlong":
    assert reward.buffer_len == max(1, round(0.2 * budget))
  if name == "laser":
    assert reward.target_length == max(1, budget // 2)
  if name == "code":  # a dict for a dataclass-valued field becomes that dataclass
    assert reward.limits == rewards.SandboxLimits(timeout_s=3.0)


def test_reward_name_shorthand_stays_the_library_class():
  c = config_lib.tiny_config("/tmp/unused")
  assert type(build.build_reward(c)) is rewards.ArithmeticReward
  c.reward.name = "overlong"
  c.sampling.max_new_tokens = 40
  assert build.build_reward(c) == rewards.OverlongReward(max_len=40, buffer_len=8)
  c.reward.name = f"{THIS}:brevity"
  reward = build.build_reward(c)
  assert isinstance(reward, rewards.CombinedReward) and list(reward.rewards) == ["brevity"]


def test_user_rewards_by_import_path_with_weights_gates_and_kwargs():
  c = _components(
    acc=reward_component("arithmetic"),
    short=reward_component(fn=f"{THIS}:brevity", weight=0.5, scale=2.0),
    exact=reward_component(fn=f"{THIS}:NeedsTarget", target="12"),
    fmt=reward_component("format", gate=True, template="[0-9]+"),
    cos=reward_component("cosine", correctness="arithmetic"),
  )
  config_lib.validate(c)
  reward = build.build_reward(c)
  assert reward.gates == ("fmt",) and reward.weights == {
    "acc": 1,
    "cos": 1,
    "exact": 1,
    "short": 0.5,
  }
  assert isinstance(reward.rewards["cos"].correctness, rewards.ArithmeticReward)
  out = reward.evaluate(
    ["p"] * 3, ["12", "5", "x1"], answer=["12", "12", "1"], completion_lengths=[2, 1, 2]
  )
  # R = fmt * (acc + 0.5 * (-2 * len) + exact + cos), cos(n / L) with L = 3 tokens.
  cos = [1 + 0.5 * (1 + math.cos(math.pi * 2 / 3)), -10 * 0.5 * (1 + math.cos(math.pi / 3))]
  expected = [1 - 2.0 + 1 + cos[0], 0 - 1.0 + 0 + cos[1], 0.0]
  np.testing.assert_allclose(out.rewards, expected, rtol=1e-6)
  np.testing.assert_array_equal(out.info["fmt/format_ok"], [1, 1, 0])
  np.testing.assert_array_equal(out.info["correct"], [1, 0, 1])  # first reporting component


def test_group_aware_components_get_group_size_and_token_lengths():
  # LASER-D buckets by group accuracy: group 0 (2 of 2 right) is easy, group 1 (0 of 2) hard.
  c = _components(
    laser=reward_component("laser", bucket_targets=(1, 2, 3), correctness="arithmetic"),
    len=reward_component("overlong", weight=0.5),
  )
  config_lib.validate(c)
  out = build.build_reward(c).evaluate(
    ["p"] * 4,
    ["4", "4", "x", "5"],
    answer=["4", "4", "3", "3"],
    completion_lengths=[1, 2, 3, 3],
    group_size=2,
  )
  # laser: +1 correct, +0.5 within the easy target (1 token); -1 no answer, -0.5 wrong answer.
  # overlong (L = 3, buffer 1): -1 at 3 tokens, times 0.5.
  np.testing.assert_allclose(out.rewards, [1.5, 1.0, -1.5, -1.0])
  assert out.metrics["laser/laser/bucket_frac/easy"] == 0.5
  assert out.metrics["reward/laser/mean"] == 0.25


# --- errors before any compile ---------------------------------------------------------------------
def _set(path, value):
  def mutate(c):
    *parents, leaf = path.split(".")
    node = c
    for p in parents:
      node = node[p]
    node[leaf] = value

  return mutate


CONFIG_ERRORS = [
  (
    _set("reward.components.a.name", "arithmatic"),
    r"components\.a\.name: 'arithmatic' is not a library reward; did you mean 'arithmetic'\?"
    r" Valid names: arithmetic, co_reward, code, cosine, countdown, format, humaneval, laser,"
    r" majority_vote, math, overlong",
  ),
  (_set("reward.components.a.fn", "x:y"), r"components\.a: set exactly one of name .* or fn"),
  (
    lambda c: (
      _set("reward.components.a.name", "")(c),
      _set("reward.components.a.fn", "no_mod:f")(c),
    ),
    r"components\.a\.fn: cannot import module 'no_mod': ModuleNotFoundError",
  ),
  (
    lambda c: (
      _set("reward.components.a.name", "")(c),
      _set("reward.components.a.fn", f"{THIS}:brevty")(c),
    ),
    r"components\.a\.fn: .* has no attribute 'brevty' \(did you mean 'brevity'\?\)",
  ),
  (
    lambda c: (_set("reward.components.a.name", "")(c), _set("reward.components.a.fn", THIS)(c)),
    r"components\.a\.fn: .* not an import path of the form 'package.module:attribute'",
  ),
  (
    _set("reward.components.b", reward_component(fn=f"{THIS}:needs_budget")),
    r"components\.b\.kwargs: needs_budget\(\) needs \['budget'\]: give them in kwargs",
  ),
  (
    _set("reward.components.b", reward_component(fn=f"{THIS}:NeedsTarget")),
    r"components\.b\.kwargs: missing a required argument: 'target' \(NeedsTarget accepts: target\)",
  ),
  (
    _set("reward.components.b", reward_component("overlong", bufer_len=1)),
    r"components\.b\.kwargs: got an unexpected keyword argument 'bufer_len' \(OverlongReward "
    r"accepts: max_len, buffer_len, penalty_factor\)",
  ),
  (
    _set("reward.components.b", reward_component("format", template="[0-9")),
    r"components\.b\.kwargs: FormatReward\(.*\): .*unterminated character set",
  ),
  (
    _set("reward.components.b", reward_component("format", gate=True, weight=2.0)),
    r"components\.b\.weight: a gate multiplies the sum",
  ),
  (_set("reward.components.a.gate", True), r"reward\.components: every component is a gate"),
  (_set("reward.name", "arithmetic"), r"reward\.name: set either reward\.name .* or reward\.comp"),
  (
    _set("reward.components.b", reward_component("cosine", repetition_ngram=4)),
    r"components\.b\.kwargs\.repetition_ngram: per-token rewards are not consumed",
  ),
  (
    _set("reward.components.b", reward_component("cosine", correctness="mth")),
    r"components\.b\.kwargs\.correctness\.name: 'mth' is not a library reward; did you mean 'math'",
  ),
]


@pytest.mark.parametrize("mutate, message", CONFIG_ERRORS)
def test_reward_config_errors_name_the_field_and_the_choices(mutate, message):
  c = _components(a=reward_component("arithmetic"))
  mutate(c)
  with pytest.raises(ConfigError, match=message):
    config_lib.validate(c)


def test_shorthand_unknown_name_lists_the_valid_names():
  c = config_lib.tiny_config("/tmp/unused")
  c.reward.name = "countdwn"
  with pytest.raises(ConfigError, match=r"config\.reward\.name: 'countdwn' .* 'countdown'\?"):
    config_lib.validate(c)


# --- bad outputs at run time: counted failures of the rows concerned -----------------------------
def test_bad_component_outputs_fail_only_their_rows_and_are_counted():
  reward = rewards.CombinedReward(
    {
      "ok": rewards.FormatReward(template="[0-9]+"),
      "flaky": flaky,
      "not_dict": NotADict(),
    },
    weights={"ok": 1.0, "flaky": 1.0},
    gates=("not_dict",),
  )
  with RewardRuntime(num_workers=1, timeout_s=10.0) as rt:
    res = rt.run(reward, ["p"] * 4, ["1", "7", "8", "9"])
    # not_dict fails every row; flaky fails rows 1-3 (raise, NaN, a string).
    causes = {f.index: (f.cause, f.message) for f in res.failures}
    assert sorted(causes) == [0, 1, 2, 3] and np.isnan(res.rewards).all()
    assert res.metrics["reward/not_dict/failures"] == 4.0
    assert res.metrics["reward/flaky/failures"] == 3.0
    assert res.metrics["reward/ok/failures"] == 0.0 and res.metrics["reward/ok/mean"] == 1.0
    np.testing.assert_array_equal(res.info["flaky/reward"][0], 1.0)
    assert res.metrics["reward/fail/invalid"] + res.metrics["reward/fail/exception"] == 4.0
    assert "score_item returned float, not dict" in causes[0][1]

    reward = rewards.CombinedReward({"ok": rewards.FormatReward(template="[0-9]+"), "flaky": flaky})
    res = rt.run(reward, ["p"] * 4, ["1", "7", "8", "9"])
    np.testing.assert_array_equal(res.rewards[0], 2.0)
    assert [(f.index, f.cause) for f in res.failures] == [
      (1, "exception"),
      (2, "invalid"),
      (3, "exception"),
    ]
    assert "flaky reward saw a 7" in res.failures[0].message
    assert "'flaky'" in res.failures[1].message and "nan" in res.failures[1].message

    # A component whose combine returns the wrong length fails its rows, not the batch.
    res = rt.run(rewards.CombinedReward({"w": WrongLength(), "ok": flaky}), ["p"] * 2, ["1", "2"])
    assert [f.cause for f in res.failures] == ["exception"] * 2
    assert "shape (3,), expected (2,)" in res.failures[0].message

    # A bare reward: NaN rows and non-dict scores are counted too.
    res = rt.run(flaky, ["p"] * 3, ["1", "8", "7"])
    assert [(f.index, f.cause) for f in res.failures] == [(1, "invalid"), (2, "exception")]
    res = rt.run(NotADict(), ["p"], ["1"])
    assert res.failures[0].cause == "exception" and "not a dict" in res.failures[0].message


# --- the trainer -----------------------------------------------------------------------------------
def test_trainer_runs_a_combined_reward_with_a_failing_component(tmp_path, caplog):
  c = config_lib.tiny_config(tmp_path)
  c.reward.name = ""
  c.reward.components.acc = reward_component("arithmetic")
  c.reward.components.len = reward_component("overlong", weight=0.5, buffer_len=2)
  c.reward.components.fmt = reward_component("format", gate=True, template="[0-9]*")
  c.reward.components.flaky = reward_component(fn=f"{THIS}:flaky", weight=0.1)
  with caplog.at_level("WARNING", logger="rlvr_jax.train.rollout"):
    train(c, log=lambda s: None)
  steps = [r for r in read_jsonl(str(tmp_path / "metrics.jsonl")) if "loss" in r]
  assert len(steps) == 2
  for r in steps:
    for name in ("acc", "len", "fmt", "flaky"):
      assert f"reward/{name}/mean" in r and f"reward/{name}/failures" in r
    assert -1.0 <= r["reward/len/mean"] <= 0.0 and 0.0 <= r["reward/acc/mean"] <= 1.0
    assert np.isfinite(r["loss"])
    # Only flaky fails, and its failures are exactly the failed rows of the step.
    assert r["reward/acc/failures"] == r["reward/len/failures"] == 0.0
    assert r["reward/fail_frac"] * 16 == r["reward/flaky/failures"]
  assert sum(r["reward/flaky/failures"] for r in steps) > 0  # the run went on regardless
  assert "reward items failed" in caplog.text and "reward component 'flaky'" in caplog.text


def test_progress_bar_and_metric_merging_show_components():
  metrics = {
    "reward/mean": 0.5,
    "reward/acc/mean": 0.25,
    "reward/flaky/failures": 2.0,
    "reward/acc/failures": 0.0,
    "reward/fail/timeout": 1.0,
  }
  assert reward_component_fields(metrics) == ["acc=0.250", "flaky!=2"]
  merged = merge_reward_metrics(
    [
      {"reward/acc/mean": 0.2, "reward/acc/failures": 1.0, "reward/mean": 9.0},
      {"reward/acc/mean": 0.4, "reward/acc/failures": 2.0, "reward/fail/timeout": 1.0},
    ],
    exclude={"reward/mean": 0.5},
  )
  assert merged == pytest.approx(
    {"reward/acc/mean": 0.3, "reward/acc/failures": 3.0, "reward/fail/timeout": 1.0}
  )


def test_example_fields_are_passed_or_named_when_missing():
  records = [{"answer": "1", "tests": ["assert True"], "extra": 3}, {"answer": "2", "tests": []}]
  fields = reward_fields(records, 2)
  assert fields["answer"] == ["1", "1", "2", "2"] and len(fields["tests"]) == 4
  with pytest.raises(ValueError, match=r"reward field 'extra' is missing from 1 record"):
    reward_fields(records, 2, ("extra",))
