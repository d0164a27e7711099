"""Decoder forward: KV-cache decoding, padding invariance, masks, config and shape errors."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.model import (
  ModelConfig,
  forward,
  forward_into_new_cache,
  init_cache,
  init_params,
  logits_from_hidden,
  unembed_matrix,
  unstack_layers,
)
from rlvr_jax.model.config import UnsupportedModelError
from rlvr_jax.model.layers import rope_inv_freq

# Every switch on (QKV bias and q/k norm) so that one config exercises all code paths; the three
# real families are checked against transformers in test_model_hf.py.
CONFIG = ModelConfig.tiny(attention_bias=True, qk_norm=True, family="qwen2")
B, S, PAD = 2, 8, 3  # one shape for most tests: jit compilations are shared between tests


def _params(config, seed=0):
  params = init_params(config, jax.random.key(seed))
  if config.attention_bias:  # non-zero biases so that they are exercised
    keys = jax.random.split(jax.random.key(seed + 1), 3)
    for k, name in zip(keys, ("bq", "bk", "bv"), strict=True):
      params["layers"][name] = 0.1 * jax.random.normal(k, params["layers"][name].shape)
  return params


def _tokens(config, b, s, seed=0):
  rng = np.random.default_rng(seed)
  return jnp.asarray(rng.integers(3, config.vocab_size, size=(b, s)), jnp.int32)


def _padded_batch():
  """Row 0: PAD padding tokens then S - PAD real ones; row 1: S real tokens.

  Returns (tokens, positions, unpadded): ``unpadded`` has row 0's real tokens first (positions
  0..S-1, its tail is other tokens), so causality makes its first S - PAD outputs comparable.
  """
  tokens = _tokens(CONFIG, B, S, seed=1)
  real = tokens[0, PAD:]
  tail = _tokens(CONFIG, 1, PAD, seed=2)[0]
  unpadded = tokens.at[0].set(jnp.concatenate([real, tail]))
  positions = np.tile(np.arange(S), (B, 1))
  positions[0] = np.concatenate([np.full(PAD, -1), np.arange(S - PAD)])
  return tokens, jnp.asarray(positions, jnp.int32), unpadded


def test_left_padded_rows_equal_unpadded():
  params = _params(CONFIG)
  tokens, positions, unpadded = _padded_batch()
  ref, _ = forward(params, unpadded, _arange(), config=CONFIG, return_logits=True)
  out, none = forward(params, tokens, positions, config=CONFIG, return_logits=True)
  assert none is None and out.shape == (B, S, CONFIG.vocab_size) and out.dtype == jnp.float32
  out, ref = np.asarray(out), np.asarray(ref)
  assert np.all(np.isfinite(out))  # padding outputs are garbage, but finite
  np.testing.assert_allclose(out[0, PAD:], ref[0, : S - PAD], atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(out[1], ref[1], atol=1e-5, rtol=1e-5)


def _arange():
  return jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S))


def test_forward_into_new_cache_equals_forward_with_an_empty_cache():
  """The prefill by the scan path (attention over the S prompt tokens) gives the hidden states and
  the cache contents of the cached path (attention over S_max slots), with left padding, and
  decoding continues from it identically; stacked and unstacked params give the same."""
  params = _params(CONFIG)
  tokens, positions, _ = _padded_batch()
  ref, ref_cache = forward(
    params, tokens, positions, config=CONFIG, cache=init_cache(CONFIG, B, S + 3)
  )
  valid = np.asarray(positions) >= 0  # padding outputs and their cache slots are garbage
  for p in (params, unstack_layers(params, CONFIG)):
    out, cache = forward_into_new_cache(p, tokens, positions, config=CONFIG, max_len=S + 3)
    np.testing.assert_allclose(np.asarray(out)[valid], np.asarray(ref)[valid], atol=1e-5, rtol=1e-5)
    assert int(cache.index) == S and cache.max_len == S + 3
    np.testing.assert_array_equal(np.asarray(cache.positions), np.asarray(ref_cache.positions))
    filled = np.asarray(cache.positions) >= 0
    for a, b in zip(cache.k, ref_cache.k, strict=True):  # [B, K, S_max, H]
      assert a.shape == b.shape
      a, b = (np.moveaxis(np.asarray(x), 2, 1)[filled] for x in (a, b))
      np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    for a, b in zip(cache.v, ref_cache.v, strict=True):  # [B, K, S_max, H]
      assert a.shape == b.shape
      a, b = (np.moveaxis(np.asarray(x), 2, 1)[filled] for x in (a, b))
      np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    step = dict(tokens=jnp.full((B, 1), 5, jnp.int32), positions=positions[:, -1:] + 1)
    got, _ = forward(p, step["tokens"], step["positions"], config=CONFIG, cache=cache)
    want, _ = forward(params, step["tokens"], step["positions"], config=CONFIG, cache=ref_cache)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)
  with pytest.raises(ValueError, match="do not fit"):
    forward_into_new_cache(params, tokens, positions, config=CONFIG, max_len=S - 1)


def test_kv_cache_prefill_then_token_by_token_equals_full_forward():
  """Left-padded prefill of 4 slots, then 4 single tokens: equal to one full forward pass."""
  params = _params(CONFIG)
  tokens, positions, unpadded = _padded_batch()
  full, _ = forward(params, unpadded, _arange(), config=CONFIG, return_logits=True)
  cache = init_cache(CONFIG, B, S + 2)
  logits, cache = forward(
    params, tokens[:, :4], positions[:, :4], config=CONFIG, cache=cache, return_logits=True
  )
  outs = [logits]
  for s in range(4, S):
    logits, cache = forward(
      params,
      tokens[:, s : s + 1],
      positions[:, s : s + 1],
      config=CONFIG,
      cache=cache,
      return_logits=True,
    )
    outs.append(logits)
    if s == 4:
      compiled = forward._cache_size()
  assert forward._cache_size() == compiled  # decode steps at new cache indices: no recompile
  cached = np.asarray(jnp.concatenate(outs, axis=1))
  assert int(cache.index) == S
  # stored positions: -1 for padding and for never-written slots
  np.testing.assert_array_equal(np.asarray(cache.positions[:, :S]), np.asarray(positions))
  assert np.all(np.asarray(cache.positions[:, S:]) == -1)
  full = np.asarray(full)
  np.testing.assert_allclose(cached[0, PAD:], full[0, : S - PAD], atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(cached[1], full[1], atol=1e-5, rtol=1e-5)


def test_hidden_and_logits_consistent():
  config = CONFIG
  params = _params(config)
  tokens, pos = _tokens(config, B, S), _arange()
  hidden, _ = forward(params, tokens, pos, config=config)
  logits, _ = forward(params, tokens, pos, config=config, return_logits=True)
  assert hidden.shape == (B, S, config.hidden_size)
  ref = np.asarray(hidden, np.float64) @ np.asarray(params["lm_head"], np.float64)
  np.testing.assert_allclose(np.asarray(logits), ref, atol=1e-5)
  np.testing.assert_allclose(np.asarray(logits_from_hidden(params, hidden, config)), ref, atol=1e-5)
  tied = ModelConfig.tiny(tie_word_embeddings=True)
  tp = _params(tied)
  np.testing.assert_array_equal(np.asarray(unembed_matrix(tp, tied)), np.asarray(tp["embed"]).T)


def test_bfloat16_close_to_float32():
  config = CONFIG
  params = _params(config)
  tokens, pos = _tokens(config, B, S), _arange()
  ref, _ = forward(params, tokens, pos, config=config, return_logits=True)
  c16 = config.replace(dtype="bfloat16")
  p16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  out, _ = forward(p16, tokens, pos, config=c16, return_logits=True)
  hid, _ = forward(p16, tokens, pos, config=c16)
  assert out.dtype == jnp.float32 and hid.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=3e-2)


def _check_remat_same_value_and_grad(config, *, rtol):
  """``value_and_grad`` of a loss over the logits, with and without remat: asserts they agree;
  returns the jitted function and its params."""
  params = _params(config)
  tokens, pos = _tokens(config, B, S), _arange()

  def loss(p, cfg):
    logits, _ = forward(p, tokens, pos, config=cfg, return_logits=True)
    return jnp.mean(jax.nn.logsumexp(logits, -1))

  value_and_grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
  v1, g1 = value_and_grad(params, config)
  v2, g2 = value_and_grad(params, config.replace(remat=True))
  np.testing.assert_allclose(float(v1), float(v2), rtol=1e-6)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=1e-6)
  return value_and_grad, params


def test_remat_same_value_and_grad():
  _check_remat_same_value_and_grad(CONFIG, rtol=0)


def test_bfloat16_layers_keep_float32_matmul_outputs_for_the_backward_pass():
  """With bfloat16 activations and no remat, the layer scan keeps the float32 matmul outputs for
  the backward pass (``decoder._differentiable``): the same value and gradients as full remat,
  and no bfloat16 [L, ...] stack in the compiled gradient that XLA:CPU updates as float32 (it
  converted each such stack to float32 and back at every layer: a SmolLM2 update 2.1x slower
  than with remat)."""
  config = CONFIG.replace(compute_dtype="bfloat16", num_layers=4)
  value_and_grad, params = _check_remat_same_value_and_grad(config, rtol=1e-5)
  hlo = value_and_grad.lower(params, config).compile().as_text()
  assert _widened_stack_updates(hlo, config.num_layers) == []


def _widened_stack_updates(hlo: str, L: int) -> list[str]:
  """The fused computations of compiled ``hlo`` that update a bfloat16 [L, ...] stack as float32
  (XLA:CPU's rewrite of a bfloat16 ``dynamic_update_slice``: the whole stack converted to
  float32 and back). Asserts that the module updates some [L, ...] stack at all."""
  computations = re.findall(r"^%\S+ \(.*?\n\}", hlo, re.M | re.S)
  stack_update = rf"[fu]\d+\[{L},[\d,]+\]\S* dynamic-update-slice\("
  updates = [c for c in computations if re.search(stack_update, c)]
  assert updates, "no update of an [L, ...] stack found: the check tests nothing"
  widened = rf"ROOT \S+ = bf16\[{L},[\d,]+\]\S* convert\("
  return [c for c in updates if re.search(widened, c)]


def test_bfloat16_prefill_stacks_keys_and_values_as_bits():
  """The scan path's prefill in bfloat16 stacks the layers' keys / values as uint16 bits
  (``decoder._to_bits``): the same cache as the cached path, and no widened stack update."""
  config = CONFIG.replace(compute_dtype="bfloat16", num_layers=4)
  params = _params(config)
  tokens, positions, _ = _padded_batch()
  _, cache = forward_into_new_cache(params, tokens, positions, config=config, max_len=S + 3)
  _, ref = forward(params, tokens, positions, config=config, cache=init_cache(config, B, S + 3))
  filled = np.asarray(cache.positions) >= 0
  for got, want in ((cache.k, ref.k), (cache.v, ref.v)):  # [B, K, S_max, H]
    for a, b in zip(got, want, strict=True):
      assert a.dtype == b.dtype == jnp.bfloat16
      a, b = (np.moveaxis(np.asarray(x, np.float32), 2, 1)[filled] for x in (a, b))
      np.testing.assert_allclose(a, b, atol=3e-2, rtol=3e-2)
  hlo = (
    forward_into_new_cache.lower(params, tokens, positions, config=config, max_len=S + 3)
    .compile()
    .as_text()
  )
  assert _widened_stack_updates(hlo, config.num_layers) == []


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
  assert ModelConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
  assert cfg.to_hf_dict()["rope_parameters"]["rope_type"] == "llama3"
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
  config = CONFIG
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


def test_bfloat16_cache_write_is_an_in_place_bit_update():
  """A decode step with a bfloat16 cache writes the new keys / values as uint16 bit patterns:
  the same buffers as a bfloat16 ``dynamic_update_slice`` bit for bit, and no float32 update of
  a whole cache buffer in the compiled step (XLA:CPU's float normalisation turned the bfloat16
  update into one, converting every layer's buffer twice per decode step)."""
  from rlvr_jax.model import decoder

  config = ModelConfig.tiny(compute_dtype="bfloat16")
  buf = jax.random.normal(jax.random.key(0), (2, 3, 4, 9)).astype(jnp.bfloat16)
  new = jax.random.normal(jax.random.key(1), (2, 3, 4, 1))  # float32: rounded on the way in
  starts = (0, 0, 0, jnp.int32(5))
  np.testing.assert_array_equal(
    np.asarray(decoder._write_slots(buf, new, starts)).view(np.uint16),
    np.asarray(jax.lax.dynamic_update_slice(buf, new.astype(jnp.bfloat16), starts)).view(np.uint16),
  )
  params = init_params(config, jax.random.key(0))
  cache = init_cache(config, B, S + 2)
  assert cache.k[0].dtype == jnp.bfloat16
  step = forward.lower(
    params, _tokens(config, B, 1), jnp.zeros((B, 1), jnp.int32), config=config, cache=cache
  )
  hlo = step.compile().as_text()
  shapes = {",".join(map(str, a.shape)) for a in (*cache.k, *cache.v)}
  f32_updates = [
    m for m in re.findall(r"f32\[([\d,]+)\]\S* dynamic-update-slice\(", hlo) if m in shapes
  ]
  assert f32_updates == [], f32_updates
  assert any(re.search(rf"u16\[{s}\]\S* dynamic-update-slice\(", hlo) for s in shapes), (
    "no uint16 cache update found"
  )
