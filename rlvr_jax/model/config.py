"""Decoder configuration, read from a Hugging Face ``config.json``.

One frozen, hashable dataclass covers the Llama, Qwen2 and Qwen3 families, so it can be passed to
``jax.jit`` as a static argument. The families differ only in three switches:

  * Llama:  no QKV bias, no q/k norm, optional Llama-3 RoPE frequency scaling.
  * Qwen2:  ``attention_bias=True`` (bias on the q, k and v projections only).
  * Qwen3:  ``qk_norm=True`` (RMSNorm over the head dim of q and k, before RoPE), no QKV bias.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

# Hugging Face ``architectures`` / ``model_type`` names we accept, mapped to our family name.
SUPPORTED_ARCHITECTURES = {
  "LlamaForCausalLM": "llama",
  "MistralForCausalLM": "llama",
  "Qwen2ForCausalLM": "qwen2",
  "Qwen3ForCausalLM": "qwen3",
}
SUPPORTED_MODEL_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}

# ``ModelConfig.attention``: how the no-cache forward (training, scoring, prefill) computes its
# causal self-attention (``rlvr_jax.model.attention``). "auto" picks per platform.
ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "blockwise", "cudnn", "pallas_gpu", "splash", "ring")
# ``ModelConfig.decode_attention``: the decode attention of the continuous sampler's slots
# (``rlvr_jax.model.attention.slot_decode_attention``): "xla" the einsum over the whole buffers,
# "pallas_gpu" Pallas' Triton decode kernel over each row's filled range; "auto" = "xla" (the
# kernel is chosen by measurement: ``tools/bench_accelerator.py --parts continuous``).
DECODE_ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "pallas_gpu")

# The config.json fields of a few public checkpoints, for benchmarks and memory analyses with
# random weights at the real shapes (no download): ``ModelConfig.from_hf_dict(HF_CONFIGS[name])``.
_QWEN2 = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", rms_norm_eps=1e-6,
              rope_theta=1000000.0, max_position_embeddings=32768, vocab_size=151936,
              bos_token_id=151643, eos_token_id=151643)  # fmt: skip
HF_CONFIGS = {
  "Qwen/Qwen2.5-1.5B": dict(
    _QWEN2,
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    tie_word_embeddings=True,
  ),  # fmt: skip
  "Qwen/Qwen2.5-0.5B": dict(
    _QWEN2,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    tie_word_embeddings=True,
  ),  # fmt: skip
  "Qwen/Qwen2.5-7B": dict(
    _QWEN2,
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    tie_word_embeddings=False,
    max_position_embeddings=131072,
    vocab_size=152064,
  ),  # fmt: skip
}


class UnsupportedModelError(ValueError):
  """The checkpoint's architecture or an option of it is not implemented here."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyperparameters of a decoder-only transformer (dimension letters of ``rlvr_jax.types``).

  Attributes:
    vocab_size: V.
    hidden_size: D.
    intermediate_size: F, the SwiGLU hidden size.
    num_layers: L.
    num_heads: N query heads.
    num_kv_heads: K key/value heads (grouped-query attention, N % K == 0).
    head_dim: H.
    rope_theta: RoPE base.
    rope_scaling: None, or a sorted tuple of (key, value) items of a Llama-3 ``rope_scaling`` dict
      (``factor``, ``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``).
    rms_norm_eps: epsilon of every RMSNorm.
    tie_word_embeddings: the unembedding is the transposed token embedding.
    attention_bias: bias on the q/k/v projections (Qwen2).
    qk_norm: RMSNorm of q and k over the head dim (Qwen3).
    max_position_embeddings: longest position the model was trained for.
    bos_token_id / eos_token_ids / pad_token_id: special ids (eos is a tuple: models have several).
    dtype: "float32" or "bfloat16": the parameter (storage) dtype. "bfloat16" alone is pure
      bfloat16: weights, activations and the KV cache in bfloat16.
    compute_dtype: "float32" or "bfloat16": the matmul / activation / KV-cache dtype with float32
      parameters. "bfloat16" with dtype "float32" is mixed precision: the forward pass runs on a
      bfloat16 copy of the weights (``model.compute_params``), the float32 ones stay the master
      copy. The dtype actually used is ``activation_dtype`` (see there). Softmax, norms and
      log-prob statistics stay float32 in every mode.
    remat: rematerialise each decoder layer in the backward pass (saves activation memory).
    attention: the self-attention implementation of the no-cache forward, one of
      ``ATTENTION_IMPLEMENTATIONS`` (``rlvr_jax.model.attention.self_attention``): "xla" the
      einsum reference ([B, N, S, S] scores), "blockwise" online softmax in O(S) memory,
      "cudnn" / "pallas_gpu" GPU kernels, "splash" the TPU kernel, "ring" context parallelism
      over the mesh axis "context"; "auto" picks per platform. The decode path (KV cache)
      always uses ``layers.cached_attention``.
    decode_attention: the decode attention of the continuous sampler's slots, one of
      ``DECODE_ATTENTION_IMPLEMENTATIONS``.
    family: "llama", "qwen2" or "qwen3" (used when exporting a config.json).
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 10000.0
  rope_scaling: tuple[tuple[str, Any], ...] | None = None
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = False
  attention_bias: bool = False
  qk_norm: bool = False
  max_position_embeddings: int = 4096
  bos_token_id: int | None = None
  eos_token_ids: tuple[int, ...] = ()
  pad_token_id: int | None = None
  dtype: str = "float32"
  compute_dtype: str = "float32"
  remat: bool = False
  family: str = "llama"
  attention: str = "auto"
  decode_attention: str = "auto"

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
        f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
      )
    if self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
    if self.dtype not in ("float32", "bfloat16"):
      raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
    if self.compute_dtype not in ("float32", "bfloat16"):
      raise ValueError(f"compute_dtype must be 'float32' or 'bfloat16', got {self.compute_dtype!r}")
    if self.attention not in ATTENTION_IMPLEMENTATIONS:
      raise ValueError(
        f"attention must be one of {ATTENTION_IMPLEMENTATIONS}, got {self.attention!r}"
      )
    if self.decode_attention not in DECODE_ATTENTION_IMPLEMENTATIONS:
      raise ValueError(
        f"decode_attention must be one of {DECODE_ATTENTION_IMPLEMENTATIONS}, "
        f"got {self.decode_attention!r}"
      )
    if self.family not in ("llama", "qwen2", "qwen3"):
      raise UnsupportedModelError(f"unknown family {self.family!r}")

  @property
  def activation_dtype(self) -> str:
    """The dtype of matmul inputs, activations and the KV cache: "bfloat16" when either ``dtype``
    or ``compute_dtype`` is bfloat16 (bfloat16 weights are never upcast to compute in float32),
    else "float32"."""
    return "bfloat16" if "bfloat16" in (self.dtype, self.compute_dtype) else "float32"

  @property
  def mixed_precision(self) -> bool:
    """float32 master parameters with a bfloat16 forward (``compute_params`` casts a copy)."""
    return self.dtype == "float32" and self.activation_dtype == "bfloat16"

  @property
  def rope_scaling_dict(self) -> dict[str, Any] | None:
    return None if self.rope_scaling is None else dict(self.rope_scaling)

  def replace(self, **changes) -> ModelConfig:
    return dataclasses.replace(self, **changes)

  @classmethod
  def tiny(cls, **overrides) -> ModelConfig:
    """A tiny Llama-style config for tests (V=256, D=64, F=128, L=2, N=4, K=2, H=16)."""
    base = dict(
      vocab_size=256,
      hidden_size=64,
      intermediate_size=128,
      num_layers=2,
      num_heads=4,
      num_kv_heads=2,
      head_dim=16,
      rope_theta=10000.0,
      rms_norm_eps=1e-6,
      tie_word_embeddings=False,
      max_position_embeddings=512,
      bos_token_id=1,
      eos_token_ids=(2,),
      pad_token_id=0,
    )
    base.update(overrides)
    return cls(**base)

  @classmethod
  def from_hf_dict(cls, d: dict[str, Any], **overrides) -> ModelConfig:
    """Builds a config from a parsed Hugging Face ``config.json`` (transformers 4 or 5 form).

    transformers 4 stores ``rope_theta`` (and ``rope_scaling``) at the top level; transformers 5
    stores ``rope_parameters = {"rope_type": ..., "rope_theta": ..., ...}``. Both are accepted.
    """
    family = _family_of(d)
    n_heads = int(d["num_attention_heads"])
    hidden = int(d["hidden_size"])
    head_dim = d.get("head_dim") or hidden // n_heads
    rope_params = dict(d.get("rope_parameters") or {})
    theta = rope_params.get("rope_theta", d.get("rope_theta", 10000.0))
    scaling = d.get("rope_scaling") or rope_params or None
    rope_scaling = _normalise_rope_scaling(scaling)
    eos = d.get("eos_token_id")
    eos_ids = () if eos is None else tuple(eos) if isinstance(eos, list | tuple) else (int(eos),)
    if family == "qwen3":
      attention_bias = bool(d.get("attention_bias", False))
    elif family == "qwen2":
      attention_bias = True
    else:
      attention_bias = bool(d.get("attention_bias", False))
    if family == "llama" and d.get("mlp_bias"):
      raise UnsupportedModelError("config.json has mlp_bias=True, which is not supported")
    if d.get("sliding_window") and d.get("use_sliding_window"):
      raise UnsupportedModelError(
        "sliding-window attention (use_sliding_window=True) is not supported"
      )
    kwargs = dict(
      vocab_size=int(d["vocab_size"]),
      hidden_size=hidden,
      intermediate_size=int(d["intermediate_size"]),
      num_layers=int(d["num_hidden_layers"]),
      num_heads=n_heads,
      num_kv_heads=int(d.get("num_key_value_heads") or n_heads),
      head_dim=int(head_dim),
      rope_theta=float(theta),
      rope_scaling=rope_scaling,
      rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
      tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
      attention_bias=attention_bias,
      qk_norm=family == "qwen3",
      max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
      bos_token_id=d.get("bos_token_id"),
      eos_token_ids=tuple(int(e) for e in eos_ids),
      pad_token_id=d.get("pad_token_id"),
      family=family,
    )
    kwargs.update(overrides)
    return cls(**kwargs)

  @classmethod
  def from_pretrained(cls, path: str | os.PathLike, **overrides) -> ModelConfig:
    """Reads ``<path>/config.json`` (``path`` may also be the json file itself)."""
    path = os.fspath(path)
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    if not os.path.exists(file):
      raise FileNotFoundError(f"no config.json at {file}")
    try:
      with open(file) as f:
        d = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{file} is not valid JSON: {e}") from e
    return cls.from_hf_dict(d, **overrides)

  def to_hf_dict(self) -> dict[str, Any]:
    """A transformers-5 style ``config.json`` dict for this config (used by export)."""
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
    rope_parameters: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
    if self.rope_scaling is not None:
      rope_parameters.update(self.rope_scaling_dict, rope_type="llama3")
      rope_parameters["original_max_position_embeddings"] = int(
        rope_parameters["original_max_position_embeddings"]
      )
    d: dict[str, Any] = {
      "architectures": [arch[self.family]],
      "model_type": self.family,
      "vocab_size": self.vocab_size,
      "hidden_size": self.hidden_size,
      "intermediate_size": self.intermediate_size,
      "num_hidden_layers": self.num_layers,
      "num_attention_heads": self.num_heads,
      "num_key_value_heads": self.num_kv_heads,
      "head_dim": self.head_dim,
      "hidden_act": "silu",
      "rms_norm_eps": self.rms_norm_eps,
      "rope_theta": self.rope_theta,
      "rope_parameters": rope_parameters,
      "tie_word_embeddings": self.tie_word_embeddings,
      "max_position_embeddings": self.max_position_embeddings,
      "bos_token_id": self.bos_token_id,
      "eos_token_id": list(self.eos_token_ids)
      if len(self.eos_token_ids) != 1
      else self.eos_token_ids[0],
      "pad_token_id": self.pad_token_id,
      "torch_dtype": self.dtype,
      "dtype": self.dtype,
    }
    if self.rope_scaling is not None:  # transformers 4 reads this key, 5 reads rope_parameters
      d["rope_scaling"] = {k: v for k, v in rope_parameters.items() if k != "rope_theta"}
    if self.family == "llama":
      d["attention_bias"] = self.attention_bias
      d["mlp_bias"] = False
    if self.family == "qwen3":
      d["attention_bias"] = self.attention_bias
    if self.family in ("qwen2", "qwen3"):
      d["use_sliding_window"] = False
    return d


def _family_of(d: dict[str, Any]) -> str:
  for arch in d.get("architectures") or ():
    if arch in SUPPORTED_ARCHITECTURES:
      return SUPPORTED_ARCHITECTURES[arch]
  model_type = d.get("model_type")
  if model_type in SUPPORTED_MODEL_TYPES:
    return SUPPORTED_MODEL_TYPES[model_type]
  raise UnsupportedModelError(
    f"unsupported architecture: architectures={d.get('architectures')}, model_type={model_type!r};"
    f" expected one of {sorted(SUPPORTED_ARCHITECTURES)}"
  )


def _normalise_rope_scaling(scaling: dict[str, Any] | None) -> tuple[tuple[str, Any], ...] | None:
  """Keeps only Llama-3 scaling (as a sorted hashable tuple); 'default' means none."""
  if not scaling:
    return None
  rope_type = scaling.get("rope_type", scaling.get("type", "default"))
  if rope_type == "default":
    return None
  if rope_type != "llama3":
    raise UnsupportedModelError(f"rope_scaling type {rope_type!r} is not supported (only 'llama3')")
  keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
  missing = [k for k in keys if k not in scaling]
  if missing:
    raise ValueError(f"llama3 rope_scaling is missing {missing}: {scaling}")
  return tuple(sorted((k, float(scaling[k])) for k in keys))
