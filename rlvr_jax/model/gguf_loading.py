"""GGUF files (llama.cpp) -> params pytree, through the ``gguf`` package.

Quantised tensors (Q4_1, Q8_0, ...) are dequantised to float32 by ``gguf.quants.dequantize`` and then
cast to the config dtype. llama.cpp's converter permutes the rows of the Llama Q and K projections
(interleaved RoPE pairs, per head); we undo it to get the Hugging Face "rotate_half" layout. Qwen2/3
GGUF files are written without that permutation.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from rlvr_jax.model.config import ModelConfig, UnsupportedModelError
from rlvr_jax.model.loading import CheckpointError, build_params

_GGUF_ARCHS = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}

# GGUF tensor name (after "blk.{i}.") -> HF name suffix (after "model.layers.{i}.")
_LAYER_NAMES = {
  "attn_norm.weight": "input_layernorm.weight",
  "attn_q.weight": "self_attn.q_proj.weight",
  "attn_k.weight": "self_attn.k_proj.weight",
  "attn_v.weight": "self_attn.v_proj.weight",
  "attn_q.bias": "self_attn.q_proj.bias",
  "attn_k.bias": "self_attn.k_proj.bias",
  "attn_v.bias": "self_attn.v_proj.bias",
  "attn_q_norm.weight": "self_attn.q_norm.weight",
  "attn_k_norm.weight": "self_attn.k_norm.weight",
  "attn_output.weight": "self_attn.o_proj.weight",
  "ffn_norm.weight": "post_attention_layernorm.weight",
  "ffn_gate.weight": "mlp.gate_proj.weight",
  "ffn_up.weight": "mlp.up_proj.weight",
  "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {
  "token_embd.weight": "model.embed_tokens.weight",
  "output_norm.weight": "model.norm.weight",
  "output.weight": "lm_head.weight",
}


def hf_name(gguf_name: str) -> str | None:
  """The HF tensor name of a GGUF tensor name (None for tensors we do not use)."""
  if gguf_name in _TOP_NAMES:
    return _TOP_NAMES[gguf_name]
  if gguf_name.startswith("blk."):
    _, layer, rest = gguf_name.split(".", 2)
    if rest in _LAYER_NAMES:
      return f"model.layers.{layer}.{_LAYER_NAMES[rest]}"
  return None


def unpermute_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
  """Inverts llama.cpp's Q/K row permutation: per head, rows (2, H/2) -> (H/2, 2) order.

  llama.cpp stores head rows as [r0, r_{H/2}, r1, r_{H/2+1}, ...] (interleaved RoPE pairs); HF's
  rotate_half layout is [r0, r1, ..., r_{H/2-1}, r_{H/2}, ...].
  """
  rows = w.shape[0]
  half = rows // num_heads // 2
  return w.reshape(num_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _open(path: str):
  import gguf

  if not os.path.exists(path):
    raise FileNotFoundError(f"no GGUF file at {path}")
  try:
    return gguf.GGUFReader(path)
  except Exception as e:
    raise CheckpointError(f"cannot read GGUF file {path} (corrupt or not GGUF?): {e}") from e


def _field(reader, key: str, default: Any = None) -> Any:
  field = reader.fields.get(key)
  if field is None:
    return default
  return field.contents()


def _f32_to_float(x) -> float:
  """GGUF stores float32: 1e-5 comes back as 9.99999974e-06. Take the shortest decimal that
  rounds to the same float32 (1e-05), i.e. the value the HF config.json had."""
  return float(str(np.float32(x)))


def config_from_gguf(reader, path: str = "gguf") -> ModelConfig:
  """Reads the model hyperparameters from GGUF metadata."""
  arch = _field(reader, "general.architecture")
  if arch not in _GGUF_ARCHS:
    raise UnsupportedModelError(
      f"{path}: unsupported GGUF architecture {arch!r}; expected one of {sorted(_GGUF_ARCHS)}"
    )
  names = {t.name for t in reader.tensors}
  if "rope_freqs.weight" in names:
    raise UnsupportedModelError(f"{path}: GGUF rope_freqs (Llama-3 RoPE scaling) is not supported")

  def req(key):
    value = _field(reader, f"{arch}.{key}")
    if value is None:
      raise CheckpointError(f"{path}: GGUF metadata lacks {arch}.{key}")
    return value

  hidden, heads = int(req("embedding_length")), int(req("attention.head_count"))
  tokens = _field(reader, "tokenizer.ggml.tokens")
  embed = next(t for t in reader.tensors if t.name == "token_embd.weight")
  vocab = _field(reader, f"{arch}.vocab_size") or int(embed.shape[-1]) or len(tokens)
  eos = _field(reader, "tokenizer.ggml.eos_token_id")
  return ModelConfig(
    vocab_size=int(vocab),
    hidden_size=hidden,
    intermediate_size=int(req("feed_forward_length")),
    num_layers=int(req("block_count")),
    num_heads=heads,
    num_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
    head_dim=int(_field(reader, f"{arch}.attention.key_length", hidden // heads)),
    rope_theta=_f32_to_float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
    rms_norm_eps=_f32_to_float(req("attention.layer_norm_rms_epsilon")),
    tie_word_embeddings="output.weight" not in names,
    attention_bias=arch == "qwen2",
    qk_norm=arch == "qwen3",
    max_position_embeddings=int(_field(reader, f"{arch}.context_length", 4096)),
    bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
    eos_token_ids=() if eos is None else (int(eos),),
    pad_token_id=_field(reader, "tokenizer.ggml.padding_token_id"),
    family=_GGUF_ARCHS[arch],
  )


def load_gguf(
  path: str | os.PathLike,
  *,
  dtype: str = "float32",
  shardings: Any = None,
  mesh=None,
  rules=None,
) -> tuple[dict[str, Any], ModelConfig]:
  """Loads a llama.cpp GGUF file (llama / qwen2 / qwen3) into (params, config).

  Args:
    path: the ``.gguf`` file.
    dtype: "float32" or "bfloat16" target dtype (tensors are dequantised to float32 first).
    shardings / mesh / rules: as in ``loading.load_hf``.
  """
  import gguf

  path = os.fspath(path)
  reader = _open(path)
  config = config_from_gguf(reader, path).replace(dtype=dtype)
  if shardings is None and mesh is not None:
    from rlvr_jax.model.params import param_shardings

    shardings = param_shardings(config, mesh, rules)
  by_hf = {}
  for t in reader.tensors:
    name = hf_name(t.name)
    if name is not None:
      by_hf[name] = t
  permute = config.family == "llama"

  def get_tensor(name: str) -> np.ndarray:
    t = by_hf[name]  # KeyError -> "missing tensor" in build_params
    try:
      w = gguf.quants.dequantize(t.data, t.tensor_type)
    except Exception as e:
      raise CheckpointError(f"{path}: cannot dequantise tensor {t.name!r}: {e}") from e
    w = np.asarray(w, np.float32).reshape(tuple(int(d) for d in reversed(t.shape)))
    if permute and name.endswith("q_proj.weight"):
      w = unpermute_rows(w, config.num_heads)
    elif permute and name.endswith("k_proj.weight"):
      w = unpermute_rows(w, config.num_kv_heads)
    return w

  params = build_params(get_tensor, config, shardings=shardings, source=path)
  return params, config
