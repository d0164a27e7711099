"""The decoder forward pass (Llama / Qwen2 / Qwen3) as a pure function over the params pytree.

Pre-norm residual blocks (arXiv 2302.13971):
  h = x + Attn(RMSNorm(x)),   y = h + SwiGLU(RMSNorm(h)),
and a final RMSNorm. The L layers are stacked and run by one ``lax.scan`` (compile time independent
of depth). With a KV cache the full cache is carried through the scan and each layer writes its new
keys/values with ``dynamic_update_slice`` (in place under a donated cache).

Padding rule: a negative position marks a padding token. Padding tokens are never attended to; their
own outputs are finite garbage. Real tokens carry positions 0, 1, 2, ... which RoPE uses.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from rlvr_jax.model import layers as L
from rlvr_jax.model.cache import KVCache
from rlvr_jax.model.config import ModelConfig

Params = dict[str, Any]


def unembed_matrix(params: Params, config: ModelConfig) -> jax.Array:
  """The [D, V] unembedding: the transposed token embedding when tied, else ``lm_head``."""
  if config.tie_word_embeddings:
    return params["embed"].T
  return params["lm_head"]


def logits_from_hidden(params: Params, hidden: jax.Array, config: ModelConfig) -> jax.Array:
  """Logits [..., V] float32 from final hidden states [..., D] (matmul accumulates in float32)."""
  w = unembed_matrix(params, config)
  if hidden.shape[-1] != w.shape[0]:
    raise ValueError(f"hidden {hidden.shape} does not match the unembedding {w.shape}")
  w = w.astype(hidden.dtype)
  return jnp.einsum("...d,dv->...v", hidden, w, preferred_element_type=jnp.float32)


def _qkv(lp: Params, x: jax.Array, cos, sin, config: ModelConfig):
  """Projections, optional bias (Qwen2) and q/k norm (Qwen3), then RoPE. x: [B, S, D]."""
  dt = x.dtype
  q = jnp.einsum("bsd,dnh->bsnh", x, lp["wq"].astype(dt))
  k = jnp.einsum("bsd,dkh->bskh", x, lp["wk"].astype(dt))
  v = jnp.einsum("bsd,dkh->bskh", x, lp["wv"].astype(dt))
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
  dt = x.dtype
  h = x + jnp.einsum("bsnh,nhd->bsd", attn, lp["wo"].astype(dt))
  y = L.rms_norm(h, lp["mlp_norm"], eps=config.rms_norm_eps)
  return h + L.swiglu_mlp(
    y, lp["w_gate"].astype(dt), lp["w_up"].astype(dt), lp["w_down"].astype(dt)
  )


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
    if cache.k.shape[:2] != (config.num_layers, B):
      raise ValueError(f"cache k {cache.k.shape} does not match L={config.num_layers}, B={B}")
    if S > cache.max_len:
      raise ValueError(f"{S} new tokens do not fit a cache of length {cache.max_len}")


def _run_layers(params, x, cos, sin, mask, config: ModelConfig, cache, collect: bool):
  """Scans the stacked layers. Returns (x, new_k, new_v, per-layer inputs or None)."""
  eps = config.rms_norm_eps
  K = config.num_kv_heads

  if cache is None:

    def layer(x, lp):
      q, k, v = _qkv(lp, L.rms_norm(x, lp["attn_norm"], eps=eps), cos, sin, config)
      attn = L.attention(q, k, v, mask, num_kv_heads=K)
      return _block_tail(lp, x, attn, config), (x if collect else None)

    if config.remat:
      layer = jax.checkpoint(layer)
    x, seen = jax.lax.scan(layer, x, params["layers"])
    return x, None, None, seen

  index = cache.index
  ck0, cv0 = cache.k.astype(x.dtype), cache.v.astype(x.dtype)

  def cached_layer(carry, inputs):
    x, ck, cv = carry
    lp, li = inputs
    q, k, v = _qkv(lp, L.rms_norm(x, lp["attn_norm"], eps=eps), cos, sin, config)
    zero = jnp.zeros((), jnp.int32)
    # The cache is head-major [L, B, K, S_max, H]: the S new entries [B, S, K, H] are transposed
    # (small), the cache itself never is.
    k, v = (jnp.swapaxes(a, 1, 2)[None] for a in (k, v))
    ck = jax.lax.dynamic_update_slice(ck, k, (li, zero, zero, index, zero))
    cv = jax.lax.dynamic_update_slice(cv, v, (li, zero, zero, index, zero))
    k_all = jax.lax.dynamic_index_in_dim(ck, li, axis=0, keepdims=False)
    v_all = jax.lax.dynamic_index_in_dim(cv, li, axis=0, keepdims=False)
    attn = L.attention(q, k_all, v_all, mask, num_kv_heads=K, kv_head_major=True)
    return (_block_tail(lp, x, attn, config), ck, cv), (x if collect else None)

  if config.remat:
    cached_layer = jax.checkpoint(cached_layer)
  layer_ids = jnp.arange(config.num_layers, dtype=jnp.int32)
  (x, ck, cv), seen = jax.lax.scan(cached_layer, (x, ck0, cv0), (params["layers"], layer_ids))
  return x, ck, cv, seen


def _forward(params, tokens, positions, config: ModelConfig, cache, collect: bool):
  _check_inputs(params, tokens, positions, config, cache)
  dtype = jnp.dtype(config.dtype)
  tokens = tokens.astype(jnp.int32)
  positions = positions.astype(jnp.int32)
  B, S = tokens.shape
  x = jnp.take(params["embed"], tokens, axis=0, mode="clip").astype(dtype)
  cos, sin = L.rope_cos_sin(positions, L.rope_inv_freq(config))
  valid = positions >= 0
  if cache is None:
    causal = jnp.tril(jnp.ones((S, S), bool))
    mask = causal[None, :, :] & valid[:, None, :]
    x, _, _, seen = _run_layers(params, x, cos, sin, mask, config, None, collect)
    new_cache = None
  else:
    index = cache.index.astype(jnp.int32)
    stored = jnp.where(valid, positions, -1)
    cache_positions = jax.lax.dynamic_update_slice(cache.positions, stored, (0, index))
    slots = jnp.arange(cache.max_len, dtype=jnp.int32)
    query_slots = index + jnp.arange(S, dtype=jnp.int32)
    mask = (cache_positions[:, None, :] >= 0) & (slots[None, None, :] <= query_slots[None, :, None])
    cache = KVCache(k=cache.k, v=cache.v, positions=cache_positions, index=index)
    x, ck, cv, seen = _run_layers(params, x, cos, sin, mask, config, cache, collect)
    new_cache = KVCache(
      k=ck.astype(cache.k.dtype),
      v=cv.astype(cache.v.dtype),
      positions=cache_positions,
      index=index + S,
    )
  out = L.rms_norm(x, params["final_norm"], eps=config.rms_norm_eps)
  return out, new_cache, seen


@functools.partial(jax.jit, static_argnames=("config", "return_logits"))
def forward(
  params: Params,
  tokens: jax.Array,
  positions: jax.Array,
  *,
  config: ModelConfig,
  cache: KVCache | None = None,
  return_logits: bool = False,
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
  Returns:
    (out, cache): out is [B, S, D] final hidden states (after the final RMSNorm) in the compute
    dtype, or [B, S, V] float32 logits; cache is the updated cache (None when none was given).
  """
  out, new_cache, _ = _forward(params, tokens, positions, config, cache, collect=False)
  if return_logits:
    out = logits_from_hidden(params, out, config)
  return out, new_cache


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
