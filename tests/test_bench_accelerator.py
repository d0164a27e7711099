"""tools/bench_accelerator.py: the FLOP count against a hand count, shapes and lengths, TRL's
per-row log-softmax, and tiny end-to-end runs on CPU (both sides' numbers, ratio = ours / torch;
the rollout and RL-step parts in the slow suite)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import bench_accelerator as ba  # noqa: E402

from rlvr_jax.model import ModelConfig, count_params  # noqa: E402

TINY = ModelConfig.from_hf_dict(ba.MODELS["tiny"])


def test_update_flops_hand_count():
  # tiny: V=512, D=64, F=128, L=2, N=4, K=2, H=16. Per layer D*N*H + 2*D*K*H + N*H*D + 3*D*F =
  # 4096 + 4096 + 4096 + 24576 = 36864, so P_ne = 73728. Rows of S = 64 and 40 tokens, T = 56, 32:
  #   6 * 73728 * 104           = 46006272  (layers)
  #   6 * 64 * 512 * 88         = 17301504  (LM head on completion tokens)
  #   6 * 2 * 4 * 16 * 5696     =  4374528  (causal attention, 64^2 + 40^2 = 5696)
  f = ba.update_flops(TINY, [64, 40], [56, 32])
  assert f["non_embedding_params"] == 73728
  assert f["model_flops"] == 46006272 + 17301504 + 4374528 == 67682304
  assert f["hardware_flops"] == 67682304 + (46006272 + 4374528) // 3 == 84475904


@pytest.mark.parametrize("name", sorted(ba.MODELS))
def test_non_embedding_params_match_the_model(name):
  """P_ne = every parameter of ``model.param_specs`` but the embedding, q/k/v biases and norms."""
  c = ModelConfig.from_hf_dict(ba.MODELS[name])
  embed = c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
  rest = c.num_layers * (c.num_heads * c.head_dim + 2 * c.num_kv_heads * c.head_dim)
  rest += (2 * c.num_layers + 1) * c.hidden_size
  assert ba.update_flops(c, [1], [1])["non_embedding_params"] == count_params(c) - embed - rest


def test_qwen_1_5b_config():
  c = ModelConfig.from_hf_dict(ba.MODELS["Qwen/Qwen2.5-1.5B"])
  assert (c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads, c.num_kv_heads) == (
    1536, 8960, 28, 12, 2,
  )  # fmt: skip
  assert (c.head_dim, c.vocab_size, c.tie_word_embeddings, c.attention_bias) == (
    128, 151936, True, True,
  )  # fmt: skip
  assert (c.rope_theta, c.rms_norm_eps, c.max_position_embeddings) == (1e6, 1e-6, 32768)
  # The model card's "Non-Embedding: 1.31B".
  assert ba.update_flops(c, [1], [1])["non_embedding_params"] == 1_310_195_712


def test_decode_roofline_hand_count():
  # tiny: P_ne = 73728, D V = 64 * 512 = 32768; K = 2, H = 16, L = 2, N = 4. Rows of 3 and 1
  # completion tokens after a 4-token prompt, 2 decode steps: the 3-token row decodes t = 1, 2
  # over 5 and 6 live entries (sum 11), the other decodes nothing.
  #   bytes = 2 steps x 106496 x 2 B + 11 x (2 L x 2 x K x H x 2 B = 256) = 425984 + 2816
  #   FLOPs = 2 x 106496 x 2 tokens + 4 L N H x 11 = 425984 + 5632
  r = ba.decode_roofline(TINY, prompt=4, lengths=[3, 1], steps=2, bandwidth=1e9, peak=1e12)
  assert (r["bytes"], r["flops"], r["bound"]) == (428800, 431616, "memory")
  assert r["roofline_s"] == pytest.approx(428800 / 1e9)


def test_parse_shapes():
  shapes = ba.parse_shapes(ba.DEFAULT_SHAPES, 16384)
  assert [(s.name, s.microbatches) for s in shapes] == [
    ("64x1024", (4, 4)), ("8x4096", (2, 2)), ("2x16384", (2, 2)), ("1x32768", (1, 1)),
  ]  # fmt: skip
  assert [s.microbatches for s in ba.parse_shapes("4x64:2, 4x64:2/4", 16384)] == [(2, 2), (2, 4)]
  with pytest.raises(ValueError, match="divide"):
    ba.parse_shapes("3x64:2", 16384)


def test_row_lengths():
  sp, comp = ba.row_lengths(ba.Shape(64, 1024, (1, 1)), "uniform")
  assert sp == 128 and (comp == 896).all()
  sp, comp = ba.row_lengths(ba.Shape(64, 1024, (1, 1)), "longtail")
  assert sp == 128 and comp.max() == 896 and comp.min() >= 1 and comp.mean() < 896 / 2


def test_selective_log_softmax_is_log_softmax_gather():
  torch = pytest.importorskip("torch")
  logits = torch.randn(2, 5, 11, generator=torch.Generator().manual_seed(0))
  index = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(1))
  expected = logits.log_softmax(-1).gather(-1, index[..., None])[..., 0]
  torch.testing.assert_close(ba.selective_log_softmax(logits, index), expected)


class _ScriptedWorker:
  """Stands in for ``ba.Worker``: each start of a side replays the next script of that side."""

  scripts: dict = {}
  started: list = []

  def __init__(self, kind, spec, folder, deadline):
    self.kind = kind
    self.replies = list(self.scripts[kind].pop(0))
    self.started.append(kind)

  def read(self):
    return self.replies.pop(0)

  def ask(self, command):
    assert command in ("step", "finish")
    return self.read()

  def close(self):
    pass


def _measure(monkeypatch, scripts):
  monkeypatch.setattr(ba, "Worker", _ScriptedWorker)
  _ScriptedWorker.scripts, _ScriptedWorker.started = scripts, []
  base = dict(rounds=2)
  return ba.measure_shape(ba.Shape(4, 64, (1, 1)), base, "", ba.Clock(100, 10))


OK, FINISH = {"status": "ok"}, {"status": "ok", "peak_memory_bytes": 1, "matmul_peak_flops": 1.0}
OOM = {"status": "oom", "error": "RESOURCE_EXHAUSTED"}


def step(seconds):
  return {"status": "ok", "seconds": seconds}


def test_out_of_memory_next_to_the_other_side_is_measured_again_alone(monkeypatch):
  out = _measure(monkeypatch, {
    "ours": [[OK, step(1.0), step(3.0), FINISH]],
    "torch": [[OOM], [OK, step(2.0), step(4.0), FINISH]],  # OOM next to ours, fits alone
  })  # fmt: skip
  assert _ScriptedWorker.started == ["ours", "torch", "torch"]
  assert out["ours"]["seconds"] == [1.0, 3.0] and not out["ours"].get("alone")
  assert out["torch"]["seconds"] == [2.0, 4.0] and out["torch"]["alone"] is True
  assert out["torch"]["status"] == "ok" and out["torch"]["peak_memory_bytes"] == 1


def test_out_of_memory_alone_is_reported_as_oom(monkeypatch):
  out = _measure(monkeypatch, {
    # the second round runs out of memory next to torch, and is redone alone
    "ours": [[OK, step(1.0), OOM], [OK, step(1.5), step(1.6), FINISH]],
    "torch": [[OK, step(2.0), step(2.5), FINISH]],
  })  # fmt: skip
  assert out["ours"]["seconds"] == [1.5, 1.6] and out["ours"]["alone"] is True
  out = _measure(monkeypatch, {"ours": [[OOM]], "torch": [[OK, step(2.0), step(2.5), FINISH]]})
  assert _ScriptedWorker.started == ["ours", "torch"]  # alone already: no second try
  assert out["ours"]["status"] == "oom" and out["torch"]["seconds"] == [2.0, 2.5]


def _run_tool(tmp_path, *args) -> dict:
  out = tmp_path / "bench.json"
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)  # the tests' 8 simulated devices: a user's run has one
  cmd = [sys.executable, os.path.join(ROOT, "tools", "bench_accelerator.py"), "--tiny"]
  cmd += [*args, "--json-out", str(out), "--out-dir", str(tmp_path / "logs")]
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(out) as f:
    return json.load(f) | {"stdout": proc.stdout}


def test_tiny_update_on_cpu(tmp_path):
  r = _run_tool(
    tmp_path, "--packing", "rows", "--rounds", "1", "--parts", "update", "--shapes", "4x64:2"
  )
  assert r["settings"]["packing"] == "rows" and r["settings"]["model"] == "tiny"
  assert r["rollout"] is None and r["rl_step"] is None
  assert "git_commit" in r and r["machine"]["ours_platform"] == "cpu"
  assert {"jax_version", "torch_version", "torch_device"} <= set(r["machine"])
  (row,) = r["shapes"]
  assert (row["shape"], row["microbatches"], row["tokens"]) == ("4x64", [2, 2], 4 * 64)
  sp, comp = ba.row_lengths(ba.Shape(4, 64, (2, 2)), "uniform")
  assert row["model_flops"] == ba.update_flops(TINY, sp + comp, comp)["model_flops"]
  for side in ("ours", "torch"):
    s = row[side]
    assert s["status"] == "ok" and s["microbatches"] == 2 and len(s["seconds"]) == 1
    assert s["median_s"] > 0 and s["matmul_peak_flops"] > 0
    assert s["model_tflops"] == pytest.approx(row["model_flops"] / s["median_s"] / 1e12)
    assert s["peak_fraction"] == pytest.approx(s["model_tflops"] * 1e12 / s["matmul_peak_flops"])
  assert row["ratio"] == pytest.approx(row["ours"]["median_s"] / row["torch"]["median_s"])
  assert "| 4x64 (2/2) |" in r["stdout"]


@pytest.mark.slow
def test_tiny_rollout_and_rl_step_on_cpu(tmp_path):
  r = _run_tool(tmp_path, "--rounds", "1", "--parts", "rollout,continuous,rl_step")
  ro, rl, co = r["rollout"], r["rl_step"], r["continuous"]
  # 32 rows through 16 slots: the same tokens; fewer decode steps than two static calls.
  assert co["status"] == "ok" and co["rows"] == 32
  assert co["same_tokens"] == {"continuous": True, "continuous_pallas": True}
  assert co["continuous"]["steps"] < co["static"]["steps"]
  assert co["continuous"]["useful_fraction"] > co["static"]["useful_fraction"]
  for side in ("static", "continuous", "continuous_pallas"):
    assert co[side]["tokens_per_s"] == pytest.approx(co["tokens"] / co[side]["median_s"])
    assert 0 < co[side]["roofline_fraction"] and co[side]["bound"] in ("memory", "compute")
  assert "continuous batching, 32 rows through 16 slots" in r["stdout"]
  assert ro["status"] == "ok" and ro["generated_per_call"] == 8 * 16  # no stop token
  assert ro["tokens_per_s"] == pytest.approx(8 * 16 / ro["median_s"])
  assert rl["status"] == "ok" and len(rl["steps"]) == 1
  assert set(rl["median"]) >= {"time/sample", "time/reward", "time/update", "time/step"}
  assert r["shapes"] == [] and "RL step (tiny" in r["stdout"]
  assert np.isfinite(list(rl["median"].values())).all()
