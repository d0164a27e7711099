"""reasoning-gym as a data source: named tasks with their config, a held-out split from another
seed with no shared question, its own score_answer as the reward, config errors before any build."""

import json

import numpy as np
import pytest
import reasoning_gym

from rlvr_jax import data as data_lib
from rlvr_jax import rewards
from rlvr_jax.data import reasoning_gym_source as rgs
from rlvr_jax.train import config as config_lib

_SMALL = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1)


def _config(tmp_path, **rg):
  c = config_lib.tiny_config(tmp_path)
  c.data.source = "reasoning_gym"
  c.reward.name = "reasoning_gym"
  c.data.num_eval = 8
  c.data.reasoning_gym.update(
    {"tasks": "chain_sum", "task_config": {"chain_sum": dict(_SMALL)}, "size": 64, **rg}
  )
  return c


def test_records_are_the_library_entries_with_disjoint_heldout(tmp_path):
  c = _config(tmp_path, tasks="chain_sum,count_bits", size=40)
  c.data.reasoning_gym.task_config = {"chain_sum": dict(_SMALL)}
  train, heldout = rgs.build_records(c.data)
  assert [r["task"] for r in train] == ["chain_sum"] * 20 + ["count_bits"] * 20
  assert [r["task"] for r in heldout] == ["chain_sum"] * 4 + ["count_bits"] * 4
  # Train entry i of a task is the library's entry i for seed data.seed with that task config.
  ds = reasoning_gym.create_dataset("chain_sum", seed=c.data.seed, size=20, **_SMALL)
  assert [r["reasoning_gym"]["entry"] for r in train[:20]] == [ds[i] for i in range(20)]
  assert train[0]["prompt"] == ds[0]["question"] + "\n" + rgs.ANSWER_INSTRUCTION
  assert train[0]["answer"] == ds[0]["answer"]
  # Held-out: other RNG seeds, and no question shared with train (1-digit sums repeat often).
  train_q = {r["reasoning_gym"]["entry"]["question"] for r in train}
  held_q = [r["reasoning_gym"]["entry"]["question"] for r in heldout]
  assert len(set(held_q)) == len(held_q) and not train_q & set(held_q)
  # Deterministic in the config; another data.seed gives other problems.
  again, _ = rgs.build_records(c.data)
  assert json.dumps(again, sort_keys=True) == json.dumps(train, sort_keys=True)
  c.data.seed = 5
  other, _ = rgs.build_records(c.data)
  assert [r["prompt"] for r in other] != [r["prompt"] for r in train]


def test_prompt_source_streams_train_records_and_restores(tmp_path):
  c = _config(tmp_path, answer_format="raw", prompt_template="{metadata[expression]}=")
  source, heldout = data_lib.build_sources(c.data)
  assert len(source.records) == 64 and len(heldout) == 8
  first = source.take(5)
  assert all(r["prompt"].endswith("=") and "State" not in r["prompt"] for r in first)
  state = source.state()
  nxt = source.take(3)
  source.restore(state)
  assert source.take(3) == nxt


def test_unknown_task_is_a_config_error_with_closest_and_valid_names(tmp_path):
  c = _config(tmp_path, tasks="chain_summ")
  c.data.reasoning_gym.task_config = {}
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(c)
  msg = str(e.value)
  assert msg.startswith("config.data.reasoning_gym.tasks:")
  assert "'chain_summ'" in msg and "did you mean 'chain_sum'" in msg
  assert "leg_counting" in msg  # the list of valid tasks


@pytest.mark.parametrize(
  "task_config, field, text",
  [
    ({"chain_sum": {"min_term": 2}}, "task_config.chain_sum.min_term", "not a field of"),
    ({"chain_sum": {"seed": 3}}, "task_config.chain_sum.seed", "data.seed"),
    ({"chain_sum": {"min_terms": 3, "max_terms": 2}}, "task_config.chain_sum", "max_terms"),
    ({"chain_sum": {}, "chain_sun": {"min_terms": 2}}, "task_config.chain_sun", "'chain_sum'"),
  ],
)
def test_bad_task_config_names_the_field(tmp_path, task_config, field, text):
  c = _config(tmp_path)
  c.data.reasoning_gym.task_config = task_config
  with pytest.raises(config_lib.ConfigError, match=text) as e:
    config_lib.validate(c)
  assert str(e.value).startswith(f"config.data.reasoning_gym.{field}:")


def test_trainer_rejects_unknown_task_before_building_anything(tmp_path):
  from rlvr_jax.train.loop import Trainer

  c = _config(tmp_path / "run", tasks="no_such_task")
  with pytest.raises(config_lib.ConfigError, match="data.reasoning_gym.tasks"):
    Trainer(c, log=lambda s: None)
  assert not (tmp_path / "run").exists()  # failed before the workdir was even created


def test_reward_is_score_answer_of_the_task(tmp_path):
  c = _config(tmp_path, tasks="chain_sum,letter_counting", size=8)
  c.data.reasoning_gym.task_config = {"chain_sum": dict(_SMALL)}
  train, _ = rgs.build_records(c.data)
  rows, completions = [], []
  for r in train:
    for text in (f"<answer>{r['answer']}</answer>", f"<answer>{r['answer']}0</answer>", "no tag"):
      rows.append(r)
      completions.append(text)
  fields = {"reasoning_gym": [r["reasoning_gym"] for r in rows]}
  with rewards.RewardRuntime(num_workers=1, timeout_s=30.0) as runtime:
    result = runtime.run(
      rewards.ReasoningGymReward(), [r["prompt"] for r in rows], completions, **fields
    )
  expected = []
  for r, text in zip(rows, completions, strict=True):
    ds = reasoning_gym.create_dataset(r["task"], **r["reasoning_gym"]["config"])
    expected.append(ds.score_answer(rewards.reasoning_gym_reward.extract(text, "answer_tag"),
                                    r["reasoning_gym"]["entry"]))  # fmt: skip
  np.testing.assert_allclose(result.rewards, expected)
  assert result.rewards.reshape(-1, 3)[:, 0].tolist() == [1.0] * len(train)
  assert result.rewards.reshape(-1, 3)[:, 2].tolist() == [0.0] * len(train)
  assert result.info["correct"].reshape(-1, 3)[:, 1].max() == 0.0


def test_raw_answer_format_scores_the_whole_completion():
  reward = rewards.ReasoningGymReward(answer_format="raw")
  entry = reasoning_gym.create_dataset("chain_sum", seed=0, size=1, **_SMALL)[0]
  row = {"task": "chain_sum", "config": dict(_SMALL), "entry": entry}
  out = reward.evaluate(["p"] * 2, [f" {entry['answer']}\n", "7777"], reasoning_gym=[row] * 2)
  assert out.rewards.tolist() == [1.0, 0.0]
  with pytest.raises(ValueError, match="answer_format"):
    rewards.ReasoningGymReward(answer_format="boxed")


@pytest.mark.slow
def test_trainer_runs_on_a_reasoning_gym_task(tmp_path):
  """Two RL steps of the tiny model on chain_sum: prompts, rewards and evaluation go through the
  library's entries and verifier (a random model scores ~0, so check the plumbing, not learning)."""
  from rlvr_jax.train import loop

  c = _config(tmp_path, answer_format="raw", prompt_template="{metadata[expression]}=")
  c.tokenizer.alphabet = "0123456789+-*= "
  c.data.num_eval = 4
  summary = loop.train(c, log=lambda s: None)
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert summary["steps"] == 2 and {"eval/accuracy", "eval/pass@1"} <= set(summary["eval_after"])
  rewards_seen = [r["reward/mean"] for r in rows if "reward/mean" in r]
  assert len(rewards_seen) == 2 and all(0.0 <= v <= 1.0 for v in rewards_seen)


def test_task_config_json_merges_and_unused_tasks_are_ignored(tmp_path):
  c = _config(tmp_path, tasks="leg_counting", size=8)  # task_config still holds chain_sum's
  c.data.reasoning_gym.task_config_json = '{"leg_counting": {"min_animals": 2, "max_animals": 2}}'
  config_lib.validate(c)
  train, _ = rgs.build_records(c.data)
  assert {r["task"] for r in train} == {"leg_counting"}
  assert all(len(r["reasoning_gym"]["entry"]["metadata"]["animals"]) == 2 for r in train)
  c.data.reasoning_gym.task_config_json = '{"leg_counting": [1]}'
  with pytest.raises(config_lib.ConfigError, match="task_config_json"):
    config_lib.validate(c)


def test_warm_start_streams_train_records_only(tmp_path):
  from rlvr_jax.train import build

  c = _config(tmp_path)
  source, heldout = data_lib.build_sources(c.data)
  warm = build.warm_start_source(c).take(64)
  train_q = {r["prompt"] for r in source.records}
  assert {r["prompt"] for r in warm} == train_q  # one shuffled epoch of the 64 train entries
  assert [r["prompt"] for r in warm] != [r["prompt"] for r in source.take(64)]  # its own order
  assert not train_q & {r["prompt"] for r in heldout}
