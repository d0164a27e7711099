"""tools/bench_trl.py builds both sides' settings from one spec: they must agree, and a setting
changed on one side only must be reported."""

import dataclasses
import os
import sys

import pytest

from rlvr_jax import host_memory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
try:
  import bench_trl
finally:
  sys.path.pop(0)

SPEC = bench_trl.Spec(
  prompts_per_step=3, group_size=4, max_new_tokens=24, num_microbatches=2, learning_rate=3e-6
)


def _both(spec, tmp_path):
  c = bench_trl.ours_config(spec, workdir=str(tmp_path / "ours"), steps=5)
  t = bench_trl.trl_kwargs(spec, output_dir=str(tmp_path / "trl"), steps=5)
  return c, t


def test_both_sides_get_the_same_settings(tmp_path):
  c, t = _both(SPEC, tmp_path)
  assert bench_trl.mismatches(c, t) == []
  table = {name: (a, b) for name, a, b in bench_trl.compare(c, t)}
  # the spec's values reached both sides (not two equal defaults)
  assert table["prompts per step"] == (3, 3)
  assert table["rows per micro-batch"] == (6, 6)
  assert table["new-token limit"] == (24, 24)
  assert table["learning rate"] == (3e-6, 3e-6)
  assert table["loss aggregation"] == ("seq_mean_token_mean", "seq_mean_token_mean")
  assert table["optimizer steps per RL step"] == (1, 1)
  assert table["KL coefficient"] == (0.0, 0.0)
  assert table["compute precision"] == ("float32", "float32")


@pytest.mark.parametrize(
  "field, value, setting",
  [
    ("loss_type", "dapo", "loss aggregation"),
    ("adam_beta2", 0.999, "AdamW beta2"),
    ("gradient_accumulation_steps", 3, "micro-batches per optimizer step"),
    ("steps_per_generation", 4, "optimizer steps per RL step"),
    ("epsilon_high", 0.28, "clip high"),
    ("bf16", True, "compute precision"),
  ],
)
def test_a_setting_changed_on_one_side_is_reported(tmp_path, field, value, setting):
  c, t = _both(SPEC, tmp_path)
  t[field] = value
  assert setting in [name for name, _, _ in bench_trl.mismatches(c, t)]


def test_ours_changed_is_reported(tmp_path):
  c, t = _both(SPEC, tmp_path)
  c.objective.kwargs.loss_agg_mode = "token_mean"
  c.rl.zero_variance = "mask"
  names = [name for name, _, _ in bench_trl.mismatches(c, t)]
  assert names == ["loss aggregation", "zero-variance groups trained on"]


def test_bfloat16_needs_the_compute_dtype_field(tmp_path):
  spec = dataclasses.replace(SPEC, dtype="bfloat16")
  c = bench_trl.ours_config(SPEC, workdir=str(tmp_path / "ours"), steps=5)
  if "compute_dtype" not in c.model:
    with pytest.raises(bench_trl.Unsupported, match="compute_dtype"):
      bench_trl.ours_config(spec, workdir=str(tmp_path / "ours"), steps=5)
  else:
    c, t = _both(spec, tmp_path)
    assert bench_trl.mismatches(c, t) == []
    assert t["bf16"] and c.model.compute_dtype == "bfloat16"


def test_trl_accepts_the_settings(tmp_path):
  trl = pytest.importorskip("trl")
  t = bench_trl.trl_kwargs(SPEC, output_dir=str(tmp_path / "trl"), steps=5)
  args = trl.GRPOConfig(**t)
  # one generation batch of P * G rows per optimizer step
  assert args.generation_batch_size == SPEC.prompts_per_step * SPEC.group_size
  assert args.steps_per_generation == args.gradient_accumulation_steps == SPEC.num_microbatches


def test_update_flops_counts_a_shared_prompt_once():
  """By hand: 1 layer, D = N * H = 4 (one head), K = 1, F = 8, V = 10; 4 rows of a 3-token prompt
  and 2 completion tokens, G = 2 rows per prompt."""
  sys.path.insert(0, os.path.join(ROOT, "tools"))
  try:
    from bench_train import update_flops
  finally:
    sys.path.pop(0)
  from rlvr_jax.model import ModelConfig

  cfg = ModelConfig.tiny(
    vocab_size=10, hidden_size=4, intermediate_size=8, num_layers=1, num_heads=1,
    num_kv_heads=1, head_dim=4,
  )  # fmt: skip
  layer = 4 * 4 + 2 * 4 * 4 + 4 * 4 + 3 * 4 * 8  # q, k, v, o, gate / up / down = 160
  unembed = 2 * 4 * 10 * 4 * 2  # 4 rows x 2 completion tokens
  plain = 2 * layer * 4 * 5 + 2 * (2 * 4 * 5 * 5 * 4) + unembed
  shared = 2 * layer * (2 * 3 + 4 * 2) + 2 * (2 * (2 * 3 * 3 + 4 * 2 * 5) * 4) + unembed
  assert update_flops(cfg, rows=4, seq_len=5, completion_len=2) == 3 * plain
  assert update_flops(cfg, rows=4, seq_len=5, completion_len=2, prompt_group=2) == 3 * shared


def test_both_workers_get_the_same_malloc_environment(monkeypatch):
  monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=1")  # not passed on: one setting
  on = bench_trl.worker_env(SPEC)
  assert on["GLIBC_TUNABLES"] == host_memory.TUNABLE  # the launcher's default, on both sides
  assert bench_trl.worker_env(SPEC, "trl") == on
  assert on[host_memory.SETTING] == "keep"  # our worker's configure_jax reads it
  assert on["PYTHONPATH"].split(os.pathsep)[0] == ROOT
  pages = bench_trl.worker_env(dataclasses.replace(SPEC, malloc="hugepages"))
  assert pages["GLIBC_TUNABLES"] == host_memory.tunables("hugepages")
  off = bench_trl.worker_env(dataclasses.replace(SPEC, malloc="none"))
  assert "GLIBC_TUNABLES" not in off and off[host_memory.SETTING] == "0"


def test_trl_can_run_as_launched_by_its_users():
  spec = dataclasses.replace(SPEC, trl_malloc="none")
  assert bench_trl.worker_env(spec)["GLIBC_TUNABLES"] == host_memory.TUNABLE
  trl = bench_trl.worker_env(spec, "trl")
  assert "GLIBC_TUNABLES" not in trl and trl[host_memory.SETTING] == "0"
