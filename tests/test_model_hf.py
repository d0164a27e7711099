"""Parity with transformers (PyTorch, CPU, float32) on tiny random Qwen2 / Qwen3 / Llama checkpoints;
safetensors loading (single and sharded index), export round trip, and bad-checkpoint errors."""

import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.model import (
  CheckpointError,
  ModelConfig,
  UnsupportedModelError,
  export_hf,
  forward,
  hidden_states_per_layer,
  load_hf,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

COMMON = dict(
  vocab_size=96,
  hidden_size=32,
  intermediate_size=48,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
  max_position_embeddings=128,
  rms_norm_eps=1e-6,
)
FAMILIES = {
  "qwen2": lambda: transformers.Qwen2Config(**COMMON, rope_theta=1e4, tie_word_embeddings=True),
  "qwen3": lambda: transformers.Qwen3Config(**COMMON, head_dim=16, rope_theta=1e6),
  "llama": lambda: transformers.LlamaConfig(
    **COMMON,
    rope_parameters=dict(
      rope_type="llama3",
      rope_theta=5e5,
      factor=8.0,
      low_freq_factor=1.0,
      high_freq_factor=4.0,
      original_max_position_embeddings=16,
    ),
  ),
}


def _randomise(model, seed):
  """Replaces HF's tiny init (std 0.02) by O(1) weights, so that parity is a real test."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      p.copy_(1 + 0.1 * noise if "norm" in name else (0.3 if "bias" in name else 0.15) * noise)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  out = {}
  for i, (family, make_config) in enumerate(sorted(FAMILIES.items())):
    torch.manual_seed(i)
    model = transformers.AutoModelForCausalLM.from_config(make_config()).float().eval()
    _randomise(model, i)
    folder = tmp_path_factory.mktemp(family)
    model.save_pretrained(folder)
    out[family] = (model, str(folder))
  return out


def _batch(vocab, seed=0):
  """A left-padded batch: row 0 has 3 pads, row 1 none, row 2 one pad."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab, size=(3, 9)).astype(np.int32)
  mask = np.ones((3, 9), bool)
  mask[0, :3] = False
  mask[2, :1] = False
  positions = np.where(mask, np.cumsum(mask, -1) - 1, -1).astype(np.int32)
  return tokens, mask, positions


def _hf_forward(model, tokens, mask, positions):
  with torch.no_grad():
    out = model(
      input_ids=torch.tensor(tokens, dtype=torch.long),
      attention_mask=torch.tensor(mask, dtype=torch.long),
      position_ids=torch.tensor(np.maximum(positions, 0), dtype=torch.long),
      output_hidden_states=True,
    )
  return out.logits.numpy(), [h.numpy() for h in out.hidden_states]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_and_hidden_states_match_transformers(checkpoints, family):
  model, folder = checkpoints[family]
  params, config = load_hf(folder)
  assert config.family == family
  assert config.qk_norm == (family == "qwen3") and config.attention_bias == (family == "qwen2")
  assert (config.rope_scaling is not None) == (family == "llama")
  tokens, mask, positions = _batch(config.vocab_size)
  hf_logits, hf_hidden = _hf_forward(model, tokens, mask, positions)
  logits, _ = forward(
    params, jnp.asarray(tokens), jnp.asarray(positions), config=config, return_logits=True
  )
  logits = np.asarray(logits)
  assert np.abs(hf_logits[mask]).max() > 1.0  # O(1) logits: the comparison is not trivial
  assert np.abs(logits - hf_logits)[mask].max() <= 1e-4
  layer_inputs, final = hidden_states_per_layer(
    params, jnp.asarray(tokens), jnp.asarray(positions), config=config
  )
  assert len(hf_hidden) == config.num_layers + 1
  for i in range(config.num_layers):
    np.testing.assert_allclose(
      np.asarray(layer_inputs[i])[mask], hf_hidden[i][mask], atol=1e-4, err_msg=f"layer {i} input"
    )
  np.testing.assert_allclose(np.asarray(final)[mask], hf_hidden[-1][mask], atol=1e-4)


def test_sharded_index_checkpoint_loads_same(checkpoints, tmp_path):
  model, folder = checkpoints["qwen3"]
  model.save_pretrained(tmp_path, max_shard_size="20KB")
  assert os.path.exists(tmp_path / "model.safetensors.index.json")
  assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
  a, _ = load_hf(folder)
  b, _ = load_hf(tmp_path)
  for x, y in zip(np.asarray(a["layers"]["wq"]), np.asarray(b["layers"]["wq"]), strict=True):
    np.testing.assert_array_equal(x, y)
  np.testing.assert_array_equal(np.asarray(a["embed"]), np.asarray(b["embed"]))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_export_round_trip(checkpoints, family, tmp_path):
  _, folder = checkpoints[family]
  params, config = load_hf(folder)
  export_hf(params, config, tmp_path / "out", max_shard_bytes=30_000)
  assert os.path.exists(tmp_path / "out" / "model.safetensors.index.json")
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").float().eval()
  tokens, mask, positions = _batch(config.vocab_size, seed=1)
  hf_logits, _ = _hf_forward(reloaded, tokens, mask, positions)
  ours, _ = forward(
    params, jnp.asarray(tokens), jnp.asarray(positions), config=config, return_logits=True
  )
  assert np.abs(np.asarray(ours) - hf_logits)[mask].max() <= 1e-4
  again, config2 = load_hf(tmp_path / "out")
  assert config2 == config
  if family == "qwen2":  # bfloat16 on disk, read back as float32 and as bfloat16
    export_hf(params, config, tmp_path / "bf16", dtype="bfloat16")
    as_f32, _ = load_hf(tmp_path / "bf16")
    as_b16, c16 = load_hf(tmp_path / "bf16", dtype="bfloat16")
    want = np.asarray(params["layers"]["w_up"]).astype(jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(as_f32["layers"]["w_up"]), want.astype(np.float32))
    assert as_b16["layers"]["w_up"].dtype == jnp.bfloat16 and c16.dtype == "bfloat16"
  np.testing.assert_array_equal(
    np.asarray(again["layers"]["wo"]), np.asarray(params["layers"]["wo"])
  )


def _copy(folder, tmp_path):
  dst = tmp_path / "ckpt"
  shutil.copytree(folder, dst)
  return dst


def test_bad_checkpoints_raise_clear_errors(checkpoints, tmp_path):
  from safetensors.numpy import load_file, save_file

  _, folder = checkpoints["qwen2"]
  ckpt = _copy(folder, tmp_path)
  file = ckpt / "model.safetensors"
  tensors = load_file(file)

  # missing tensor
  save_file({k: v for k, v in tensors.items() if k != "model.layers.1.self_attn.k_proj.bias"}, file)
  with pytest.raises(
    CheckpointError,
    match=r"missing tensor 'model.layers.1.self_attn.k_proj.bias'.*expected shape \(16,\)",
  ):
    load_hf(ckpt)
  # wrong shape
  bad = dict(tensors)
  bad["model.layers.0.mlp.up_proj.weight"] = np.zeros((48, 31), np.float32)
  save_file(bad, file)
  with pytest.raises(
    CheckpointError, match=r"up_proj.weight.*shape \(48, 31\), expected \(48, 32\)"
  ):
    load_hf(ckpt)
  # corrupt file
  file.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
  with pytest.raises(CheckpointError, match=r"model.safetensors.*corrupt"):
    load_hf(ckpt)
  # corrupt config.json
  save_file(tensors, file)
  (ckpt / "config.json").write_text("{oops")
  with pytest.raises(ValueError, match="config.json is not valid JSON"):
    load_hf(ckpt)
  # unsupported architecture
  with open(os.path.join(folder, "config.json")) as f:
    cfg = json.load(f)
  cfg.update(architectures=["MixtralForCausalLM"], model_type="mixtral")
  (ckpt / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(UnsupportedModelError, match="MixtralForCausalLM"):
    load_hf(ckpt)
  # index pointing at a missing file
  shutil.rmtree(ckpt)
  os.makedirs(ckpt)
  (ckpt / "model.safetensors.index.json").write_text(
    json.dumps({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}})
  )
  with pytest.raises(CheckpointError, match="model-00001-of-00002.safetensors.*does not exist"):
    load_hf(ckpt, config=ModelConfig.from_pretrained(folder))
