"""LoRA adapters -> a PEFT adapter folder, and back; merged adapters -> a Hugging Face folder.

A PEFT LoRA folder (what ``PeftModel.from_pretrained`` reads) holds ``adapter_config.json`` and
``adapter_model.safetensors`` with, per targeted linear layer of a Llama / Qwen2 / Qwen3 model,

  base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight   [r, in]
  base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight   [out, r]

and PEFT adds ``(lora_alpha / r) * lora_B @ lora_A`` to the [out, in] weight. Ours (``lora.py``)
adds ``(alpha / r) * A @ B`` to the [in, out] weight with A [*in, r] and B [r, *out], so
lora_A = A^T and lora_B = B^T, with the input / output dims flattened the way ``loading.py`` maps
the weights (e.g. o_proj's input is our (N, H) flattened head-major).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.model import lora as lora_lib
from rlvr_jax.model.config import ModelConfig

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PREFIX = "base_model.model.model.layers"


def _module(target: str) -> str:
  """PEFT's target module name of a target (``q`` -> ``q_proj``)."""
  return lora_lib.TARGETS[target][2].rsplit(".", 1)[1]


def _key(layer: int, target: str, which: str) -> str:
  return f"{_PREFIX}.{layer}.{lora_lib.TARGETS[target][2]}.lora_{which}.weight"


def _targets(lcfg: lora_lib.LoraConfig) -> list[str]:
  return [t for t in lora_lib.ALL_TARGETS if t in lcfg.targets]


def adapter_config(lcfg: lora_lib.LoraConfig, base_model_name_or_path: str | None = None) -> dict:
  """The ``adapter_config.json`` dict of ``lcfg`` (plain LoRA: no rsLoRA, DoRA or bias)."""
  return {
    "peft_type": "LORA",
    "task_type": "CAUSAL_LM",
    "base_model_name_or_path": base_model_name_or_path,
    "r": lcfg.rank,
    "lora_alpha": lcfg.alpha,
    "lora_dropout": lcfg.dropout,
    "target_modules": [_module(t) for t in _targets(lcfg)],
    "bias": "none",
    "fan_in_fan_out": False,
    "inference_mode": True,
    "init_lora_weights": True,
    "use_rslora": False,
    "use_dora": False,
    "modules_to_save": None,
    "layers_to_transform": None,
    "layers_pattern": None,
    "rank_pattern": {},
    "alpha_pattern": {},
    "revision": None,
  }


def export_peft_adapter(
  adapters: dict[str, Any],
  config: ModelConfig,
  lcfg: lora_lib.LoraConfig,
  path: str | os.PathLike,
  *,
  base_model_name_or_path: str | None = None,
  dtype: str = "float32",
) -> str:
  """Writes ``adapter_config.json`` and ``adapter_model.safetensors`` to ``path`` (created).

  Args:
    adapters: ``lora.init_lora``'s tree (any sharding; gathered one tensor at a time).
    config: the model config (checks the number of layers).
    lcfg: the ``LoraConfig`` the adapters were made with.
    base_model_name_or_path: written to the config (the model the adapter applies to).
    dtype: "float32" or "bfloat16" on disk.
  Returns:
    The folder path.
  """
  from safetensors.numpy import save_file

  path = os.fspath(path)
  os.makedirs(path, exist_ok=True)
  np_dtype = np.dtype(jnp.dtype(dtype))
  layers = adapters["layers"]
  tensors: dict[str, np.ndarray] = {}
  for target in _targets(lcfg):
    name = lora_lib.TARGETS[target][0]
    a = np.asarray(jax.device_get(layers[name]["a"]))
    b = np.asarray(jax.device_get(layers[name]["b"]))
    if a.shape[0] != config.num_layers or a.shape[-1] != lcfg.rank:
      raise ValueError(
        f"adapter {name}: A {a.shape} is not [L={config.num_layers}, ..., r={lcfg.rank}]"
      )
    for i in range(config.num_layers):
      lora_a = a[i].reshape(-1, lcfg.rank).T  # [r, in]
      lora_b = b[i].reshape(lcfg.rank, -1).T  # [out, r]
      tensors[_key(i, target, "A")] = np.ascontiguousarray(lora_a.astype(np_dtype))
      tensors[_key(i, target, "B")] = np.ascontiguousarray(lora_b.astype(np_dtype))
  save_file(tensors, os.path.join(path, ADAPTER_WEIGHTS), metadata={"format": "pt"})
  with open(os.path.join(path, ADAPTER_CONFIG), "w") as f:
    json.dump(adapter_config(lcfg, base_model_name_or_path), f, indent=2)
  return path


def load_peft_adapter(
  path: str | os.PathLike, config: ModelConfig, dtype: str = "float32"
) -> tuple[dict[str, Any], lora_lib.LoraConfig]:
  """Reads a PEFT LoRA folder (ours or PEFT's own ``save_pretrained``) into (adapters, lcfg).

  Supports plain LoRA on any of the seven projections of every layer, with ``use_rslora`` (its
  scale alpha / sqrt(r) becomes ``LoraConfig.alpha = lora_alpha * sqrt(r)``). Raises ValueError
  for what the merge cannot express (DoRA, per-module ranks, a subset of layers, LoRA biases).
  """
  from safetensors.numpy import load_file

  path = os.fspath(path)
  with open(os.path.join(path, ADAPTER_CONFIG)) as f:
    cfg = json.load(f)
  if cfg.get("peft_type") != "LORA":
    raise ValueError(f"{path}: peft_type {cfg.get('peft_type')!r} is not LORA")
  unsupported = {
    "use_dora": cfg.get("use_dora"),
    "rank_pattern": cfg.get("rank_pattern"),
    "alpha_pattern": cfg.get("alpha_pattern"),
    "layers_to_transform": cfg.get("layers_to_transform"),
    "lora_bias": cfg.get("lora_bias"),
    "fan_in_fan_out": cfg.get("fan_in_fan_out"),
    "modules_to_save": cfg.get("modules_to_save"),
  }
  bad = {k: v for k, v in unsupported.items() if v}
  if bad or cfg.get("bias", "none") != "none":
    raise ValueError(f"{path}: unsupported LoRA options {bad or {'bias': cfg.get('bias')}}")
  modules = cfg["target_modules"]
  if isinstance(modules, str):
    raise ValueError(f"{path}: target_modules is a pattern ({modules!r}); expected a list")
  by_module = {_module(t): t for t in lora_lib.ALL_TARGETS}
  unknown = sorted(set(modules) - set(by_module))
  if unknown:
    raise ValueError(f"{path}: target modules {unknown} are not among {sorted(by_module)}")
  rank = int(cfg["r"])
  alpha = float(cfg["lora_alpha"]) * (math.sqrt(rank) if cfg.get("use_rslora") else 1.0)
  targets = tuple(t for t in lora_lib.ALL_TARGETS if _module(t) in modules)
  lcfg = lora_lib.LoraConfig(rank=rank, alpha=alpha, targets=targets,
                             dropout=float(cfg.get("lora_dropout") or 0.0))  # fmt: skip
  tensors = load_file(os.path.join(path, ADAPTER_WEIGHTS))
  tensors = {k.replace(".default.weight", ".weight"): v for k, v in tensors.items()}
  shapes = lora_lib.abstract_lora(_abstract(config), lcfg)["layers"]
  out = {}
  for target in targets:
    name = lora_lib.TARGETS[target][0]
    a_shape, b_shape = shapes[name]["a"].shape[1:], shapes[name]["b"].shape[1:]
    a_layers, b_layers = [], []
    for i in range(config.num_layers):
      try:
        lora_a, lora_b = tensors[_key(i, target, "A")], tensors[_key(i, target, "B")]
      except KeyError as e:
        raise ValueError(f"{path}: missing tensor {e.args[0]}") from None
      if lora_a.shape != (rank, math.prod(a_shape[:-1])) or lora_b.shape[1] != rank:
        raise ValueError(
          f"{path}: layer {i} {_module(target)}: lora_A {lora_a.shape} / lora_B {lora_b.shape} "
          f"do not fit r={rank} and this config"
        )
      a_layers.append(lora_a.T.reshape(a_shape))
      b_layers.append(lora_b.T.reshape(b_shape))
    out[name] = {"a": jnp.asarray(np.stack(a_layers), dtype),
                 "b": jnp.asarray(np.stack(b_layers), dtype)}  # fmt: skip
  return {"layers": out}, lcfg


def _abstract(config: ModelConfig) -> dict[str, Any]:
  from rlvr_jax.model.params import abstract_params

  return abstract_params(config)


def export_merged_hf(
  base: dict[str, Any],
  adapters: dict[str, Any] | None,
  config: ModelConfig,
  lcfg: lora_lib.LoraConfig,
  path: str | os.PathLike,
  **export_kwargs,
) -> str:
  """Merges the adapters into the base (float32, dequantizing an int8 base) and writes a plain
  Hugging Face folder with ``export.export_hf`` (its keyword arguments: ``dtype``, ``tokenizer``,
  ``max_shard_bytes``)."""
  from rlvr_jax.model.export import export_hf

  merged = jax.jit(lora_lib.merge, static_argnums=(2, 3))(base, adapters, lcfg, "float32")
  return export_hf(merged, config, path, **export_kwargs)
