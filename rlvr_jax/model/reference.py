"""A float64 NumPy decoder: the exact-arithmetic stand-in that float32 paths are measured against.

Independent of ``decoder.py`` (plain NumPy, one unpadded sequence at a time, no cache), it gives the
truth for the sampler / trainer log-prob parity on a real model: the sampler's decode path and the
trainer's full forward sum the same products in different orders, so neither is "the" float32
answer; each one's distance to this float64 evaluation says whether it only rounds or is wrong
(docs/design.md, "Sampling"). Llama / Qwen2 / Qwen3 layouts (biases, q/k norm, Llama-3 RoPE
scaling via ``layers.rope_inv_freq``). Cost: about 2 * (non-embedding params) * tokens float64
flops per sequence, ~6 s of CPU for 108 tokens of SmolLM2-135M; layers are cast one at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlvr_jax.model.config import ModelConfig
from rlvr_jax.model.layers import rope_inv_freq


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
  """x [S, heads, H] at positions 0..S-1, rotate-half layout."""
  angles = np.arange(x.shape[0])[:, None] * inv_freq.astype(np.float64)[None, :]
  angles = np.concatenate([angles, angles], axis=-1)[:, None, :]
  half = x.shape[-1] // 2
  rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return x * np.cos(angles) + rotated * np.sin(angles)


def _layer(lp: dict, x: np.ndarray, config: ModelConfig, inv_freq: np.ndarray) -> np.ndarray:
  """One pre-norm block on x [S, D] (causal attention over the S tokens)."""
  S, D = x.shape
  N, K, H, eps = config.num_heads, config.num_kv_heads, config.head_dim, config.rms_norm_eps
  y = _rms(x, lp["attn_norm"], eps)
  q = (y @ lp["wq"].reshape(D, N * H)).reshape(S, N, H)
  k = (y @ lp["wk"].reshape(D, K * H)).reshape(S, K, H)
  v = (y @ lp["wv"].reshape(D, K * H)).reshape(S, K, H)
  if config.attention_bias:
    q, k, v = q + lp["bq"], k + lp["bk"], v + lp["bv"]
  if config.qk_norm:
    q, k = _rms(q, lp["q_norm"], eps), _rms(k, lp["k_norm"], eps)
  q, k = _rope(q, inv_freq), _rope(k, inv_freq)
  k, v = np.repeat(k, N // K, axis=1), np.repeat(v, N // K, axis=1)
  scores = np.einsum("snh,tnh->nst", q, k, optimize=True) / np.sqrt(H)
  scores = np.where(np.tril(np.ones((S, S), bool)), scores, -np.inf)
  probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
  probs /= probs.sum(axis=-1, keepdims=True)
  attn = np.einsum("nst,tnh->snh", probs, v, optimize=True).reshape(S, N * H)
  x = x + attn @ lp["wo"].reshape(N * H, D)
  y = _rms(x, lp["mlp_norm"], eps)
  gate, up = y @ lp["w_gate"], y @ lp["w_up"]
  return x + (gate / (1 + np.exp(-gate)) * up) @ lp["w_down"]


def token_logprobs_f64(
  params, config: ModelConfig, sequences: Sequence[np.ndarray], starts: Sequence[int]
) -> list[np.ndarray]:
  """float64 log p(x_s | x_<s) for s = starts[i] .. len - 1 of each unpadded sequence.

  Args:
    params: the params pytree (stacked ``param_specs`` layout), any float dtype.
    config: the model config.
    sequences: token ids [S_i] per sequence, at positions 0..S_i - 1 (no padding).
    starts: index of the first scored token of each sequence (e.g. the prompt length), >= 1.
  Returns:
    one float64 array [S_i - starts[i]] per sequence.
  """
  if len(sequences) != len(starts):
    raise ValueError(f"{len(sequences)} sequences but {len(starts)} starts")
  for i, (ids, start) in enumerate(zip(sequences, starts, strict=True)):
    if not 1 <= start <= len(ids):
      raise ValueError(f"sequence {i}: start {start} outside [1, {len(ids)}]")
  inv_freq = rope_inv_freq(config)
  embed = np.asarray(params["embed"], np.float64)
  xs = [embed[np.asarray(ids)] for ids in sequences]
  layers = params["layers"]
  for layer in range(config.num_layers):
    if isinstance(layers, (tuple, list)):  # ``unstack_layers`` layout
      lp = {k: np.asarray(v, np.float64) for k, v in layers[layer].items()}
    else:
      lp = {k: np.asarray(v[layer], np.float64) for k, v in layers.items()}
    xs = [_layer(lp, x, config, inv_freq) for x in xs]
  unembed = embed.T if config.tie_word_embeddings else np.asarray(params["lm_head"], np.float64)
  final_norm = np.asarray(params["final_norm"], np.float64)
  out = []
  for x, ids, start in zip(xs, sequences, starts, strict=True):
    z = _rms(x[start - 1 : -1], final_norm, config.rms_norm_eps) @ unembed
    top = z.max(axis=-1)
    lse = top + np.log(np.exp(z - top[:, None]).sum(axis=-1))
    out.append(z[np.arange(len(z)), np.asarray(ids)[start:]] - lse)
  return out
