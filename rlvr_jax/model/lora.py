"""LoRA adapters (arXiv 2106.09685) and an int8 weight-only base, on the params pytree.

An adapter of a projection weight W (``params["layers"][name]``, stacked over the L layers) is a
pair A, B laid out like W's input and output dims, with the rank r between them::

  weight            W                 A (random, small)    B (zeros at init)
  wq     [L, D, N, H]                 [L, D, r]            [L, r, N, H]
  wk, wv [L, D, K, H]                 [L, D, r]            [L, r, K, H]
  wo     [L, N, H, D]                 [L, N, H, r]         [L, r, D]
  w_gate, w_up [L, D, F]              [L, D, r]            [L, r, F]
  w_down [L, F, D]                    [L, F, r]            [L, r, D]

  merged W' = W + (alpha / r) * A @ B      (A @ B contracts r; reshaped to W's shape)

The adapter tree mirrors the params: ``{"layers": {"wq": {"a": A, "b": B}, ...}}``, so it is a
plain nested dict of arrays (optax, orbax and the sharding rules take it as they take the params;
``lora_logical_axes`` gives A the logical axes of W's input dims and B those of its output dims,
the rank axis replicated).

The forward pass runs on the MERGED tree: ``merge(base, adapters, lcfg, dtype)`` returns an
ordinary params tree that every entry point of ``rlvr_jax.model`` accepts unchanged (the scanned
training forward, the shared-prompt forward, the cached decoder, export). ``merge`` computes the
rank-r product from A and B cast to the compute dtype (float32 accumulation) and adds it to the
base with one rounding to that dtype (in float32 for a float32 or int8 base; a base already in
the compute dtype is added to in it): with a bfloat16 forward the model sees bf16(W + delta), the
same rounding of small updates as the bf16(w32) copy of mixed-precision full fine-tuning, while
the float32 A and B are the master copies that accumulate the updates. Switched off
(``adapters=None``) or with B = 0, ``merge`` returns the base weights bit for bit: the base is the
reference policy, no copy needed.

``adapter_loss(loss_fn, base, lcfg)`` turns ``loss_fn(params)`` into ``loss(adapters)`` with the
base closed over under ``stop_gradient``: gradients, and so the optimiser state, exist only for
the adapters.

Merged as a whole tree, a merged copy of every targeted weight (and, in the backward pass, its
full-size cotangent) lives during the update. ``attach`` + ``merge_attached`` merge per layer
instead: the adapters ride along in ``params["layers"]["lora"]``, the layer scan slices them with
the weights, and the decoder calls ``merge_attached`` at the top of its scanned layer body
(``rlvr_jax.model.decoder._differentiable``: the training, scoring and prefill forwards), merging
(and dequantizing) one layer at a time. The cached decode path refuses an attached tree (sample
with ``merge``'s). The trainer's LoRA step uses it with ``ModelConfig.remat`` (``train.step``);
``tools/lora_memory.py --per-layer`` measures it. ``merge_layer`` is the merge of one layer's
dicts.

int8 weight-only base (``quantize_int8``): each matmul weight becomes ``{"qint8": int8 [W's shape],
"scale": float32 [L, *out dims]}``, per-output-channel symmetric (scale = max |W| over the input
dims / 127). ``merge`` dequantizes (in float32, rounded once to the compute dtype together with
the adapter's delta); a quantized tree must go through ``merge`` (or ``attach`` and the hook)
before the forward pass.

Why hand-written and not ``qwix`` (Google's quantization / LoRA library for JAX, used by Tunix):
qwix 0.1.8 installs with our pins (jax 0.10.2, flax 0.12.8) but attaches adapters by intercepting
``dot_general`` / ``einsum`` inside a Flax (linen or NNX) module and matching the right operand
to a param attribute of the module being called. Our decoder is a pure function that slices the
stacked weights inside a ``lax.scan``: wrapped in an NNX module holding the params, qwix's
``apply_lora_to_model`` failed under the decoder's ``jax.jit`` (``TraceContextError``: it creates
the LoRA params inside the trace) and, with jit disabled, found only ``lm_head`` (the one weight
used outside the scan), none of the seven projections. The pytree version here is small, keeps
the stacked layout (A and B scan with the layers) and needs no change to the decoder.

Dropout on the adapter input (``LoraConfig.dropout``) needs the unmerged form x W + (drop(x) A) B
and breaks the equality of trainer and sampler log-probs that on-policy RL relies on; ``merge``
refuses a config with dropout > 0 (the field is written to the PEFT config as it is).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from rlvr_jax.model.config import ModelConfig

# target name -> (weight in params["layers"], number of its input dims after the L axis, the
# Hugging Face module of the layer that holds it).
TARGETS: dict[str, tuple[str, int, str]] = {
  "q": ("wq", 1, "self_attn.q_proj"),
  "k": ("wk", 1, "self_attn.k_proj"),
  "v": ("wv", 1, "self_attn.v_proj"),
  "o": ("wo", 2, "self_attn.o_proj"),
  "gate": ("w_gate", 1, "mlp.gate_proj"),
  "up": ("w_up", 1, "mlp.up_proj"),
  "down": ("w_down", 1, "mlp.down_proj"),
}
ALL_TARGETS = tuple(TARGETS)
_IN_DIMS = {w: n for w, n, _ in TARGETS.values()}
# (input dims, output dims) of each matmul weight, after the leading L axis of a stacked layer
# weight (a per-layer weight, or lm_head, has none).
_DIMS = {"wq": (1, 2), "wk": (1, 2), "wv": (1, 2), "wo": (2, 1), "w_gate": (1, 1),
         "w_up": (1, 1), "w_down": (1, 1), "lm_head": (1, 1)}  # fmt: skip
# The weights ``quantize_int8`` quantizes by default: every projection and the untied lm_head [D, V]
# (the token embedding is a gather, and a tied unembedding is the embedding).
QUANTIZABLE = tuple(_DIMS)


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """Rank r, scale alpha (the update is (alpha / r) A @ B), targeted projections, input dropout.

  Hashable (a static argument of jitted functions)."""

  rank: int = 16
  alpha: float = 32.0
  targets: tuple[str, ...] = ALL_TARGETS
  dropout: float = 0.0

  def __post_init__(self):
    object.__setattr__(self, "targets", tuple(self.targets))
    if self.rank < 1:
      raise ValueError(f"LoRA rank must be >= 1, got {self.rank}")
    unknown = [t for t in self.targets if t not in TARGETS]
    if unknown or not self.targets or len(set(self.targets)) != len(self.targets):
      raise ValueError(f"LoRA targets {self.targets}: expected distinct names of {ALL_TARGETS}")
    if not 0.0 <= self.dropout < 1.0:
      raise ValueError(f"LoRA dropout must be in [0, 1), got {self.dropout}")

  @property
  def scale(self) -> float:
    return float(self.alpha) / self.rank

  @property
  def weights(self) -> tuple[str, ...]:
    """The targeted weights' names in ``params["layers"]``, in ``TARGETS`` order."""
    return tuple(TARGETS[t][0] for t in ALL_TARGETS if t in self.targets)


# ------------------------------------------------------------------------------------------------
# int8 weight-only quantization


def is_quantized(x: Any) -> bool:
  """Whether ``x`` is a quantized weight (``{"qint8": ..., "scale": ...}``)."""
  return isinstance(x, dict) and set(x) == {"qint8", "scale"}


def _shape(x: Any) -> tuple[int, ...]:
  return tuple((x["qint8"] if is_quantized(x) else x).shape)


def _in_axes(name: str, ndim: int) -> tuple[int, ...]:
  """The input axes of weight ``name`` of rank ``ndim`` (stacked over L or not)."""
  num_in, num_out = _DIMS[name]
  lead = ndim - num_in - num_out
  if lead not in (0, 1):
    raise ValueError(f"weight {name!r} of rank {ndim}: expected {num_in + num_out} (+1 stacked)")
  return tuple(range(lead, lead + num_in))


def quantize_weight(w: jax.Array, name: str) -> dict[str, jax.Array]:
  """Per-output-channel symmetric int8 of the matmul weight ``name`` (``wq`` ... ``lm_head``;
  stacked over L or one layer's): scale = max |w| over the input dims / 127, float32, shaped as
  ``w`` without its input dims."""
  w32 = w.astype(jnp.float32)
  axes = _in_axes(name, w.ndim)
  amax = jnp.max(jnp.abs(w32), axis=axes, keepdims=True)
  scale = jnp.where(amax > 0, amax / 127.0, 1.0)
  q = jnp.clip(jnp.round(w32 / scale), -127, 127).astype(jnp.int8)
  return {"qint8": q, "scale": jnp.squeeze(scale, axes)}


def _dequantize32(qw: dict[str, jax.Array], name: str) -> jax.Array:
  q = qw["qint8"]
  scale = jnp.expand_dims(qw["scale"].astype(jnp.float32), _in_axes(name, q.ndim))
  return q.astype(jnp.float32) * scale


def dequantize(qw: dict[str, jax.Array], name: str, dtype="float32") -> jax.Array:
  """The weight ``name`` from ``quantize_weight``'s output, in ``dtype`` (one rounding)."""
  return _dequantize32(qw, name).astype(dtype)


def quantize_int8(params: dict[str, Any], names: Sequence[str] = QUANTIZABLE) -> dict[str, Any]:
  """``params`` with each named weight (in ``params["layers"]``, or ``lm_head``) replaced by its
  int8 form (``quantize_weight``); other tensors as they are. Jittable (shardings follow)."""
  unknown = [n for n in names if n not in QUANTIZABLE]
  if unknown:
    raise ValueError(f"cannot quantize {unknown}: expected names of {QUANTIZABLE}")
  layers = dict(params["layers"])
  for name in names:
    if name in layers and not is_quantized(layers[name]):
      layers[name] = quantize_weight(layers[name], name)
  out = dict(params, layers=layers)
  if "lm_head" in names and "lm_head" in out and not is_quantized(out["lm_head"]):
    out["lm_head"] = quantize_weight(out["lm_head"], "lm_head")
  return out


def quantized_logical_axes(config: ModelConfig, names: Sequence[str] = QUANTIZABLE) -> dict:
  """Logical axes of ``quantize_int8(params, names)`` (the int8 values keep the weight's axes;
  the scales those of the output dims), for ``sharding.tree_shardings``."""
  from rlvr_jax.model.params import logical_axes

  axes = logical_axes(config)
  layers = dict(axes["layers"])
  for name in names:
    if name in layers:
      w = layers[name]
      layers[name] = {"qint8": w, "scale": (w[0],) + w[1 + _DIMS[name][0] :]}
  out = dict(axes, layers=layers)
  if "lm_head" in names and "lm_head" in out:
    out["lm_head"] = {"qint8": out["lm_head"], "scale": out["lm_head"][1:]}
  return out


# ------------------------------------------------------------------------------------------------
# Adapters


def _init_adapters(shapes: tuple, lcfg: LoraConfig, key: jax.Array, dtype: str) -> dict:
  a_shapes, sizes, bounds = [], [], []
  for name, shape in shapes:
    n_in = _IN_DIMS[name]
    a_shapes.append((*shape[: 1 + n_in], lcfg.rank))
    sizes.append(math.prod(a_shapes[-1]))
    bounds.append(1.0 / math.sqrt(math.prod(shape[1 : 1 + n_in])))
  # One draw for all the A's (one random-bits kernel to compile instead of one per target).
  u = jax.random.uniform(key, (sum(sizes),), jnp.float32, -1.0, 1.0)
  out, start = {}, 0
  for (name, shape), a_shape, size, bound in zip(shapes, a_shapes, sizes, bounds, strict=True):
    a = (u[start : start + size] * bound).reshape(a_shape)
    start += size
    b_shape = (shape[0], lcfg.rank, *shape[1 + _IN_DIMS[name] :])
    out[name] = {"a": a.astype(dtype), "b": jnp.zeros(b_shape, dtype)}
  return {"layers": out}


_init_jit = jax.jit(_init_adapters, static_argnums=(0, 1, 3))


def init_lora(
  params: dict[str, Any], lcfg: LoraConfig, key: jax.Array, dtype="float32", *, shardings=None
) -> dict:
  """The adapter tree of ``params`` (arrays, ``ShapeDtypeStruct``s or a quantized tree: only
  shapes are read): A ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (PEFT's default, fan_in the product
  of W's input dims), B = 0, so that the merged model starts as the base. With ``shardings``
  (``lora_shardings``) the tensors are created already sharded."""
  layers = params["layers"]
  shapes = tuple((name, _shape(layers[name])) for name in lcfg.weights)
  dtype = jnp.dtype(dtype).name
  if shardings is None:
    return _init_jit(shapes, lcfg, key, dtype)
  return jax.jit(_init_adapters, static_argnums=(0, 1, 3), out_shardings=shardings)(
    shapes, lcfg, key, dtype
  )


def abstract_lora(params: dict[str, Any], lcfg: LoraConfig, dtype="float32") -> dict:
  """``init_lora``'s tree of ``ShapeDtypeStruct`` (nothing allocated)."""
  return jax.eval_shape(lambda: init_lora(params, lcfg, jax.random.key(0), dtype))


def lora_logical_axes(config: ModelConfig, lcfg: LoraConfig) -> dict:
  """Logical axes of the adapters: A those of W's (layers, input dims) and None on the rank; B
  None on the rank and those of W's output dims."""
  from rlvr_jax.model.params import logical_axes

  layer_axes = logical_axes(config)["layers"]
  out = {}
  for name in lcfg.weights:
    w, n_in = layer_axes[name], _IN_DIMS[name]
    out[name] = {"a": w[: 1 + n_in] + (None,), "b": (w[0], None) + w[1 + n_in :]}
  return {"layers": out}


def lora_shardings(config: ModelConfig, lcfg: LoraConfig, mesh, rules=None) -> dict:
  """``NamedSharding`` per adapter tensor from the logical-axis rules (default: training)."""
  from rlvr_jax import sharding as sharding_lib

  rules = sharding_lib.TRAIN_RULES if rules is None else rules
  from rlvr_jax.model.params import abstract_params

  shapes = abstract_lora(abstract_params(config), lcfg)
  return sharding_lib.tree_shardings(lora_logical_axes(config, lcfg), shapes, mesh, rules)


def zero_adapters(adapters: dict) -> dict:
  """``adapters`` with every B zeroed: the merged model is the base (the adapters "off")."""
  return {
    "layers": {
      n: {"a": ab["a"], "b": jnp.zeros_like(ab["b"])} for n, ab in adapters["layers"].items()
    }
  }


def count_lora_params(adapters: dict) -> int:
  return sum(math.prod(x.shape) for x in jax.tree.leaves(adapters))


# ------------------------------------------------------------------------------------------------
# Merging


def lora_delta(a: jax.Array, b: jax.Array, num_in: int, scale: float, dtype) -> jax.Array:
  """scale * A @ B in ``dtype`` (float32 accumulation), shaped [*lead, *in, *out] like W, for A
  [*lead, *in, r] and B [*lead, r, *out] (``num_in`` input dims)."""
  r = a.shape[-1]
  lead = a.shape[: a.ndim - num_in - 1]
  ins, outs = a.shape[len(lead) : -1], b.shape[len(lead) + 1 :]
  if b.shape[len(lead)] != r or b.shape[: len(lead)] != lead:
    raise ValueError(f"LoRA A {a.shape} and B {b.shape} do not match")
  a2 = a.reshape(*lead, math.prod(ins), r).astype(dtype)
  b2 = (b.reshape(*lead, r, math.prod(outs)).astype(jnp.float32) * scale).astype(dtype)
  d = jnp.matmul(a2, b2, preferred_element_type=jnp.float32).astype(dtype)
  return d.reshape(*lead, *ins, *outs)


def _merge_one(name: str, w, ab, scale: float, dtype):
  quantized = is_quantized(w)
  out_dtype = jnp.dtype(dtype or (w["scale"].dtype if quantized else w.dtype))
  if ab is None:
    if quantized:
      return dequantize(w, name, out_dtype)
    return w if w.dtype == out_dtype else w.astype(out_dtype)
  delta = lora_delta(ab["a"], ab["b"], _DIMS[name][0], scale, out_dtype)
  if _shape(w) != delta.shape:
    raise ValueError(f"LoRA update {delta.shape} does not match its weight {_shape(w)}")
  if not quantized and w.dtype == out_dtype:
    return w + delta
  base = _dequantize32(w, name) if quantized else w.astype(jnp.float32)
  return (base + delta.astype(jnp.float32)).astype(out_dtype)


def _check_merge(adapters, lcfg: LoraConfig):
  if adapters is None:
    return {}
  if lcfg.dropout:
    raise ValueError(
      f"LoRA dropout={lcfg.dropout}: merged adapters have no dropout (it needs the unmerged "
      "x W + (drop(x) A) B, and breaks on-policy log-prob equality); use dropout=0"
    )
  got = adapters["layers"]
  if set(got) != set(lcfg.weights):
    raise ValueError(f"adapters for {sorted(got)}, but the LoRA config targets {lcfg.weights}")
  return got


def merge_layer(layer: dict, layer_adapters: dict | None, lcfg: LoraConfig, dtype=None) -> dict:
  """``merge`` of one layer: ``layer`` is a per-layer params dict (``wq`` [D, N, H], ...; or the
  stacked one) and ``layer_adapters`` the matching ``adapters["layers"]`` dict (or None)."""
  got = _check_merge(None if layer_adapters is None else {"layers": layer_adapters}, lcfg)
  missing = sorted(set(got) - set(layer))
  if missing:
    raise ValueError(f"adapters for {missing}, which the params do not have")
  out = dict(layer)
  for name, w in layer.items():
    if name in got or is_quantized(w):
      out[name] = _merge_one(name, w, got.get(name), lcfg.scale, dtype)
    elif dtype is not None and name in _IN_DIMS and w.dtype != jnp.dtype(dtype):
      out[name] = w.astype(dtype)
  return out


def merge(base: dict, adapters: dict | None, lcfg: LoraConfig, dtype=None) -> dict:
  """The full params tree W + (alpha / r) A @ B for every targeted weight.

  Args:
    base: params tree (``param_specs`` layout), possibly with int8 weights (``quantize_int8``).
    adapters: ``init_lora``'s tree, or None (adapters off: the base, dequantized if quantized).
    lcfg: the ``LoraConfig``.
    dtype: dtype of the projection weights (merged, dequantized or just cast) and of ``lm_head``
      when quantized, e.g. the compute dtype; default: each weight's own dtype (float32 for a
      dequantized one). The merge adds A @ B (computed in ``dtype``) to the base in float32 and
      rounds once. Norms, biases and the embeddings are returned as they are.
  Returns:
    A params tree for ``rlvr_jax.model.forward`` and friends. Differentiable in the adapters (and
    in a float base); with ``adapters=None``, or B = 0, the base weights exactly.
  """
  out = dict(
    base,
    layers=merge_layer(
      base["layers"], None if adapters is None else adapters["layers"], lcfg, dtype
    ),
  )
  if "lm_head" in base and is_quantized(base["lm_head"]):
    out["lm_head"] = _merge_one("lm_head", base["lm_head"], None, lcfg.scale, dtype)
  return out


def adapter_loss(
  loss_fn: Callable[..., Any], base: dict, lcfg: LoraConfig, *, dtype=None, attached=False
) -> Callable[..., Any]:
  """``loss(adapters, *args, **kwargs) = loss_fn(merge(stop_gradient(base), adapters), ...)``.

  The base is closed over (it is not an argument, so ``jax.grad`` of the result differentiates
  the adapters only) and behind ``stop_gradient`` (no gradient reaches it even when it is itself
  a traced value of an enclosing transformation). An optimiser initialised on the adapters then
  holds state for the adapters only. ``has_aux`` outputs of ``loss_fn`` pass through.
  ``attached=True``: ``attach`` instead of ``merge`` (for a decoder with the per-layer hook).
  """
  combine = attach if attached else merge

  def loss(adapters, *args, **kwargs):
    frozen = jax.tree.map(jax.lax.stop_gradient, base)
    return loss_fn(combine(frozen, adapters, lcfg, dtype), *args, **kwargs)

  return loss


# ------------------------------------------------------------------------------------------------
# Per-layer merging inside the decoder's layer scan (the proposed decoder hook)

ATTACHED = "lora"  # the key of the attached adapters in params["layers"]


def attach(base: dict, adapters: dict | None, lcfg: LoraConfig, dtype=None) -> dict:
  """``base`` with the adapters riding along in ``params["layers"]["lora"]`` (B pre-scaled by
  alpha / r, differentiably), for a decoder that calls ``merge_attached`` on each layer's dict
  inside its layer scan: the scan slices A and B with the weights, each layer's weights are
  merged (and dequantized) when the layer runs, and neither a merged copy of all layers nor its
  full-size cotangent is ever materialised. Quantized tensors outside the layers (``lm_head``)
  are dequantized here, into ``dtype``. ``adapters=None``: nothing attached."""
  got = _check_merge(adapters, lcfg)
  out = dict(base)
  if "lm_head" in base and is_quantized(base["lm_head"]):
    out["lm_head"] = _merge_one("lm_head", base["lm_head"], None, 1.0, dtype)
  if not got:
    return out
  scaled = {n: {"a": ab["a"], "b": ab["b"] * jnp.asarray(lcfg.scale, ab["b"].dtype)}
            for n, ab in got.items()}  # fmt: skip
  return dict(out, layers=dict(base["layers"], **{ATTACHED: scaled}))


def merge_attached(layer: dict, dtype=None) -> dict:
  """One layer's params dict (or the stacked one) with its attached adapters (``attach``)
  merged in and its int8 weights dequantized, in ``dtype``; the layer dict unchanged when it has
  neither. The decoder hook: ``lp = lora.merge_attached(lp, config.activation_dtype)`` at the top
  of the layer body."""
  attached = layer.get(ATTACHED)
  if attached is None and not any(is_quantized(w) for w in layer.values()):
    return layer
  rest = {k: v for k, v in layer.items() if k != ATTACHED}
  if attached is None:
    return merge_layer(rest, None, LoraConfig(), dtype)
  names = {w: t for t, (w, _, _) in TARGETS.items()}
  rank = next(iter(attached.values()))["a"].shape[-1]
  unit = LoraConfig(rank=rank, alpha=float(rank), targets=tuple(names[w] for w in attached))
  return merge_layer(rest, attached, unit, dtype)
