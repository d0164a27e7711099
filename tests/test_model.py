"""Decoder forward: KV-cache decoding, padding invariance, masks, config and shape errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.model import (
  ModelConfig,
  forward,
  init_cache,
  init_params,
  logits_from_hidden,
  unembed_matrix,
)
from rlvr_jax.model.config import UnsupportedModelError
from rlvr_jax.model.layers import rope_inv_freq

CONFIGS = {
  "llama": ModelConfig.tiny(),
  "qwen2": ModelConfig.tiny(attention_bias=True, family="qwen2", tie_word_embeddings=True),
  "qwen3": ModelConfig.tiny(qk_norm=True, family="qwen3"),
}


def _params(config, seed=0):
  params = init_params(config, jax.random.key(seed))
  if config.attention_bias:  # non-zero biases so that they are exercised
    keys = jax.random.split(jax.random.key(seed + 1), 3)
    for k, name in zip(keys, ("bq", "bk", "bv"), strict=True):
      params["layers"][name] = 0.1 * jax.random.normal(k, params["layers"][name].shape)
  return params


def _tokens(config, B, S, seed=0):
  rng = np.random.default_rng(seed)
  return jnp.asarray(rng.integers(3, config.vocab_size, size=(B, S)), jnp.int32)


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_kv_cache_token_by_token_equals_full_forward(family):
  config = CONFIGS[family]
  params = _params(config)
  B, S = 2, 7
  tokens = _tokens(config, B, S)
  positions = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S))
  full, none = forward(params, tokens, positions, config=config, return_logits=True)
  assert none is None and full.shape == (B, S, config.vocab_size) and full.dtype == jnp.float32

  step = jax.jit(lambda p, t, q, c: forward(p, t, q, config=config, cache=c, return_logits=True))
  cache = init_cache(config, B, 10)
  # prefill 3 tokens, then one at a time
  logits, cache = step(params, tokens[:, :3], positions[:, :3], cache)
  outs = [logits]
  for s in range(3, S):
    logits, cache = step(params, tokens[:, s : s + 1], positions[:, s : s + 1], cache)
    outs.append(logits)
  cached = jnp.concatenate(outs, axis=1)
  assert int(cache.index) == S
  np.testing.assert_array_equal(np.asarray(cache.positions[:, :S]), np.asarray(positions))
  assert np.all(np.asarray(cache.positions[:, S:]) == -1)
  np.testing.assert_allclose(np.asarray(cached), np.asarray(full), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("use_cache", [False, True])
def test_left_padded_rows_equal_unpadded(use_cache):
  config = CONFIGS["qwen3"]
  params = _params(config)
  S, pad = 6, 3
  row = _tokens(config, 1, S, seed=1)
  solo, _ = forward(params, row, jnp.arange(S)[None], config=config, return_logits=True)

  padded = jnp.concatenate([jnp.full((1, pad), 0, jnp.int32), row], axis=1)
  pos = jnp.concatenate([jnp.full((1, pad), -1), jnp.arange(S)[None]], axis=1).astype(jnp.int32)
  # second row: a different, unpadded sequence of the same total length
  other = _tokens(config, 1, S + pad, seed=2)
  tokens = jnp.concatenate([padded, other])
  positions = jnp.concatenate([pos, jnp.arange(S + pad)[None]]).astype(jnp.int32)
  if use_cache:
    cache = init_cache(config, 2, S + pad + 2)
    out, cache = forward(params, tokens, positions, config=config, cache=cache, return_logits=True)
    assert np.all(np.asarray(cache.positions[0, :pad]) == -1)
  else:
    out, _ = forward(params, tokens, positions, config=config, return_logits=True)
  out = np.asarray(out)
  assert np.all(np.isfinite(out))
  np.testing.assert_allclose(out[0, pad:], np.asarray(solo[0]), atol=1e-5, rtol=1e-5)
  other_solo, _ = forward(params, other, positions[1:], config=config, return_logits=True)
  np.testing.assert_allclose(out[1], np.asarray(other_solo[0]), atol=1e-5, rtol=1e-5)


def test_padded_decode_after_prefill_matches_unpadded():
  """Prefill a left-padded batch, decode 3 tokens: the padded row equals its unpadded run."""
  config = CONFIGS["llama"]
  params = _params(config)
  seq = _tokens(config, 1, 8, seed=3)
  full, _ = forward(params, seq, jnp.arange(8)[None], config=config, return_logits=True)
  pad = 2
  prompt = jnp.concatenate([jnp.zeros((1, pad), jnp.int32), seq[:, :5]], axis=1)
  ppos = jnp.concatenate([jnp.full((1, pad), -1), jnp.arange(5)[None]], axis=1).astype(jnp.int32)
  cache = init_cache(config, 1, 16)
  logits, cache = forward(params, prompt, ppos, config=config, cache=cache, return_logits=True)
  outs = [logits[:, pad:]]
  for s in range(5, 8):
    logits, cache = forward(
      params,
      seq[:, s : s + 1],
      jnp.array([[s]], jnp.int32),
      config=config,
      cache=cache,
      return_logits=True,
    )
    outs.append(logits)
  np.testing.assert_allclose(
    np.asarray(jnp.concatenate(outs, 1)), np.asarray(full), atol=1e-5, rtol=1e-5
  )


def test_hidden_and_logits_consistent():
  config = CONFIGS["llama"]
  params = _params(config)
  tokens = _tokens(config, 2, 4)
  pos = jnp.broadcast_to(jnp.arange(4), (2, 4))
  hidden, _ = forward(params, tokens, pos, config=config)
  logits, _ = forward(params, tokens, pos, config=config, return_logits=True)
  assert hidden.shape == (2, 4, config.hidden_size)
  ref = np.asarray(hidden, np.float64) @ np.asarray(params["lm_head"], np.float64)
  np.testing.assert_allclose(np.asarray(logits), ref, atol=1e-5)
  np.testing.assert_allclose(np.asarray(logits_from_hidden(params, hidden, config)), ref, atol=1e-5)
  tied = CONFIGS["qwen2"]
  tp = _params(tied)
  np.testing.assert_array_equal(np.asarray(unembed_matrix(tp, tied)), np.asarray(tp["embed"]).T)


def test_bfloat16_close_to_float32():
  config = CONFIGS["llama"]
  params = _params(config)
  tokens = _tokens(config, 2, 5)
  pos = jnp.broadcast_to(jnp.arange(5), (2, 5))
  ref, _ = forward(params, tokens, pos, config=config, return_logits=True)
  c16 = config.replace(dtype="bfloat16")
  p16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  out, _ = forward(p16, tokens, pos, config=c16, return_logits=True)
  hid, _ = forward(p16, tokens, pos, config=c16)
  assert out.dtype == jnp.float32 and hid.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=3e-2)


def test_remat_same_value_and_grad():
  config = CONFIGS["qwen3"]
  params = _params(config)
  tokens = _tokens(config, 2, 5)
  pos = jnp.broadcast_to(jnp.arange(5), (2, 5))

  def loss(p, cfg):
    logits, _ = forward(p, tokens, pos, config=cfg, return_logits=True)
    return jnp.mean(jax.nn.logsumexp(logits, -1))

  v1, g1 = jax.value_and_grad(loss)(params, config)
  v2, g2 = jax.value_and_grad(loss)(params, config.replace(remat=True))
  np.testing.assert_allclose(float(v1), float(v2), rtol=1e-6)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_llama3_rope_scaling_golden():
  """Llama-3 scaling: high freqs kept, low freqs divided by factor, medium interpolated."""
  scaling = dict(
    rope_type="llama3",
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=64,
  )
  d = dict(
    architectures=["LlamaForCausalLM"],
    vocab_size=16,
    hidden_size=32,
    intermediate_size=8,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    rope_theta=10000.0,
    rope_scaling=scaling,
  )
  cfg = ModelConfig.from_hf_dict(d)
  base = 1.0 / 10000.0 ** (np.arange(0, 16, 2) / 16)
  got = rope_inv_freq(cfg)
  wavelen = 2 * np.pi / base
  for i in range(8):
    if wavelen[i] < 64 / 4:
      want = base[i]
    elif wavelen[i] > 64 / 1:
      want = base[i] / 8
    else:
      s = (64 / wavelen[i] - 1) / (4 - 1)
      want = (1 - s) * base[i] / 8 + s * base[i]
    np.testing.assert_allclose(got[i], want, rtol=1e-6)
  assert (wavelen < 16).any() and (wavelen > 64).any() and ((wavelen > 16) & (wavelen < 64)).any()


def test_config_transformers4_and_5_forms_agree():
  common = dict(
    architectures=["Qwen3ForCausalLM"],
    model_type="qwen3",
    vocab_size=100,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    eos_token_id=[5, 6],
  )
  v4 = ModelConfig.from_hf_dict({**common, "rope_theta": 5e5})
  v5 = ModelConfig.from_hf_dict(
    {**common, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}
  )
  assert v4 == v5 and hash(v4) == hash(v5)
  assert (
    v4.rope_theta == 5e5 and v4.qk_norm and not v4.attention_bias and v4.eos_token_ids == (5, 6)
  )
  assert ModelConfig.from_hf_dict(v4.to_hf_dict()) == v4


def test_bad_config_and_inputs_raise():
  with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
    ModelConfig.from_hf_dict({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
  with pytest.raises(ValueError, match="multiple of num_kv_heads"):
    ModelConfig.tiny(num_heads=4, num_kv_heads=3)
  config = CONFIGS["llama"]
  params = _params(config)
  with pytest.raises(ValueError, match=r"positions \(2, 3\).*tokens \(2, 4\)"):
    forward(params, jnp.zeros((2, 4), jnp.int32), jnp.zeros((2, 3), jnp.int32), config=config)
  with pytest.raises(ValueError, match="do not fit a cache of length 2"):
    forward(
      params,
      jnp.zeros((1, 4), jnp.int32),
      jnp.zeros((1, 4), jnp.int32),
      config=config,
      cache=init_cache(config, 1, 2),
    )
