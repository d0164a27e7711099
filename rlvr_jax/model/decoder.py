"""The decoder forward pass (Llama / Qwen2 / Qwen3) as a pure function over the params pytree.

Pre-norm residual blocks (arXiv 2302.13971):
  h = x + Attn(RMSNorm(x)),   y = h + SwiGLU(RMSNorm(h)),
and a final RMSNorm. Without a cache (training, scoring) the L layers are stacked and run by one
``lax.scan`` (compile time independent of depth). With a KV cache (prefill, decoding) they run as an
unrolled loop over per-layer weights (``unstack_layers``) and per-layer cache buffers, each layer
writing its new keys/values with ``dynamic_update_slice`` (in place under a donated cache): a
decode step then reads every weight and cache entry once, with no per-layer copies.

Padding rule: a negative position marks a padding token. Padding tokens are never attended to; their
own outputs are finite garbage. Real tokens carry positions 0, 1, 2, ... which RoPE uses.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from rlvr_jax.model import attention as attention_lib
from rlvr_jax.model import layers as L
from rlvr_jax.model import lora
from rlvr_jax.model.attention import segment_ids_from_positions, self_attention
from rlvr_jax.model.cache import KVCache, SlotCache, grow_cache, kv_shapes, to_cache_layout
from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.precision import compute_params

Params = dict[str, Any]


def unembed_matrix(params: Params, config: ModelConfig) -> jax.Array:
  """The [D, V] unembedding in the compute dtype (``config.activation_dtype``): the transposed
  token embedding when tied, else ``lm_head``; ``params["unembed"]`` when ``with_unembed`` put
  it there."""
  if "unembed" in params:
    return params["unembed"]
  w = params["embed"].T if config.tie_word_embeddings else params["lm_head"]
  dtype = jnp.dtype(config.activation_dtype)
  return w if w.dtype == dtype else w.astype(dtype)


def with_unembed(params: Params, config: ModelConfig) -> Params:
  """``params`` plus ``"unembed"``: ``unembed_matrix`` materialised, for a loop that computes
  logits at every step (decoding). Only in low precision: XLA:CPU runs a bfloat16 product whose
  weight operand is the transposed [V, D] embedding as a float32 one, on a float32 copy of the
  embedding (per decode step, twice the bytes of the bfloat16 [D, V] matrix); a float32 product
  reads the transposed operand in place, so float32 params are returned as they are."""
  if jnp.dtype(config.activation_dtype) == jnp.float32 or "unembed" in params:
    return params
  return dict(params, unembed=unembed_matrix(params, config))


def logits_from_hidden(params: Params, hidden: jax.Array, config: ModelConfig) -> jax.Array:
  """Logits [..., V] float32 from final hidden states [..., D] (matmul accumulates in float32)."""
  w = unembed_matrix(params, config)
  if hidden.shape[-1] != w.shape[0]:
    raise ValueError(f"hidden {hidden.shape} does not match the unembedding {w.shape}")
  w = w.astype(hidden.dtype)
  return jnp.einsum("...d,dv->...v", hidden, w, preferred_element_type=jnp.float32)


def _norm(x: jax.Array, weight: jax.Array, config: ModelConfig) -> jax.Array:
  """RMSNorm of the float32 residual stream, rounded to the compute dtype for the matmuls.

  The residual stream stays float32 in every precision mode: the sum of L layers' updates is not
  rounded to bfloat16 at every layer, and (measured) it is faster on XLA:CPU, where the stacked
  bfloat16 layer inputs that the scan saves for the backward pass are written by a float32
  read-modify-write of the whole [L, B, S, D] buffer per layer (docs/benchmarks.md).
  """
  return L.rms_norm(x, weight, eps=config.rms_norm_eps).astype(config.activation_dtype)


def _qkv(lp: Params, x: jax.Array, cos, sin, config: ModelConfig):
  """Projections, optional bias (Qwen2) and q/k norm (Qwen3), then RoPE. x: [B, S, D]."""
  dt = x.dtype
  q = L.linear("bsd,dnh->bsnh", x, lp["wq"])
  k = L.linear("bsd,dkh->bskh", x, lp["wk"])
  v = L.linear("bsd,dkh->bskh", x, lp["wv"])
  if config.attention_bias:
    q = q + lp["bq"].astype(dt)
    k = k + lp["bk"].astype(dt)
    v = v + lp["bv"].astype(dt)
  if config.qk_norm:
    q = L.rms_norm(q, lp["q_norm"], eps=config.rms_norm_eps)
    k = L.rms_norm(k, lp["k_norm"], eps=config.rms_norm_eps)
  return L.apply_rope(q, cos, sin), L.apply_rope(k, cos, sin), v


def _block_tail(lp: Params, x: jax.Array, attn: jax.Array, config: ModelConfig) -> jax.Array:
  """Output projection + residual, then the MLP sub-block. attn: [B, S, N, H]."""
  B, S, N, H = attn.shape
  # One [N * H, D] matrix, not an "nh" contraction: with the latter XLA:CPU chose to transpose
  # wo (every layer, every decode step) to match the layout it picked for attn. L.linear casts
  # the weights to the activations' dtype.
  wo = lp["wo"].reshape(N * H, -1)
  h = x + L.linear("bsf,fd->bsd", attn.reshape(B, S, N * H), wo)
  y = _norm(h, lp["mlp_norm"], config)
  return h + L.swiglu_mlp(y, lp["w_gate"], lp["w_up"], lp["w_down"])


def layer_params(params: Params, config: ModelConfig) -> tuple[Params, ...]:
  """The L per-layer param dicts, from stacked (``param_specs``) or already unstacked params."""
  layers = params["layers"]
  if isinstance(layers, (tuple, list)):
    if len(layers) != config.num_layers:
      raise ValueError(f"params have {len(layers)} layers, config expects {config.num_layers}")
    return tuple(layers)
  return tuple(jax.tree.map(lambda a, i=i: a[i], layers) for i in range(config.num_layers))


def unstack_layers(params: Params, config: ModelConfig) -> Params:
  """``params`` with ``layers`` as a tuple of L per-layer dicts (the decoding layout).

  ``forward`` with a KV cache runs the layers as an unrolled loop over per-layer weights: a
  ``scan`` over stacked weights copies every layer's weights out of the stack at every decode step
  (it doubled the weight traffic of a step on XLA:CPU). ``generate`` unstacks once per call,
  before its decode loop; callers of ``prefill`` / ``decode_step`` in a host loop should pass
  unstacked params too (stacked ones are sliced inside every call). The copies cost one extra
  weight-sized buffer while they live.
  """
  return dict(params, layers=layer_params(params, config))


def _stacked(params: Params, config: ModelConfig) -> Params:
  layers = params["layers"]
  if isinstance(layers, (tuple, list)):
    layers = jax.tree.map(lambda *a: jnp.stack(a), *layer_params(params, config))
  return layers


def _check_inputs(params: Params, tokens, positions, config: ModelConfig, cache):
  if tokens.ndim != 2:
    raise ValueError(f"tokens must be [B, S], got shape {tokens.shape}")
  if positions.shape != tokens.shape:
    raise ValueError(f"positions {positions.shape} must have the shape of tokens {tokens.shape}")
  emb = params["embed"].shape
  if emb != (config.vocab_size, config.hidden_size):
    raise ValueError(
      f"params['embed'] is {emb}, config expects {(config.vocab_size, config.hidden_size)}"
    )
  if cache is not None:
    B, S = tokens.shape
    expected_k, expected_v = kv_shapes(config, B, cache.max_len)
    if (
      cache.num_layers != config.num_layers
      or any(k.shape != expected_k for k in cache.k)
      or any(v.shape != expected_v for v in cache.v)
    ):
      raise ValueError(
        f"cache (k {[k.shape for k in cache.k[:1]]}, v {[v.shape for v in cache.v[:1]]}, "
        f"{cache.num_layers} layers) does not match L={config.num_layers}, k {expected_k}, "
        f"v {expected_v}"
      )
    if S > cache.max_len:
      raise ValueError(f"{S} new tokens do not fit a cache of length {cache.max_len}")


def _differentiable(layer, config: ModelConfig):
  """The scanned layer function with what its backward pass keeps from the forward.

  ``config.remat``: nothing but the layer's input (``jax.checkpoint``: the whole layer runs again
  in the backward pass). Otherwise, in float32, every intermediate the backward pass reads. With
  bfloat16 activations and no remat, the matmul outputs only (``checkpoint_dots``: float32, as
  ``layers.lowp_einsum`` returns them); the elementwise work between them (norms, RoPE, SiLU,
  the bfloat16 casts) runs again. The scan stacks the kept values into [L, ...] buffers one layer
  at a time, and XLA:CPU (jaxlib 0.10.2) runs that ``dynamic_update_slice`` on a bfloat16 stack
  as a float32 update of the whole stack (converted there and back at every layer): keeping the
  bfloat16 intermediates made a bfloat16 SmolLM2 update 2.1x slower than full remat
  (docs/benchmarks.md, session 13); keeping the float32 matmul outputs makes it at least as fast
  as full remat. Values and gradients are the same in every mode (tests/test_model.py).

  LoRA hook: each layer's params first go through ``lora.merge_attached`` (a no-op, the same dict,
  for plain params): adapters attached with ``lora.attach`` and int8 weights are merged and
  dequantized one layer at a time, inside the scan (and, with remat, again in the backward pass),
  so neither a merged copy of every layer nor its full-size cotangent is ever materialised.
  """
  dtype = config.activation_dtype

  def merged(x, lp):
    return layer(x, lora.merge_attached(lp, dtype))

  if config.remat:
    return jax.checkpoint(merged)
  if config.activation_dtype != "float32":
    return jax.checkpoint(merged, policy=jax.checkpoint_policies.checkpoint_dots)
  return merged


def _run_layers(params, x, cos, sin, segments, config: ModelConfig, collect: bool, keep_kv=False):
  """Scans the stacked layers (no cache). ``segments`` = (segment_ids [B, S], max_segments):
  causal self-attention within segments (``attention.self_attention``, by
  ``config.attention``).

  Returns (x, per-layer inputs [L, B, S, D] or None, (keys, values) [L, B, S, K, H] or None).
  """
  K = config.num_kv_heads
  segment_ids, max_segments = segments

  def layer(x, lp):
    q, k, v = _qkv(lp, _norm(x, lp["attn_norm"], config), cos, sin, config)
    attn = self_attention(
      q, k, v, segment_ids, num_kv_heads=K, implementation=config.attention,
      max_segments=max_segments,
    )  # fmt: skip
    kept = (x if collect else None, (k, v) if keep_kv else None)
    return _block_tail(lp, x, attn, config), jax.tree.map(_to_bits, kept)

  x, kept = jax.lax.scan(_differentiable(layer, config), x, _stacked(params, config))
  seen, kv = jax.tree.map(_from_bits, kept)
  return x, seen, kv


def _to_bits(x: jax.Array) -> jax.Array:
  """A bfloat16 array as its uint16 bit patterns (else as it is), for a scan to stack: XLA:CPU
  stacks bfloat16 scan outputs with a float32 update of the whole [L, ...] stack per layer (see
  ``_write_slots``); stacking the bits is an in-place integer update."""
  return jax.lax.bitcast_convert_type(x, jnp.uint16) if x.dtype == jnp.bfloat16 else x


def _from_bits(stacked: jax.Array) -> jax.Array:
  """``_to_bits`` undone (the layers' outputs are floats: uint16 can only be bits)."""
  return (
    jax.lax.bitcast_convert_type(stacked, jnp.bfloat16) if stacked.dtype == jnp.uint16 else stacked
  )


def _cache_from_prompt(kv, stored, max_len: int, dtype) -> KVCache:
  """A cache holding the prompt's keys / values ([L, B, S, K, H]) and stored positions [B, S]
  (-1 on padding) at slots [0, S), index S."""
  S = stored.shape[1]
  if S > max_len:
    raise ValueError(f"{S} prompt tokens do not fit a cache of length {max_len}")
  layers = [to_cache_layout(k, v, dtype) for k, v in zip(*kv, strict=True)]
  cache = KVCache(
    k=tuple(k for k, _ in layers),
    v=tuple(v for _, v in layers),
    positions=stored,
    index=jnp.asarray(S, jnp.int32),
  )
  return grow_cache(cache, max_len)


def _write_slots(buffer: jax.Array, new: jax.Array, starts) -> jax.Array:
  """``dynamic_update_slice(buffer, new, starts)``, on the bits for a 16-bit float buffer.

  XLA:CPU has no bfloat16 dynamic-update-slice: its float normalisation rewrites one into a
  float32 update between two conversions of the whole buffer, so every decode step read and wrote
  every layer's cache in full (measured on SmolLM2). The same update of the uint16 bit patterns
  is an integer one, done in place.
  """
  if jnp.dtype(buffer.dtype).itemsize != 2 or not jnp.issubdtype(buffer.dtype, jnp.floating):
    return jax.lax.dynamic_update_slice(buffer, new.astype(buffer.dtype), starts)
  bits = jax.lax.dynamic_update_slice(
    jax.lax.bitcast_convert_type(buffer, jnp.uint16),
    jax.lax.bitcast_convert_type(new.astype(buffer.dtype), jnp.uint16),
    starts,
  )
  return jax.lax.bitcast_convert_type(bits, buffer.dtype)


def _run_cached_layers(
  params, x, cos, sin, mask, config: ModelConfig, cache: KVCache, collect, write=None
):
  """The layers as an unrolled loop over per-layer weights and cache buffers.

  Each layer writes its S new keys / values at slot ``cache.index`` (in place under a donated
  cache), or with ``write(buffer, new)`` when given, and attends over its whole buffer. Returns
  (x, new k tuple, new v tuple, inputs or None).
  """
  K = config.num_kv_heads
  layers = params["layers"]
  if lora.ATTACHED in (layers[0] if isinstance(layers, (tuple, list)) else layers):
    # (The merge per decode step would redo it for every token: merge once, ``lora.merge``.)
    raise ValueError("cached decoding of attached LoRA adapters: sample with lora.merge's tree")
  zero = jnp.zeros((), jnp.int32)
  index = cache.index
  # Materialised once: left to fusion, XLA:CPU recomputed the cos / sin of the positions inside
  # every layer's RoPE fusions (60 transcendental passes per decode step).
  cos, sin = jax.lax.optimization_barrier((cos, sin))
  new_k, new_v, seen = [], [], []
  for lp, ck, cv in zip(layer_params(params, config), cache.k, cache.v, strict=True):
    seen.append(x)
    q, k, v = _qkv(lp, _norm(x, lp["attn_norm"], config), cos, sin, config)
    # Only the S new entries are transposed into the buffer layouts, never the cache.
    k, v = to_cache_layout(k, v, ck.dtype)
    if write is None:
      ck = _write_slots(ck, k, (zero, zero, index, zero))
      cv = _write_slots(cv, v, (zero, zero, index, zero))
    else:
      ck, cv = write(ck, k), write(cv, v)
    attn = L.cached_attention(q, ck.astype(q.dtype), cv.astype(q.dtype), mask, num_kv_heads=K)
    x = _block_tail(lp, x, attn, config)
    new_k.append(ck)
    new_v.append(cv)
  return x, tuple(new_k), tuple(new_v), (jnp.stack(seen) if collect else None)


def _scatter_columns(buffer: jax.Array, new: jax.Array, columns: jax.Array) -> jax.Array:
  """``buffer`` [N, K, T, H] with ``new`` [N, K, H] written at column ``columns[n]`` of row n (a
  scatter, in place in a loop carry): ``_scatter_token_columns`` of one token per row."""
  return _scatter_token_columns(buffer, new[:, :, None, :], columns[:, None])


def _scatter_token_columns(buffer: jax.Array, new: jax.Array, columns: jax.Array) -> jax.Array:
  """``buffer`` [N, K, L, H] with ``new`` [N, K, W, H] written token by token at the columns
  ``columns`` [N, W] of each row; a column outside [0, L) drops its token (on the bits of a
  16-bit float buffer, as ``_write_slots``)."""
  rows = jnp.arange(buffer.shape[0])[:, None]
  new = new.astype(buffer.dtype).transpose(0, 2, 1, 3)  # [N, W, K, H]: the indexed result's layout
  if jnp.dtype(buffer.dtype).itemsize != 2 or not jnp.issubdtype(buffer.dtype, jnp.floating):
    return buffer.at[rows, :, columns, :].set(new, mode="drop")
  bits = jax.lax.bitcast_convert_type(buffer, jnp.uint16)
  new = jax.lax.bitcast_convert_type(new, jnp.uint16)
  out = bits.at[rows, :, columns, :].set(new, mode="drop")
  return jax.lax.bitcast_convert_type(out, buffer.dtype)


@functools.partial(jax.jit, static_argnames=("config",))
def forward_at_columns(
  params: Params,
  tokens: jax.Array,
  positions: jax.Array,
  columns: jax.Array,
  cache: KVCache,
  *,
  config: ModelConfig,
) -> tuple[jax.Array, KVCache]:
  """``forward`` with a cache whose rows fill at their own pace (no shared write index).

  Row n writes its token j at column ``columns[n, j]`` of its buffers (a column outside
  [0, S_max) writes nothing: padding) and each token attends to the filled columns of its row
  whose position is at most its own. Rows are compact streams (one token per position, in
  order), so the position order is the causal order and a row never holds holes; the multi-turn
  slot sampler (``sampling.multiturn_slots``) keeps one episode per row this way. A token with a
  negative position is padding (its output is garbage and nothing attends to it).

  Args:
    params: ``unstack_layers``-ed params (the decode layout).
    tokens, positions, columns: [N, W] int32.
    cache: a ``KVCache`` of N rows; its ``index`` is not used and comes back unchanged.
  Returns:
    (hidden [N, W, D] after the final norm, the updated cache).
  """
  _check_inputs(params, tokens, positions, config, cache)
  if columns.shape != tokens.shape:
    raise ValueError(f"forward_at_columns: columns {columns.shape} != tokens {tokens.shape}")
  params = compute_params(params, config)
  positions = positions.astype(jnp.int32)
  x = _embed(params, tokens)
  cos, sin = L.rope_cos_sin(positions, L.rope_inv_freq(config))
  stored = jnp.where(positions >= 0, positions, -1)
  rows = jnp.arange(tokens.shape[0])[:, None]
  cache_positions = cache.positions.at[rows, columns].set(stored, mode="drop")
  key_pos = cache_positions[:, None, :]
  mask = (key_pos >= 0) & (key_pos <= positions[:, :, None])
  write = functools.partial(_scatter_token_columns, columns=columns.astype(jnp.int32))
  x, ck, cv, _ = _run_cached_layers(params, x, cos, sin, mask, config, cache, False, write)
  out = _norm(x, params["final_norm"], config)
  return out, KVCache(k=ck, v=cv, positions=cache_positions, index=cache.index)


def decode_slots(
  params: Params,
  tokens: jax.Array,
  positions: jax.Array,
  columns: jax.Array,
  slots: SlotCache,
  *,
  config: ModelConfig,
) -> tuple[jax.Array, SlotCache]:
  """One decode step of N slots, each over its own prompt and completion buffers.

  Slot n feeds ``tokens[n]`` at position ``positions[n]`` (negative: a hole, nothing attends to
  it), writes its key / value at column ``columns[n]`` of its completion buffers, and attends to
  the real tokens of its prompt and the filled columns of its completion
  (``layers.prompt_and_slot_attention``). Every column a slot has filled precedes the fed token,
  so no causal mask is needed beyond the positions.

  Args:
    params: ``unstack_layers``-ed params in the compute dtype (``compute_params``), as for the
      decode loop of ``sampling.generate``.
    tokens, positions, columns: [N] int32.
    slots: the ``SlotCache`` of the N slots.
  Returns:
    (hidden [N, D] after the final norm, the updated ``SlotCache``).
  """
  N = tokens.shape[0]
  if positions.shape != (N,) or columns.shape != (N,):
    raise ValueError(
      f"decode_slots: tokens {tokens.shape}, positions {positions.shape}, columns "
      f"{columns.shape} must all be [N]"
    )
  if slots.positions.shape[0] != N:
    raise ValueError(f"decode_slots: {N} tokens for a slot cache of {slots.positions.shape[0]}")
  K = config.num_kv_heads
  positions = positions.astype(jnp.int32)
  x = _embed(params, tokens[:, None])
  cos, sin = L.rope_cos_sin(positions[:, None], L.rope_inv_freq(config))
  cos, sin = jax.lax.optimization_barrier((cos, sin))
  rows = jnp.arange(N)
  slot_positions = slots.positions.at[rows, columns].set(jnp.where(positions >= 0, positions, -1))
  mask_c = slot_positions >= 0
  mask_p = slots.prompt_positions >= 0
  new_k, new_v = [], []
  caches = (slots.prompt_k, slots.prompt_v, slots.k, slots.v)
  for lp, pk, pv, ck, cv in zip(layer_params(params, config), *caches, strict=True):
    q, k, v = _qkv(lp, _norm(x, lp["attn_norm"], config), cos, sin, config)
    ck = _scatter_columns(ck, k[:, 0].astype(ck.dtype), columns)
    cv = _scatter_columns(cv, v[:, 0].astype(cv.dtype), columns)
    dt = q.dtype
    attn = attention_lib.slot_decode_attention(
      q[:, 0], pk.astype(dt), pv.astype(dt), mask_p, ck.astype(dt), cv.astype(dt), mask_c,
      num_kv_heads=K, implementation=config.decode_attention,
    )  # fmt: skip
    x = _block_tail(lp, x, attn[:, None], config)
    new_k.append(ck)
    new_v.append(cv)
  out = _norm(x, params["final_norm"], config)[:, 0]
  return out, dataclasses.replace(slots, k=tuple(new_k), v=tuple(new_v), positions=slot_positions)


def _embed(params: Params, tokens: jax.Array) -> jax.Array:
  """The float32 residual stream [B, S, D] of token ids [B, S] (out-of-range ids clamp)."""
  return jnp.take(params["embed"], tokens.astype(jnp.int32), axis=0, mode="clip").astype(
    jnp.float32
  )


def _without_layers(params: Params) -> Params:
  return {k: v for k, v in params.items() if k != "layers"}


def _forward(
  params, tokens, positions, config: ModelConfig, cache, collect: bool, fill=None, segments=None
):
  """The decoder. ``fill`` = (max_len, dtype): run without a cache and return a fresh one holding
  the S tokens' keys / values (a prefill from an empty cache, by the ``scan`` path).
  ``segments`` = (segment_ids [B, S], max_segments) for packed rows (no cache); by default each
  row is one segment (its tokens with position >= 0). Runs on
  ``compute_params(params)`` (a no-op unless float32 params meet a bfloat16 compute dtype); on
  the scan path the layers' weights are cast inside the scan body, by ``L.linear``."""
  _check_inputs(params, tokens, positions, config, cache)
  if cache is None:
    # The scan path keeps the layers' weights as they are: ``L.linear`` casts each layer's inside
    # the scan body. Cast here, the stacked bfloat16 copy and its stacked gradient cost a
    # read-modify-write of the whole [L, ...] buffer per layer on XLA:CPU, which performs a
    # bfloat16 dynamic-update-slice on a float32 copy (docs/benchmarks.md).
    params = dict(compute_params(_without_layers(params), config), layers=params["layers"])
  else:
    params = compute_params(params, config)
  tokens = tokens.astype(jnp.int32)
  positions = positions.astype(jnp.int32)
  B, S = tokens.shape
  x = _embed(params, tokens)
  cos, sin = L.rope_cos_sin(positions, L.rope_inv_freq(config))
  valid = positions >= 0
  stored = jnp.where(valid, positions, -1)  # the positions a cache keeps: -1 on padding
  new_cache = None
  if cache is None:
    if segments is None:
      segments = (segment_ids_from_positions(positions), 1)
    x, seen, kv = _run_layers(params, x, cos, sin, segments, config, collect, fill is not None)
    if fill is not None:
      new_cache = _cache_from_prompt(kv, stored, *fill)
  else:
    index = cache.index.astype(jnp.int32)
    cache_positions = jax.lax.dynamic_update_slice(cache.positions, stored, (0, index))
    slots = jnp.arange(cache.max_len, dtype=jnp.int32)
    query_slots = index + jnp.arange(S, dtype=jnp.int32)
    mask = (cache_positions[:, None, :] >= 0) & (slots[None, None, :] <= query_slots[None, :, None])
    cache = KVCache(k=cache.k, v=cache.v, positions=cache_positions, index=index)
    x, ck, cv, seen = _run_cached_layers(params, x, cos, sin, mask, config, cache, collect)
    new_cache = KVCache(k=ck, v=cv, positions=cache_positions, index=index + S)
  out = _norm(x, params["final_norm"], config)
  return out, new_cache, seen


@functools.partial(jax.jit, static_argnames=("config", "return_logits", "max_segments"))
def forward(
  params: Params,
  tokens: jax.Array,
  positions: jax.Array,
  *,
  config: ModelConfig,
  cache: KVCache | None = None,
  return_logits: bool = False,
  segment_ids: jax.Array | None = None,
  max_segments: int = 1,
) -> tuple[jax.Array, KVCache | None]:
  """Runs the decoder on S new tokens per row.

  Jitted (``config`` and ``return_logits`` static); inside another ``jax.jit`` it is inlined.
  Without a cache: causal self-attention over the S tokens. With a cache: the S new tokens are
  written at slots [index, index + S) and each attends to every filled slot (position >= 0) at or
  before its own slot; the returned cache has ``index + S``.

  Args:
    params: the params pytree (``param_specs`` layout).
    tokens: [B, S] int token ids.
    positions: [B, S] int positions; negative marks padding (never attended to).
    config: the model config (static under jit).
    cache: optional ``KVCache`` with batch B and S_max >= index + S (not checked at run time:
      writes past the end are clamped by ``dynamic_update_slice``).
    return_logits: return logits [B, S, V] float32 instead of the hidden states.
    segment_ids: optional [B, S] int32 (no cache only): packed rows, several sequences per row
      numbered 1, 2, ... in order, 0 on padding; attention never crosses a segment and
      ``positions`` restart in each. Default: each row one sequence (``positions >= 0``).
    max_segments: the most segments a row holds (static; used by the cuDNN kernel).
  Returns:
    (out, cache): out is [B, S, D] final hidden states (after the final RMSNorm) in the compute
    dtype, or [B, S, V] float32 logits; cache is the updated cache (None when none was given).
  """
  if segment_ids is not None and cache is not None:
    # (Their shape is checked by ``attention.self_attention``.)
    raise ValueError("forward: segment_ids (packed rows) are for the no-cache forward only")
  segments = None if segment_ids is None else (segment_ids.astype(jnp.int32), max_segments)
  out, new_cache, _ = _forward(params, tokens, positions, config, cache, False, segments=segments)
  if return_logits:
    out = logits_from_hidden(params, out, config)
  return out, new_cache


def _shared_prompt_layers(params, xp, xc, rope_p, rope_c, masks, config: ModelConfig, G: int):
  """Scans the stacked layers over the two streams of ``forward_shared_prompt``: the P prompts
  [P, Sp, D] and the B = P * G completions [B, T, D]. Completion queries attend to their group's
  prompt keys / values (repeated G times; the transpose of the repeat sums the G cotangents) and,
  causally, to their own row's completion keys."""
  K = config.num_kv_heads
  prompt_mask, completion_mask = masks

  def layer(carry, lp):
    xp, xc = carry
    qp, kp, vp = _qkv(lp, _norm(xp, lp["attn_norm"], config), *rope_p, config)
    qc, kc, vc = _qkv(lp, _norm(xc, lp["attn_norm"], config), *rope_c, config)
    xp = _block_tail(lp, xp, L.attention(qp, kp, vp, prompt_mask, num_kv_heads=K), config)
    k = jnp.concatenate([jnp.repeat(kp, G, axis=0), kc], axis=1)
    v = jnp.concatenate([jnp.repeat(vp, G, axis=0), vc], axis=1)
    xc = _block_tail(lp, xc, L.attention(qc, k, v, completion_mask, num_kv_heads=K), config)
    return (xp, xc), None

  (xp, xc), _ = jax.lax.scan(_differentiable(layer, config), (xp, xc), _stacked(params, config))
  return xp, xc


@functools.partial(jax.jit, static_argnames=("config",))
def forward_shared_prompt(
  params: Params,
  prompt_tokens: jax.Array,
  prompt_positions: jax.Array,
  completion_tokens: jax.Array,
  completion_positions: jax.Array,
  *,
  config: ModelConfig,
) -> tuple[jax.Array, jax.Array]:
  """``forward`` of B = P * G rows whose first Sp tokens are G copies of each of P prompts.

  Row b is prompt b // G followed by completion b: the same function of the params as ``forward``
  on the concatenated [B, Sp + T] rows (causal attention, the padding rule), but each prompt runs
  through the layers once instead of G times: a GRPO group's G samples share their prompt, so the
  update processes P * Sp + B * T tokens instead of B * (Sp + T). Gradients are those of the
  concatenated forward (each prompt token receives the sum over its group).

  Args:
    prompt_tokens, prompt_positions: [P, Sp] (negative positions mark padding).
    completion_tokens, completion_positions: [B, T], B a multiple of P.
  Returns:
    (prompt hidden [P, Sp, D], completion hidden [B, T, D]): final hidden states after the final
    RMSNorm, in the compute dtype.
  """
  P, Sp = prompt_tokens.shape
  B, T = completion_tokens.shape
  if prompt_positions.shape != (P, Sp) or completion_positions.shape != (B, T) or B % P:
    raise ValueError(
      f"prompts {prompt_tokens.shape} / {prompt_positions.shape} and completions "
      f"{completion_tokens.shape} / {completion_positions.shape}: expected [P, Sp] twice and "
      "[B, T] twice with B a multiple of P"
    )
  _check_inputs(params, prompt_tokens, prompt_positions, config, None)
  params = dict(compute_params(_without_layers(params), config), layers=params["layers"])
  inv_freq = L.rope_inv_freq(config)
  pp, pc = prompt_positions.astype(jnp.int32), completion_positions.astype(jnp.int32)
  prompt_valid = jnp.repeat(pp >= 0, B // P, axis=0)  # [B, Sp]
  completion_valid = pc >= 0
  causal_p = jnp.tril(jnp.ones((Sp, Sp), bool))
  causal_c = jnp.tril(jnp.ones((T, T), bool))
  masks = (
    causal_p[None] & (pp >= 0)[:, None, :],
    jnp.concatenate(
      [
        jnp.broadcast_to(prompt_valid[:, None, :], (B, T, Sp)),
        causal_c[None] & completion_valid[:, None, :],
      ],
      axis=2,
    ),
  )
  xp, xc = _shared_prompt_layers(
    params,
    _embed(params, prompt_tokens),
    _embed(params, completion_tokens),
    L.rope_cos_sin(pp, inv_freq),
    L.rope_cos_sin(pc, inv_freq),
    masks,
    config,
    B // P,
  )
  norm = lambda x: _norm(x, params["final_norm"], config)
  return norm(xp), norm(xc)


@functools.partial(jax.jit, static_argnames=("config", "max_len", "cache_dtype"))
def forward_into_new_cache(
  params: Params,
  tokens: jax.Array,
  positions: jax.Array,
  *,
  config: ModelConfig,
  max_len: int,
  cache_dtype: str | None = None,
) -> tuple[jax.Array, KVCache]:
  """``forward`` of S tokens with an empty cache of length ``max_len``, by the no-cache path.

  Same result as ``forward(params, tokens, positions, config=config, cache=init_cache(config, B,
  max_len))`` (to float rounding), but the layers run as the stacked ``scan`` and attention spans
  the S tokens only, not the ``max_len`` slots; the keys / values are then laid into a fresh cache.
  This is the prefill: the decode steps that follow use ``forward`` with the cache.

  Returns:
    (hidden [B, S, D] after the final norm, cache with slots [0, S) filled and index S).
  """
  dtype = jnp.dtype(config.activation_dtype if cache_dtype is None else cache_dtype)
  out, cache, _ = _forward(params, tokens, positions, config, None, False, (max_len, dtype))
  return out, cache


@functools.partial(jax.jit, static_argnames=("config",))
def hidden_states_per_layer(
  params: Params, tokens: jax.Array, positions: jax.Array, *, config: ModelConfig
) -> tuple[jax.Array, jax.Array]:
  """Per-layer residual-stream inputs, for parity tests and inspection.

  Returns:
    (layer_inputs, final): layer_inputs [L, B, S, D] is the input of each decoder layer (entry 0
    is the token embedding); final [B, S, D] is the output after the final RMSNorm. These match
    ``transformers``' ``output_hidden_states`` entries 0..L-1 and L.
  """
  out, _, seen = _forward(params, tokens, positions, config, None, collect=True)
  return seen, out
