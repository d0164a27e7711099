"""The one abstract description of the parameter tree: shape, dtype and logical axes per tensor.

``param_specs(config)`` is the single source of truth. From it come

  * ``init_params``      random initialisation (optionally created already sharded),
  * ``abstract_params``  a tree of ``jax.ShapeDtypeStruct`` (the checkpoint-restore target),
  * ``param_shardings``  ``NamedSharding`` per tensor from logical-axis rules (``rlvr_jax.sharding``),
  * the Hugging Face load target (``loading.py`` checks every tensor against it).

Layout (decoder layers stacked on a leading L axis so the forward pass is one ``lax.scan``)::

  embed        [V, D]            ("vocab", "embed")
  layers/
    attn_norm  [L, D]            ("layers", "norm")
    wq         [L, D, N, H]      ("layers", "embed", "heads", "head_dim")
    wk, wv     [L, D, K, H]      ("layers", "embed", "kv_heads", "head_dim")
    bq         [L, N, H]         (Qwen2 only; bk, bv [L, K, H])
    q_norm     [L, H]            (Qwen3 only; k_norm [L, H])
    wo         [L, N, H, D]      ("layers", "heads", "head_dim", "embed")
    mlp_norm   [L, D]
    w_gate     [L, D, F]         ("layers", "embed", "mlp");  w_up the same
    w_down     [L, F, D]         ("layers", "mlp", "embed")
  final_norm   [D]
  lm_head      [D, V]            (untied models only)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from rlvr_jax.model.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class ParamSpec:
  """Shape, dtype, logical axis names and initialiser kind of one parameter tensor."""

  shape: tuple[int, ...]
  dtype: str
  axes: tuple[str | None, ...]
  init: str = "normal"  # "normal" (std 0.02 as in HF), "ones", "zeros"

  def __post_init__(self):
    if len(self.shape) != len(self.axes):
      raise ValueError(f"shape {self.shape} and axes {self.axes} differ in rank")


def is_spec(x: Any) -> bool:
  return isinstance(x, ParamSpec)


def param_specs(config: ModelConfig) -> dict[str, Any]:
  """The nested dict of ``ParamSpec`` for ``config`` (see the module docstring for the layout)."""
  c = config
  V, D, F, L = c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers
  N, K, H = c.num_heads, c.num_kv_heads, c.head_dim
  dt = c.dtype
  layers = {
    "attn_norm": ParamSpec((L, D), dt, ("layers", "norm"), "ones"),
    "wq": ParamSpec((L, D, N, H), dt, ("layers", "embed", "heads", "head_dim")),
    "wk": ParamSpec((L, D, K, H), dt, ("layers", "embed", "kv_heads", "head_dim")),
    "wv": ParamSpec((L, D, K, H), dt, ("layers", "embed", "kv_heads", "head_dim")),
    "wo": ParamSpec((L, N, H, D), dt, ("layers", "heads", "head_dim", "embed")),
    "mlp_norm": ParamSpec((L, D), dt, ("layers", "norm"), "ones"),
    "w_gate": ParamSpec((L, D, F), dt, ("layers", "embed", "mlp")),
    "w_up": ParamSpec((L, D, F), dt, ("layers", "embed", "mlp")),
    "w_down": ParamSpec((L, F, D), dt, ("layers", "mlp", "embed")),
  }
  if c.attention_bias:
    layers["bq"] = ParamSpec((L, N, H), dt, ("layers", "heads", "head_dim"), "zeros")
    layers["bk"] = ParamSpec((L, K, H), dt, ("layers", "kv_heads", "head_dim"), "zeros")
    layers["bv"] = ParamSpec((L, K, H), dt, ("layers", "kv_heads", "head_dim"), "zeros")
  if c.qk_norm:
    layers["q_norm"] = ParamSpec((L, H), dt, ("layers", "head_dim"), "ones")
    layers["k_norm"] = ParamSpec((L, H), dt, ("layers", "head_dim"), "ones")
  specs: dict[str, Any] = {
    "embed": ParamSpec((V, D), dt, ("vocab", "embed")),
    "layers": layers,
    "final_norm": ParamSpec((D,), dt, ("norm",), "ones"),
  }
  if not c.tie_word_embeddings:
    specs["lm_head"] = ParamSpec((D, V), dt, ("embed", "vocab"))
  return specs


def abstract_params(config: ModelConfig, shardings: Any = None) -> dict[str, Any]:
  """``jax.ShapeDtypeStruct`` tree (with shardings if given): the restore / load target."""
  specs = param_specs(config)
  if shardings is None:
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype), specs, is_leaf=is_spec)
  return jax.tree.map(
    lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
    specs,
    shardings,
    is_leaf=is_spec,
  )


def logical_axes(config: ModelConfig) -> dict[str, Any]:
  """Tree of logical-axis tuples, same structure as the params."""
  return jax.tree.map(lambda s: s.axes, param_specs(config), is_leaf=is_spec)


def param_shardings(config: ModelConfig, mesh: jax.sharding.Mesh, rules=None) -> dict[str, Any]:
  """``NamedSharding`` per parameter from logical-axis rules (default: the training rules)."""
  from rlvr_jax import sharding as sharding_lib

  rules = sharding_lib.TRAIN_RULES if rules is None else rules
  specs = param_specs(config)
  return jax.tree.map(
    lambda s: sharding_lib.logical_to_sharding(s.axes, mesh, rules, shape=s.shape),
    specs,
    is_leaf=is_spec,
  )


def _init_one(spec: ParamSpec, key: jax.Array) -> jax.Array:
  if spec.init == "ones":
    return jnp.ones(spec.shape, spec.dtype)
  if spec.init == "zeros":
    return jnp.zeros(spec.shape, spec.dtype)
  return (0.02 * jax.random.normal(key, spec.shape, jnp.float32)).astype(spec.dtype)


def _init_tree(config: ModelConfig, key: jax.Array) -> dict[str, Any]:
  specs = param_specs(config)
  leaves, treedef = jax.tree.flatten(specs, is_leaf=is_spec)
  keys = jax.random.split(key, len(leaves))
  return jax.tree.unflatten(treedef, [_init_one(s, k) for s, k in zip(leaves, keys, strict=True)])


_init_jit = jax.jit(_init_tree, static_argnums=0)


def init_params(config: ModelConfig, key: jax.Array, *, shardings: Any = None) -> dict[str, Any]:
  """Random parameters (normal std 0.02, norms at 1, biases at 0), as HF initialises them.

  With ``shardings`` (e.g. from ``param_shardings``) each tensor is created already sharded under
  ``jax.jit`` (no full copy on one device). The values do not depend on the shardings.
  """
  if shardings is None:
    return _init_jit(config, key)
  return jax.jit(_init_tree, static_argnums=0, out_shardings=shardings)(config, key)


def check_params(params: Any, config: ModelConfig) -> None:
  """Raises ValueError naming the first tensor whose presence or shape differs from the specs."""
  specs = param_specs(config)
  flat_specs = dict(_flatten(specs))
  flat_params = dict(_flatten(params))
  for name, spec in flat_specs.items():
    if name not in flat_params:
      raise ValueError(f"missing parameter {name!r} (expected shape {spec.shape})")
    shape = tuple(flat_params[name].shape)
    if shape != spec.shape:
      raise ValueError(f"parameter {name!r} has shape {shape}, expected {spec.shape}")
  extra = sorted(set(flat_params) - set(flat_specs))
  if extra:
    raise ValueError(f"unexpected parameters {extra} for this config")


def _flatten(tree: Any, prefix: str = "") -> list[tuple[str, Any]]:
  out = []
  for k, v in tree.items():
    name = f"{prefix}{k}"
    if isinstance(v, dict):
      out.extend(_flatten(v, name + "/"))
    else:
      out.append((name, v))
  return out


def count_params(config: ModelConfig) -> int:
  """Total number of parameters."""
  total = 0
  for _, s in _flatten(param_specs(config)):
    n = 1
    for d in s.shape:
      n *= d
    total += n
  return total
