"""GGUF loading: a tiny llama.cpp-layout file written with ``gguf`` (permuted Q/K rows, one Q8_0
tensor) loads back into exactly the params it was written from; bad files raise clear errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.model import (
  CheckpointError,
  ModelConfig,
  UnsupportedModelError,
  forward,
  init_params,
  load_gguf,
)
from rlvr_jax.model.gguf_loading import unpermute_rows
from rlvr_jax.model.loading import hf_layout, to_hf

gguf = pytest.importorskip("gguf")

CONFIG = ModelConfig.tiny(
  vocab_size=64,
  hidden_size=64,
  intermediate_size=64,
  num_heads=4,
  num_kv_heads=2,
  head_dim=16,
  rope_theta=5e4,
  rms_norm_eps=1e-5,
  tie_word_embeddings=True,
  max_position_embeddings=256,
)
QWEN3 = CONFIG.replace(qk_norm=True, family="qwen3", head_dim=8, tie_word_embeddings=False)
GGUF_NAMES = {
  "self_attn.q_norm.weight": "attn_q_norm.weight",
  "self_attn.k_norm.weight": "attn_k_norm.weight",
  "input_layernorm.weight": "attn_norm.weight",
  "self_attn.q_proj.weight": "attn_q.weight",
  "self_attn.k_proj.weight": "attn_k.weight",
  "self_attn.v_proj.weight": "attn_v.weight",
  "self_attn.o_proj.weight": "attn_output.weight",
  "post_attention_layernorm.weight": "ffn_norm.weight",
  "mlp.gate_proj.weight": "ffn_gate.weight",
  "mlp.up_proj.weight": "ffn_up.weight",
  "mlp.down_proj.weight": "ffn_down.weight",
}


def _llama_cpp_permute(w, n_head):
  """llama.cpp convert_hf_to_gguf's Q/K permutation, written independently: per head, the rows
  [first half, second half] become interleaved pairs."""
  out = np.empty_like(w)
  rows_per_head = w.shape[0] // n_head
  half = rows_per_head // 2
  for h in range(n_head):
    block = w[h * rows_per_head : (h + 1) * rows_per_head]
    out[h * rows_per_head : (h + 1) * rows_per_head : 2] = block[:half]
    out[h * rows_per_head + 1 : (h + 1) * rows_per_head : 2] = block[half:]
  return out


def _hf_tensors(params, config):
  tensors = {}
  for keys, names, kind, _ in hf_layout(config):
    value = np.asarray(params[keys[0]] if len(keys) == 1 else params[keys[0]][keys[1]])
    if isinstance(names, list):
      for i, n in enumerate(names):
        tensors[n] = to_hf(kind, value[i])
    else:
      tensors[names] = to_hf(kind, value)
  return tensors


def _write_gguf(path, params, config, arch="llama"):
  c = config
  w = gguf.GGUFWriter(str(path), arch=arch)
  w.add_block_count(c.num_layers)
  w.add_context_length(c.max_position_embeddings)
  w.add_embedding_length(c.hidden_size)
  w.add_feed_forward_length(c.intermediate_size)
  w.add_head_count(c.num_heads)
  w.add_head_count_kv(c.num_kv_heads)
  w.add_rope_freq_base(c.rope_theta)
  w.add_layer_norm_rms_eps(c.rms_norm_eps)
  w.add_eos_token_id(2)
  if arch == "qwen3":
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
  for name, x in _hf_tensors(params, c).items():
    x = np.ascontiguousarray(x, np.float32)
    if name == "model.embed_tokens.weight":  # quantised, as in the real SmolLM2 file
      q = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)
      w.add_tensor(
        "token_embd.weight", q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0
      )
      continue
    if name in ("model.norm.weight", "lm_head.weight"):
      w.add_tensor({"model.norm.weight": "output_norm.weight"}.get(name, "output.weight"), x)
      continue
    _, _, layer, suffix = name.split(".", 3)
    if arch != "llama":  # llama.cpp permutes Q/K rows of Llama models only
      pass
    elif suffix == "self_attn.q_proj.weight":
      x = _llama_cpp_permute(x, c.num_heads)
    elif suffix == "self_attn.k_proj.weight":
      x = _llama_cpp_permute(x, c.num_kv_heads)
    w.add_tensor(f"blk.{layer}.{GGUF_NAMES[suffix]}", x)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def test_unpermute_inverts_llama_cpp_permutation():
  w = np.arange(4 * 8 * 3, dtype=np.float32).reshape(32, 3)
  np.testing.assert_array_equal(unpermute_rows(_llama_cpp_permute(w, 4), 4), w)
  # first head: stored rows [r0, r4, r1, r5, ...] -> [r0, r1, r2, ...]
  assert unpermute_rows(w, 4)[:8, 0].tolist() == [0, 6, 12, 18, 3, 9, 15, 21]


def test_gguf_round_trip(tmp_path):
  params = init_params(CONFIG, jax.random.key(0))
  params = jax.tree.map(lambda x: x * 5.0, params)  # O(1) weights
  path = tmp_path / "tiny.gguf"
  _write_gguf(path, params, CONFIG)
  loaded, config = load_gguf(path)
  assert config == CONFIG.replace(pad_token_id=None, bos_token_id=None)
  for name in ("wq", "wk", "wv", "wo", "w_down", "attn_norm"):
    np.testing.assert_array_equal(
      np.asarray(loaded["layers"][name]), np.asarray(params["layers"][name])
    )
  emb_err = np.abs(np.asarray(loaded["embed"]) - np.asarray(params["embed"]))
  assert 0 < emb_err.max() < 0.01 * np.abs(np.asarray(params["embed"])).max()  # Q8_0 rounding
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 7)), jnp.int32)
  pos = jnp.broadcast_to(jnp.arange(7), (2, 7))
  ref, _ = forward(
    {**params, "embed": loaded["embed"]}, tokens, pos, config=CONFIG, return_logits=True
  )
  out, _ = forward(loaded, tokens, pos, config=config, return_logits=True)
  np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-5)
  b16, c16 = load_gguf(path, dtype="bfloat16")
  assert c16.dtype == "bfloat16" and b16["layers"]["wq"].dtype == jnp.bfloat16


def test_gguf_qwen3_round_trip(tmp_path):
  """Qwen3 GGUF: unpermuted Q/K, q/k norms, head_dim from key_length, untied output."""
  params = jax.tree.map(lambda x: x * 5.0, init_params(QWEN3, jax.random.key(1)))
  path = tmp_path / "qwen3.gguf"
  _write_gguf(path, params, QWEN3, arch="qwen3")
  loaded, config = load_gguf(path)
  assert config == QWEN3.replace(pad_token_id=None, bos_token_id=None)
  for name, value in params["layers"].items():
    np.testing.assert_array_equal(np.asarray(loaded["layers"][name]), np.asarray(value), name)
  np.testing.assert_array_equal(np.asarray(loaded["lm_head"]), np.asarray(params["lm_head"]))


def test_gguf_bad_files(tmp_path):
  bad = tmp_path / "bad.gguf"
  bad.write_bytes(b"NOTGGUF" + b"\x00" * 64)
  with pytest.raises(CheckpointError, match="bad.gguf.*corrupt or not GGUF"):
    load_gguf(bad)
  with pytest.raises(FileNotFoundError, match="no GGUF file"):
    load_gguf(tmp_path / "missing.gguf")
  params = init_params(CONFIG, jax.random.key(0))
  path = tmp_path / "gpt2.gguf"
  _write_gguf(path, params, CONFIG, arch="gpt2")
  with pytest.raises(UnsupportedModelError, match="unsupported GGUF architecture 'gpt2'"):
    load_gguf(path)
