"""Hugging Face safetensors checkpoints (single file or sharded index) -> params pytree.

Every parameter is built with ``jax.make_array_from_callback``: each device shard is cut from
memory-mapped safetensors files, so a sharded load never assembles the whole model on one device, and
the host holds at most one layer's tensor at a time. Every tensor is checked against the abstract
description (``params.param_specs``); errors name the tensor, the file and what was expected.

The name map ``hf_layout`` (our param path -> HF tensor name + how to reshape it) is shared by the
GGUF loader and the exporter.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.params import ParamSpec, param_specs


class CheckpointError(ValueError):
  """A checkpoint file is missing, corrupt, or lacks / mis-shapes a tensor."""


# (our name inside "layers", HF suffix after "model.layers.{i}.", kind)
# kind: "vec" copy; "in_out" HF [out, in] -> ours [in, out]; "q"/"kv" [N*H, D] -> [D, N, H];
# "o" [D, N*H] -> [N, H, D]; "qb"/"kvb" [N*H] -> [N, H].
_LAYER_MAP = (
  ("attn_norm", "input_layernorm.weight", "vec"),
  ("wq", "self_attn.q_proj.weight", "q"),
  ("wk", "self_attn.k_proj.weight", "kv"),
  ("wv", "self_attn.v_proj.weight", "kv"),
  ("bq", "self_attn.q_proj.bias", "qb"),
  ("bk", "self_attn.k_proj.bias", "kvb"),
  ("bv", "self_attn.v_proj.bias", "kvb"),
  ("q_norm", "self_attn.q_norm.weight", "vec"),
  ("k_norm", "self_attn.k_norm.weight", "vec"),
  ("wo", "self_attn.o_proj.weight", "o"),
  ("mlp_norm", "post_attention_layernorm.weight", "vec"),
  ("w_gate", "mlp.gate_proj.weight", "in_out"),
  ("w_up", "mlp.up_proj.weight", "in_out"),
  ("w_down", "mlp.down_proj.weight", "in_out"),
)
_TOP_MAP = (
  ("embed", "model.embed_tokens.weight", "vec"),
  ("final_norm", "model.norm.weight", "vec"),
  ("lm_head", "lm_head.weight", "in_out"),
)


def hf_shape(kind: str, our_shape: tuple[int, ...]) -> tuple[int, ...]:
  """The HF tensor shape holding one (per-layer) tensor of ours of ``our_shape``."""
  if kind == "vec":
    return our_shape
  if kind == "in_out":
    return our_shape[::-1]
  if kind in ("q", "kv"):
    d, n, h = our_shape
    return (n * h, d)
  if kind == "o":
    n, h, d = our_shape
    return (d, n * h)
  if kind in ("qb", "kvb"):
    n, h = our_shape
    return (n * h,)
  raise ValueError(kind)


def from_hf(kind: str, x: np.ndarray, our_shape: tuple[int, ...]) -> np.ndarray:
  """HF layout -> ours for one (per-layer) tensor."""
  if kind == "vec":
    return x
  if kind == "in_out":
    return x.T
  if kind in ("q", "kv"):
    return x.T.reshape(our_shape)
  if kind == "o":
    return x.T.reshape(our_shape)
  return x.reshape(our_shape)


def to_hf(kind: str, x: np.ndarray) -> np.ndarray:
  """Ours -> HF layout for one (per-layer) tensor."""
  if kind == "vec":
    return x
  if kind == "in_out":
    return x.T
  if kind in ("q", "kv"):
    d = x.shape[0]
    return x.reshape(d, -1).T
  if kind == "o":
    d = x.shape[-1]
    return x.reshape(-1, d).T
  return x.reshape(-1)


def hf_layout(config: ModelConfig) -> list[tuple[tuple[str, ...], str | list[str], str, ParamSpec]]:
  """(our path, HF name or per-layer HF names, kind, spec) for every parameter of ``config``."""
  specs = param_specs(config)
  out = []
  for name, hf_name, kind in _TOP_MAP:
    if name in specs:
      out.append(((name,), hf_name, kind, specs[name]))
  for name, suffix, kind in _LAYER_MAP:
    if name in specs["layers"]:
      names = [f"model.layers.{i}.{suffix}" for i in range(config.num_layers)]
      out.append((("layers", name), names, kind, specs["layers"][name]))
  return out


def build_params(
  get_tensor: Callable[[str], np.ndarray],
  config: ModelConfig,
  *,
  shardings: Any = None,
  source: str = "checkpoint",
) -> dict[str, Any]:
  """Builds the params tree from a function returning HF-layout numpy tensors by HF name.

  Args:
    get_tensor: HF tensor name -> numpy array (raises KeyError when missing).
    config: the model config (its dtype is the target dtype).
    shardings: optional tree of ``jax.sharding.Sharding`` (same structure as the params); default
      a single-device sharding.
    source: a description of where tensors come from, for error messages.
  """
  default = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  params: dict[str, Any] = {"layers": {}}
  for path, hf_names, kind, spec in hf_layout(config):
    sharding = default if shardings is None else _get(shardings, path)
    stacked = isinstance(hf_names, list)
    layer_shape = spec.shape[1:] if stacked else spec.shape
    cache: dict[int, np.ndarray] = {}

    def read(i, hf_names=hf_names, kind=kind, layer_shape=layer_shape, cache=cache, spec=spec):
      if i not in cache:
        name = hf_names[i] if i >= 0 else hf_names
        try:
          x = get_tensor(name)
        except KeyError:
          raise CheckpointError(
            f"missing tensor {name!r} in {source} (expected shape {hf_shape(kind, layer_shape)})"
          ) from None
        want = hf_shape(kind, layer_shape)
        if tuple(x.shape) != want:
          raise CheckpointError(
            f"tensor {name!r} in {source} has shape {tuple(x.shape)}, expected {want}"
          )
        cache.clear()  # keep one layer in host memory
        cache[i] = np.asarray(from_hf(kind, x, layer_shape)).astype(spec.dtype)
      return cache[i]

    def callback(index, stacked=stacked, read=read, spec=spec):
      if not stacked:
        return read(-1)[index]
      layer_ids = range(spec.shape[0])[index[0]]
      return np.stack([read(i)[index[1:]] for i in layer_ids])

    arr = jax.make_array_from_callback(spec.shape, sharding, callback)
    _set(params, path, arr)
  return params


def _get(tree, path):
  for p in path:
    tree = tree[p]
  return tree


def _set(tree, path, value):
  for p in path[:-1]:
    tree = tree.setdefault(p, {})
  tree[path[-1]] = value


class SafetensorsReader:
  """Reads tensors by name from one safetensors file or a sharded ``*.index.json`` folder."""

  def __init__(self, path: str | os.PathLike):
    from safetensors import safe_open

    path = os.fspath(path)
    self.path = path
    if os.path.isdir(path):
      index = os.path.join(path, "model.safetensors.index.json")
      single = os.path.join(path, "model.safetensors")
      if os.path.exists(index):
        files = self._read_index(index, path)
      elif os.path.exists(single):
        files = {None: single}
      else:
        raise CheckpointError(f"no model.safetensors or model.safetensors.index.json in {path}")
    else:
      files = {None: path}
    self._handles = {}
    self._where: dict[str, str] = {}
    for file in sorted(set(files.values())):
      if not os.path.exists(file):
        raise CheckpointError(f"checkpoint file {file} listed in the index does not exist")
      try:
        handle = safe_open(file, framework="numpy")
      except Exception as e:  # safetensors raises its own error type on bad headers
        raise CheckpointError(f"cannot read safetensors file {file} (corrupt?): {e}") from e
      self._handles[file] = handle
      for key in handle.keys():
        self._where[key] = file
    if None not in files:
      for key, file in files.items():
        if key not in self._where:
          raise CheckpointError(f"index lists tensor {key!r} in {file}, but the file lacks it")

  @staticmethod
  def _read_index(index: str, folder: str) -> dict[str | None, str]:
    try:
      with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    except (json.JSONDecodeError, KeyError) as e:
      raise CheckpointError(f"{index} is not a valid safetensors index (need 'weight_map')") from e
    return {k: os.path.join(folder, v) for k, v in weight_map.items()}

  def keys(self) -> list[str]:
    return sorted(self._where)

  def __call__(self, name: str) -> np.ndarray:
    file = self._where[name]  # KeyError -> "missing tensor" upstream
    try:
      return self._handles[file].get_tensor(name)
    except Exception as e:
      raise CheckpointError(f"cannot read tensor {name!r} from {file} (corrupt?): {e}") from e


def load_hf(
  path: str | os.PathLike,
  *,
  config: ModelConfig | None = None,
  dtype: str | None = None,
  shardings: Any = None,
  mesh: jax.sharding.Mesh | None = None,
  rules=None,
) -> tuple[dict[str, Any], ModelConfig]:
  """Loads a Hugging Face checkpoint folder (``config.json`` + safetensors) into a params tree.

  Args:
    path: folder with ``config.json`` and ``model.safetensors`` or a sharded index.
    config: overrides reading ``config.json``.
    dtype: "float32" / "bfloat16" target dtype (default: the config's, i.e. float32).
    shardings: tree of shardings for the params; or give ``mesh`` (and optional logical ``rules``)
      to derive them with ``param_shardings``.
  Returns:
    (params, config).
  """
  if config is None:
    config = ModelConfig.from_pretrained(path)
  if dtype is not None:
    config = config.replace(dtype=dtype)
  if shardings is None and mesh is not None:
    from rlvr_jax.model.params import param_shardings

    shardings = param_shardings(config, mesh, rules)
  reader = SafetensorsReader(path)
  params = build_params(reader, config, shardings=shardings, source=os.fspath(path))
  return params, config
