"""generate / prefill / decode_step on a tiny random model: log-prob parity with a full forward pass,
stop tokens and lengths, sampling statistics, batch and device-layout invariance, recompile guard."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_sampling_strategies import _reference_probs, chi_square_pvalue

from rlvr_jax import sharding as sharding_lib
from rlvr_jax.model import ModelConfig, forward, init_params, param_shardings, unstack_layers
from rlvr_jax.sampling import (
  Combined,
  Greedy,
  MinP,
  Temperature,
  TopK,
  TopP,
  decode_step,
  generate,
  logprob_parity,
  pad_to_bucket,
  prefill,
  sampler,
)

CONFIG = ModelConfig.tiny()


@pytest.fixture(scope="module")
def params():
  """Random tiny weights with a sharper unembedding (logit std ~2), so that sampled
  distributions are far from uniform and greedy decoding has clear winners."""
  p = init_params(CONFIG, jax.random.key(0))
  return dict(p, lm_head=p["lm_head"] * 15.0)


def _prompts(num_prompts, seed=0, max_len=9):
  """Left-padded random prompts [P, max_len] of lengths 1..max_len (ids >= 3: no special ids)."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, max_len + 1, num_prompts)
  tokens = np.zeros((num_prompts, max_len), np.int32)
  mask = np.arange(max_len)[None, :] >= (max_len - lengths)[:, None]
  tokens[mask] = rng.integers(3, CONFIG.vocab_size, mask.sum())
  return tokens, mask


def _generate(params, prompts, strategy, *, num_samples=2, max_new_tokens=10, seed=1, **kw):
  """generate with shared defaults (P=4 prompts of bucket 16, G=2, T=10 share one program)."""
  tokens, mask = prompts
  return generate(
    params,
    tokens,
    mask,
    config=CONFIG,
    num_samples=num_samples,
    strategy=strategy,
    key=jax.random.key(seed),
    max_new_tokens=max_new_tokens,
    **kw,
  )


COMBINED = Combined(temperature=0.9, top_k=30, top_p=0.9, min_p=0.01)
FAST = [Temperature(0.6), COMBINED, Greedy()]
SLOW = [Temperature(1.0), TopK(8, temperature=0.8), TopP(0.7), MinP(0.05, temperature=1.2)]


@pytest.mark.parametrize(
  "strategy", FAST + [pytest.param(s, marks=pytest.mark.slow) for s in SLOW], ids=repr
)
def test_logprob_parity_with_full_forward(params, strategy):
  rollout = _generate(params, _prompts(4), strategy, stop_tokens=(2, 3, 4, 5, 6))
  gaps = {
    k: float(v)
    for k, v in logprob_parity(params, rollout, config=CONFIG, strategy=strategy).items()
  }
  assert gaps["sampler_logp_gap/max"] <= 1e-5, gaps
  assert gaps["model_logp_gap/max"] <= 1e-5, gaps
  assert int(rollout.lengths.sum()) > 20  # enough tokens were compared
  # Sampled log-probs are real log-probs: <= 0, and the truncated ones >= the untruncated ones
  # at temperature 1 (truncation only renormalises upwards) when the temperature is 1.
  mask = np.asarray(rollout.completion_mask)
  assert (np.asarray(rollout.sampler_logp)[mask] <= 1e-6).all()
  if strategy.temperature == 1.0:
    assert (np.asarray(rollout.sampler_logp - rollout.model_logp)[mask] >= -1e-6).all()


def test_parity_detects_different_params(params):
  """The parity check is not vacuous: other weights give a visible gap."""
  rollout = _generate(params, _prompts(4), Temperature(0.6))
  other = jax.tree.map(lambda w: w * 1.01, params)
  gaps = logprob_parity(other, rollout, config=CONFIG, strategy=Temperature(0.6))
  assert float(gaps["model_logp_gap/max"]) > 1e-3


def test_stop_tokens_lengths_and_padding(params):
  """Rows stop at their first stop token (kept in the completion), then only padding follows."""
  prompts = _prompts(4, seed=3)
  strategy = Temperature(0.6)
  free = _generate(params, prompts, strategy, stop_tokens=(), max_new_tokens=10)
  free_tokens = np.asarray(free.tokens)
  assert np.asarray(free.completion_mask).all() and np.asarray(free.truncated).all()
  # Stop ids: tokens first seen at different positions in different rows.
  stops = (int(free_tokens[0, 2]), int(free_tokens[1, 6]), int(free_tokens[2, 0]))
  rollout = _generate(params, prompts, strategy, stop_tokens=stops, max_new_tokens=10, pad_id=0)
  tokens, mask = np.asarray(rollout.tokens), np.asarray(rollout.completion_mask)
  lengths = np.asarray(rollout.lengths)
  for b in range(tokens.shape[0]):
    hits = np.flatnonzero(np.isin(free_tokens[b], stops))
    n = hits[0] + 1 if hits.size else 10
    assert lengths[b] == n
    # Same keys per (prompt, sample, position): the prefix equals the unstopped run.
    np.testing.assert_array_equal(tokens[b, :n], free_tokens[b, :n])
    np.testing.assert_array_equal(mask[b], np.arange(10) < n)
    assert (tokens[b, n:] == 0).all()
    assert bool(rollout.finished[b]) == bool(hits.size) and bool(rollout.truncated[b]) != bool(
      hits.size
    )
  assert len(set(lengths.tolist())) >= 3, lengths  # rows really finished at different times
  assert (np.asarray(rollout.sampler_logp)[~mask] == 0).all()
  np.testing.assert_array_equal(np.asarray(rollout.prompt_ids), np.repeat(np.arange(4), 2))
  np.testing.assert_array_equal(np.asarray(rollout.sample_ids), np.tile(np.arange(2), 4))


def test_prefill_decode_step_loop_matches_generate(params):
  """The public prefill + donated decode_step, looped on the host, give generate's greedy tokens
  (prefill with stacked params, decode with ``unstack_layers``-ed ones: both layouts serve)."""
  tokens, mask = pad_to_bucket(*_prompts(4, seed=5), pad_id=0)
  rollout = _generate(params, (tokens, mask), Greedy(), stop_tokens=())
  per_layer = unstack_layers(params, CONFIG)
  logits, cache, positions = prefill(
    params, tokens, mask, config=CONFIG, cache_len=tokens.shape[1] + 10
  )
  out = []
  for t in range(10):
    tok = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    out.append(tok)
    if t < 9:
      old = cache
      logits, cache = decode_step(per_layer, cache, tok, positions + t, config=CONFIG)
      # The cache was donated (updated in place): every per-layer buffer.
      assert all(a.is_deleted() for a in (*old.k, *old.v, old.positions))
  np.testing.assert_array_equal(np.stack(out, 1), np.asarray(rollout.tokens)[::2])
  np.testing.assert_array_equal(np.asarray(rollout.tokens)[::2], np.asarray(rollout.tokens)[1::2])


def test_first_and_second_token_frequencies_match_softmax(params):
  """Chi-square: first-token counts over G = 3000 samples match softmax(logits / tau) of a full
  forward pass (top-k and top-p truncated), and second tokens (given the most common first) match too."""
  strategy = Combined(temperature=0.8, top_k=60, top_p=0.95)
  tokens, mask = pad_to_bucket(*_prompts(1, seed=7), pad_id=0)
  rollout = _generate(
    params, (tokens, mask), strategy, num_samples=3000, stop_tokens=(), max_new_tokens=2
  )
  sampled = np.asarray(rollout.tokens)

  def reference(prefix):
    seq = np.concatenate([tokens[0][mask[0]], prefix])[None]
    logits, _ = forward(
      params, seq, np.arange(seq.shape[1])[None], config=CONFIG, return_logits=True
    )
    # Independent float64 NumPy truncation (test_sampling_strategies._reference_probs).
    return _reference_probs(np.asarray(logits[0, -1]), temperature=0.8, top_k=60, top_p=0.95)[0]

  counts = np.bincount(sampled[:, 0], minlength=CONFIG.vocab_size)
  probs = reference(np.zeros(0, np.int32))
  assert chi_square_pvalue(counts, probs) > 1e-3
  assert 60 > (probs > 0).sum() > 5  # top-p cuts inside the top-k set: both are active
  first = int(np.argmax(counts))
  second = sampled[sampled[:, 0] == first, 1]
  assert second.size > 100
  counts2 = np.bincount(second, minlength=CONFIG.vocab_size)
  assert chi_square_pvalue(counts2, reference(np.array([first], np.int32))) > 1e-3


def test_same_samples_in_batch_of_4_or_32(params):
  """A prompt's samples depend on its prompt id, not on the batch it is in."""
  big_tokens, big_mask = _prompts(32, seed=11)
  rows = np.array([3, 17, 20, 31])
  kw = dict(num_samples=2, max_new_tokens=8, stop_tokens=(5,))
  big = _generate(params, (big_tokens, big_mask), TopK(20), prompt_ids=np.arange(32), **kw)
  small = _generate(params, (big_tokens[rows], big_mask[rows]), TopK(20), prompt_ids=rows, **kw)
  big_rows = (rows[:, None] * 2 + np.arange(2)).reshape(-1)
  np.testing.assert_array_equal(np.asarray(small.tokens), np.asarray(big.tokens)[big_rows])
  np.testing.assert_array_equal(np.asarray(small.lengths), np.asarray(big.lengths)[big_rows])
  np.testing.assert_allclose(
    np.asarray(small.sampler_logp), np.asarray(big.sampler_logp)[big_rows], atol=1e-5
  )
  # Different prompt ids give different samples of the same prompt.
  shifted = _generate(
    params, (big_tokens[rows], big_mask[rows]), TopK(20), prompt_ids=rows + 1, **kw
  )
  assert not np.array_equal(np.asarray(shifted.tokens), np.asarray(small.tokens))


@pytest.mark.parametrize("shape", [(8, 1, 1), (2, 2, 2)], ids=["data8", "data2_fsdp2_tensor2"])
def test_same_samples_on_one_device_and_on_8_device_mesh(params, shape):
  """Rows sharded over the data axes (and weights over ``tensor`` by SAMPLE_RULES) give the same
  samples as one device."""
  assert jax.device_count() >= 8
  prompts = _prompts(4, seed=13)
  single = _generate(params, prompts, COMBINED, stop_tokens=(7,))
  mesh = sharding_lib.make_mesh(*shape)
  with jax.set_mesh(mesh):
    placed = jax.device_put(params, param_shardings(CONFIG, mesh, sharding_lib.SAMPLE_RULES))
    sharded = _generate(placed, prompts, COMBINED, stop_tokens=(7,))
  assert len(sharded.tokens.sharding.device_set) == 8
  assert not sharded.tokens.sharding.is_fully_replicated  # rows really are split over devices
  np.testing.assert_array_equal(np.asarray(sharded.tokens), np.asarray(single.tokens))
  np.testing.assert_array_equal(
    np.asarray(sharded.completion_mask), np.asarray(single.completion_mask)
  )
  np.testing.assert_allclose(
    np.asarray(sharded.sampler_logp), np.asarray(single.sampler_logp), atol=1e-5
  )


def test_cache_phases_schedule():
  """Phase lengths come from the bucket ladder, leave >= min_steps steps on each side, end at S+T."""
  assert sampler.cache_phases(48, 128) == (96, 128, 176)
  assert sampler.cache_phases(48, 128, min_steps=0) == (176,)
  assert sampler.cache_phases(16, 10) == (26,)  # too short to split
  assert sampler.cache_phases(16, 20, min_steps=2) == (24, 32, 36)
  for S in (16, 24, 48, 96):
    for T in (1, 7, 64, 100, 1000):
      for m in (1, 8, 32):
        phases = sampler.cache_phases(S, T, min_steps=m)
        assert phases[-1] == S + T
        steps = np.diff((S, *phases))
        assert len(phases) == 1 or steps.min() >= m, (S, T, m, phases)


@pytest.mark.parametrize("shape", [None, (2, 2, 2)], ids=["one_device", "data2_fsdp2_tensor2"])
def test_growing_cache_phases_give_the_same_rollout(params, shape):
  """Decoding in phases (the cache grown twice on the way) samples what one full-length cache
  does, rows that stop early included, and keeps log-prob parity with a full forward pass."""
  prompts = _prompts(4, seed=17)
  kw = dict(max_new_tokens=20, stop_tokens=(3, 4, 5))
  assert sampler.cache_phases(16, 20, min_steps=2) == (24, 32, 36)
  one = _generate(params, prompts, COMBINED, phase_steps=0, **kw)
  if shape is None:
    phased = _generate(params, prompts, COMBINED, phase_steps=2, **kw)
  else:
    mesh = sharding_lib.make_mesh(*shape)
    with jax.set_mesh(mesh):
      placed = jax.device_put(params, param_shardings(CONFIG, mesh, sharding_lib.SAMPLE_RULES))
      phased = _generate(placed, prompts, COMBINED, phase_steps=2, **kw)
    assert not phased.tokens.sharding.is_fully_replicated
  lengths = np.asarray(one.lengths)
  # Phase 1 (24 slots) samples tokens 0..8, phase 3 (36 slots) tokens 17..19.
  assert lengths.min() <= 9 and lengths.max() > 17  # rows end in the first and the last phase
  for name in ("tokens", "completion_mask", "lengths", "finished"):
    np.testing.assert_array_equal(np.asarray(getattr(phased, name)), np.asarray(getattr(one, name)))
  for name in ("sampler_logp", "model_logp", "sampler_threshold"):
    np.testing.assert_allclose(
      np.asarray(getattr(phased, name)), np.asarray(getattr(one, name)), atol=1e-5
    )
  gaps = logprob_parity(params, phased, config=CONFIG, strategy=COMBINED)
  assert float(gaps["sampler_logp_gap/max"]) <= 1e-5 and float(gaps["model_logp_gap/max"]) <= 1e-5


def test_no_recompilation_within_a_bucket(params):
  """Different prompts, lengths (same bucket), keys and steps reuse one compiled program."""
  strategy = Temperature(0.6)
  _generate(params, _prompts(4, seed=20, max_len=5), strategy, seed=0)
  compiled = sampler.generate_jit._cache_size()
  for step in range(1, 4):
    prompts = _prompts(4, seed=20 + step, max_len=5 + 2 * step)
    rollout = _generate(params, prompts, strategy, seed=step, stop_tokens=range(step))
  assert rollout.prompt_tokens.shape[1] == 16
  assert sampler.generate_jit._cache_size() == compiled
  # A longer prompt moves to the next bucket: exactly one new program.
  tokens, mask = _prompts(4, seed=30, max_len=20)
  mask[0], tokens[0] = True, 7  # one prompt of length 20 -> bucket 24
  assert _generate(params, (tokens, mask), strategy).prompt_tokens.shape[1] == 24
  assert sampler.generate_jit._cache_size() == compiled + 1


def test_bad_inputs_raise(params):
  tokens, mask = _prompts(2)
  with pytest.raises(ValueError, match="left-padded"):
    _generate(params, (tokens[:, ::-1], mask[:, ::-1]), Greedy())
  empty = mask.copy()
  empty[0] = False
  with pytest.raises(ValueError, match="no real token"):
    _generate(params, (tokens, empty), Greedy())
  with pytest.raises(TypeError, match="typed PRNG key"):
    generate(
      params,
      tokens,
      mask,
      config=CONFIG,
      num_samples=1,
      strategy=Greedy(),
      key=jax.random.PRNGKey(0),
      max_new_tokens=2,
    )
  with pytest.raises(ValueError, match="prompt_ids"):
    _generate(params, (tokens, mask), Greedy(), prompt_ids=np.arange(3))
  with pytest.raises(ValueError, match="exceeds the largest bucket"):
    _generate(params, (tokens, mask), Greedy(), buckets=(4,))
  explicit = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
  with jax.set_mesh(explicit), pytest.raises(ValueError, match="Auto axis types"):
    _generate(params, (tokens, mask), Greedy())
