"""params pytree -> a Hugging Face folder (``config.json`` + safetensors) that ``transformers`` loads.

Large models are split into several files with a ``model.safetensors.index.json`` (the same layout
``save_pretrained`` writes). Sharded arrays are gathered to the host one tensor at a time.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np

from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.loading import hf_layout, to_hf
from rlvr_jax.model.params import check_params


def export_hf(
  params: dict[str, Any],
  config: ModelConfig,
  path: str | os.PathLike,
  *,
  dtype: str | None = None,
  max_shard_bytes: int = 2 * 1024**3,
  tokenizer=None,
) -> str:
  """Writes ``config.json`` and ``model*.safetensors`` (plus the tokenizer if given) to ``path``.

  Args:
    params: params tree of ``config`` (any sharding).
    config: its config.
    path: output folder (created).
    dtype: "float32" / "bfloat16" on disk (default: the config dtype).
    max_shard_bytes: split into several files with an index above this size.
    tokenizer: optional ``rlvr_jax.model.Tokenizer`` (or transformers tokenizer) to save alongside.
  Returns:
    The folder path.
  """
  from safetensors.numpy import save_file

  check_params(params, config)
  path = os.fspath(path)
  os.makedirs(path, exist_ok=True)
  dtype = np.dtype(jax.numpy.dtype(dtype or config.dtype))
  tensors: dict[str, np.ndarray] = {}
  for keys, hf_names, kind, _spec in hf_layout(config):
    value = params
    for k in keys:
      value = value[k]
    value = np.asarray(jax.device_get(value)).astype(dtype)
    if isinstance(hf_names, list):
      for i, name in enumerate(hf_names):
        tensors[name] = np.ascontiguousarray(to_hf(kind, value[i]))
    else:
      tensors[hf_names] = np.ascontiguousarray(to_hf(kind, value))

  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for name, x in tensors.items():
    if size and size + x.nbytes > max_shard_bytes:
      shards.append({})
      size = 0
    shards[-1][name] = x
    size += x.nbytes
  metadata = {"format": "pt"}
  if len(shards) == 1:
    save_file(shards[0], os.path.join(path, "model.safetensors"), metadata=metadata)
  else:
    weight_map = {}
    for i, shard in enumerate(shards):
      file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
      save_file(shard, os.path.join(path, file), metadata=metadata)
      weight_map.update({name: file for name in shard})
    index = {"metadata": {"total_size": sum(x.nbytes for x in tensors.values())}}
    index["weight_map"] = weight_map
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
      json.dump(index, f, indent=2)

  hf_config = config.to_hf_dict()
  hf_config["torch_dtype"] = hf_config["dtype"] = str(dtype)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf_config, f, indent=2)
  if tokenizer is not None:
    getattr(tokenizer, "hf", tokenizer).save_pretrained(path)
  return path
