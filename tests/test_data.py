"""Data: file loading with row/field errors, procedural tasks and splits, streams, tokenizer."""

import json

import datasets
import numpy as np
import pytest
from ml_collections import ConfigDict

from rlvr_jax import data
from rlvr_jax.data import tasks


def _write_jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


def test_jsonl_records_with_template(tmp_path):
  f = _write_jsonl(
    tmp_path / "d.jsonl",
    [{"question": "1+1?", "solution": 2, "id": 0}, {"question": "2+3?", "solution": 5, "id": 1}],
  )
  recs = data.load_records(f, prompt_template="Q: {question}\nA:", answer_field="solution")
  assert [r["prompt"] for r in recs] == ["Q: 1+1?\nA:", "Q: 2+3?\nA:"]
  assert [r["answer"] for r in recs] == ["2", "5"] and recs[1]["id"] == 1


def test_jsonl_missing_field_names_file_row_field(tmp_path):
  f = _write_jsonl(
    tmp_path / "bad.jsonl",
    [{"question": "a", "answer": "1"}, {"question": "b", "answer": "2"}, {"answer": "3"}],
  )
  with pytest.raises(data.DataError, match=r"bad\.jsonl: row 3: missing field 'question'"):
    data.load_records(f, prompt_template="{question}", answer_field="answer")


def test_jsonl_row_numbers_count_lines_with_blank_lines(tmp_path):
  p = tmp_path / "gaps.jsonl"
  p.write_text('{"q": "a", "answer": "1"}\n\n{"q": "b", "answer": ""}\n')
  with pytest.raises(data.DataError, match=r"gaps\.jsonl: row 3: field 'answer' is empty"):
    data.load_records(str(p), prompt_template="{q}", answer_field="answer")


def test_jsonl_invalid_json_line(tmp_path):
  p = tmp_path / "broken.jsonl"
  p.write_text('{"q": "a", "answer": "1"}\n{"q": "b", "answer": \n')
  with pytest.raises(data.DataError, match=r"broken\.jsonl: row 2: not valid JSON"):
    data.load_records(str(p), prompt_template="{q}", answer_field="answer")
  p.write_text('{"q": "a", "answer": "1"}\n[1, 2]\n')
  with pytest.raises(data.DataError, match=r"row 2: expected a JSON object, got list"):
    data.load_records(str(p), prompt_template="{q}", answer_field="answer")


def test_parquet_missing_answer_field(tmp_path):
  path = str(tmp_path / "d.parquet")
  datasets.Dataset.from_list([{"q": "x", "gold": None}, {"q": "y", "gold": "2"}]).to_parquet(path)
  with pytest.raises(data.DataError, match=r"d\.parquet: row 1: missing field 'gold'"):
    data.load_records(path, prompt_template="{q}", answer_field="gold")
  recs = data.load_records(path, prompt_template="{q}", answer_field="q")
  assert [r["prompt"] for r in recs] == ["x", "y"]


def test_bad_template_and_missing_file(tmp_path):
  with pytest.raises(data.DataError, match="prompt_template"):
    data.template_fields("{question")
  with pytest.raises(data.DataError, match="fields must be plain names"):
    data.template_fields("{0}")
  with pytest.raises(data.DataError, match="file not found"):
    data.load_records(str(tmp_path / "nope.jsonl"), prompt_template="{q}", answer_field="a")


def test_task_splits_are_disjoint_and_deterministic():
  spec = data.TaskSpec(max_value=20, heldout_fraction=0.2)
  train = [tasks.make_example(spec, i, seed=0, split="train") for i in range(300)]
  held = data.heldout_set(spec, 40, seed=1)
  assert {r["key"] for r in train}.isdisjoint({r["key"] for r in held})
  assert len({r["key"] for r in held}) == 40
  again = [tasks.make_example(spec, i, seed=0, split="train") for i in range(300)]
  assert train == again
  for r in train[:50]:
    assert r["prompt"] == r["key"] + "=" and int(r["answer"]) == eval(r["key"])
  # The split is a property of the problem, not of the seed.
  for r in held:
    assert tasks.split_of(r["key"], 0.2) == "heldout"


def test_word_and_countdown_tasks_have_checkable_answers():
  word = data.TaskSpec(style="word", ops="+-*", max_value=12)
  for i in range(30):
    r = tasks.make_example(word, i, seed=3, split="train")
    assert "\\boxed{}" in r["prompt"] and r["answer"].isdigit()
    assert int(r["answer"]) == eval(r["key"]), r
  cd = data.TaskSpec(name="countdown", num_terms=3, min_value=1, max_value=9)
  for i in range(20):
    r = tasks.make_example(cd, i, seed=0, split="train")
    assert len(r["numbers"]) == 3 and r["answer"] == str(r["target"])


def test_no_carry_sum_golden():
  assert tasks.no_carry_sum("57+68") == "15"
  assert tasks.no_carry_sum("5+5") == "0"
  assert tasks.no_carry_sum("12+3") == "15"
  assert tasks.no_carry_sum("49+1") == "40"


def test_task_spec_validation_names_field():
  with pytest.raises(ValueError, match=r"data\.task\.ops="):
    data.TaskSpec(ops="/").validate()
  with pytest.raises(ValueError, match=r"data\.task\.name="):
    data.TaskSpec(name="sudoku").validate()


def test_prompt_source_position_and_restore():
  spec = data.TaskSpec(max_value=30)
  a = data.PromptSource(task=spec, seed=5)
  first = a.take(4)
  assert [r["index"] for r in first] == [0, 1, 2, 3] and a.state() == {"position": 4}
  rest = a.take(3)
  b = data.PromptSource(task=spec, seed=5)
  b.restore({"position": 4})
  assert b.take(3) == rest
  recs = [{"prompt": str(i), "answer": str(i)} for i in range(5)]
  f = data.PromptSource(records=recs, seed=1)
  epoch0, epoch1 = f.take(5), f.take(5)
  assert sorted(r["prompt"] for r in epoch0) == sorted(r["prompt"] for r in epoch1) == list("01234")
  g = data.PromptSource(records=recs, seed=1)
  g.restore({"position": 7})
  assert g.take(3) == [*epoch1[2:]]


@pytest.mark.parametrize("count", [2, 3])
def test_prompt_source_shards_split_every_batch(count):
  """Per-process loading: shard i of ``count`` reads only its contiguous slice of each global
  batch; the slices are disjoint, their union in shard order is the unsharded stream's batch, and
  every shard keeps the global position (one checkpointed int restores all of them)."""
  recs = [{"prompt": f"p{i}", "answer": str(i)} for i in range(7)]
  for make in (
    lambda: data.PromptSource(task=data.TaskSpec(max_value=30), seed=5),
    lambda: data.PromptSource(records=recs, seed=1),  # shuffled per epoch; batches cross epochs
  ):
    whole, shards = make(), [make().shard(i, count) for i in range(count)]
    for n in (4, 5, 6):  # uneven splits too: sizes differ by at most one
      want = whole.take(n)
      got = [s.take(n) for s in shards]
      assert [r for g in got for r in g] == want
      sizes = [len(g) for g in got]
      assert max(sizes) - min(sizes) <= 1
      assert [s.span(n) for s in shards] == [
        data.source.shard_span(n, i, count) for i in range(count)
      ]
      assert all(s.state() == whole.state() for s in shards)
    # Resume: a fresh shard restored from the checkpointed position continues exactly.
    again = make().shard(count - 1, count)
    again.restore(shards[-1].state())
    assert again.take(5) == shards[-1].take(5)
  assert data.source.shard_span(5, 0, 2) == (0, 2) and data.source.shard_span(5, 1, 2) == (2, 5)
  with pytest.raises(ValueError, match=r"shard index 2 must be in \[0, count=2\)"):
    data.PromptSource(records=recs).shard(2, 2)
  with pytest.raises(ValueError, match="already shard 0 of 2"):
    data.PromptSource(records=recs).shard(0, 2).shard(0, 2)


def test_build_sources_files_content_split(tmp_path):
  rows = [{"question": f"q{i}", "answer": str(i)} for i in range(200)]
  f = _write_jsonl(tmp_path / "all.jsonl", rows)
  cfg = ConfigDict(
    dict(source="files", path=f, eval_path="", prompt_template="{question}", answer_field="answer",
         seed=0, num_eval=1000, task=dict(heldout_fraction=0.2))
  )  # fmt: skip
  train, held = data.build_sources(cfg)
  train_prompts = {r["prompt"] for r in train.records}
  assert train_prompts.isdisjoint({r["prompt"] for r in held})
  assert len(train_prompts) + len(held) == 200 and 10 < len(held) < 80


def test_char_tokenizer_round_trip_and_left_padding():
  tok = data.CharTokenizer("0123456789+=")
  ids, mask = tok.encode_batch(["1+2=", "12+34="])
  assert ids.shape == (2, 7) and mask.dtype == bool
  np.testing.assert_array_equal(mask[0], [False, False, True, True, True, True, True])
  assert ids[0, 2] == tok.bos_id and ids[0, 0] == tok.pad_id
  assert tok.decode_batch(ids, mask) == ["1+2=", "12+34="]
  with pytest.raises(ValueError, match="'x' in '1x'"):
    tok.encode("1x")
  ids, mask = data.encode_prompts(["1+2="], tok, add_special_tokens=True, bucket=8)
  assert ids.shape == (1, 8) and mask.sum() == 5 and mask[0, -1]
  assert tok.apply_chat_template([{"role": "user", "content": "3+4="}]) == "3+4="


def test_countdown_records_are_solvable_and_scored_by_the_reward():
  import itertools

  from rlvr_jax import rewards

  reward = rewards.CountdownReward()
  spec = data.TaskSpec(name="countdown", num_terms=3, min_value=1, max_value=9)
  for i in range(5):
    r = tasks.make_example(spec, i, seed=0, split="train")
    found = None
    for perm in itertools.permutations(r["numbers"]):
      for ops in itertools.product("+-*", repeat=2):
        expr = f"({perm[0]}{ops[0]}{perm[1]}){ops[1]}{perm[2]}"
        if eval(expr) == r["target"]:
          found = expr
    assert found is not None, r
    out = reward.evaluate([r["prompt"]], [f"<answer>{found}</answer>"], numbers=[r["numbers"]],
                 target=[r["target"]])  # fmt: skip
    assert float(out.info["correct"][0]) == 1.0


def test_worked_solutions_carry_and_the_flawed_teacher_drops_it():
  assert tasks.worked_solution("27+48") == "1507>75"  # 7+8 = 15, 2+4+1 = 07
  assert tasks.worked_solution("27+48", carry=False) == "1506>65"
  assert tasks.worked_solution("49+49") == "1809>98"
  assert tasks.worked_solution("99+01") == "1010>100"  # the final carry leads the answer
  spec = tasks.TaskSpec(style="worked", max_value=49, zero_pad=True)
  for i in range(50):
    r = tasks.make_example(spec, i, seed=0, split="train")
    working, answer = r["demonstration"].split(">")
    assert answer == r["answer"] == str(sum(int(v) for v in r["key"].split("+")))
  with pytest.raises(ValueError, match=r"data\.task\.style='worked'"):
    tasks.TaskSpec(style="worked", ops="+-").validate()


def test_paraphrase_pairs_share_a_key_and_stay_in_their_split():
  spec = tasks.TaskSpec(max_value=49, zero_pad=True, paraphrase=True, heldout_fraction=0.2)
  rows = [tasks.make_example(spec, i, seed=0, split="train") for i in range(200)]
  for a, b in zip(rows[::2], rows[1::2], strict=True):
    assert a["pair_key"] == b["pair_key"] and a["answer"] == b["answer"]
    x, y = a["key"].split("+")
    assert b["key"] == f"{y}+{x}" and b["prompt"] == f"{y}+{x}="
  heldout = tasks.heldout_set(spec, 100, seed=1)
  plain = tasks.heldout_set(
    tasks.TaskSpec(max_value=49, zero_pad=True, heldout_fraction=0.2), 100, seed=1
  )
  assert [r["key"] for r in heldout] == [r["key"] for r in plain]  # the unpaired held-out set
  held = {r["key"] for r in heldout}
  assert not held & {r["key"] for r in rows}  # no order of a held-out problem is trained on
