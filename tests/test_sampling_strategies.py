"""Sampling strategies: kept sets and probabilities vs float64 NumPy and transformers' warpers,
chi-square tests of sampled frequencies, trainer-side re-application of the truncation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
import torch
from transformers.generation import logits_process as hf_lp

from rlvr_jax.sampling import (
  Combined,
  Greedy,
  MinP,
  Temperature,
  TopK,
  TopP,
  keys,
  truncated_token_logprobs,
)


def _softmax64(z):
  z = np.asarray(z, np.float64)
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _reference_probs(logits, *, temperature=1.0, top_k=None, top_p=None, min_p=None):
  """Float64 NumPy reference of the truncated distribution (temperature, top-k, top-p, min-p)."""
  z = np.asarray(logits, np.float64) / temperature
  keep = np.ones(z.shape, bool)
  if top_k is not None:
    kth = np.sort(z, -1)[..., ::-1][..., min(top_k, z.shape[-1]) - 1]
    keep &= z >= kth[..., None]
  if top_p is not None:
    p = _softmax64(np.where(keep, z, -np.inf))
    for row in np.ndindex(z.shape[:-1]):
      order = np.argsort(-p[row], kind="stable")
      mass_before = np.cumsum(p[row][order]) - p[row][order]
      drop = order[mass_before >= top_p]
      keep[row + (drop,)] = False
  if min_p is not None:
    keep &= z >= z.max(-1, keepdims=True) + np.log(min_p)
  return _softmax64(np.where(keep, z, -np.inf)), keep


STRATEGIES = [
  (Temperature(0.7), dict(temperature=0.7)),
  (TopK(5, temperature=1.3), dict(temperature=1.3, top_k=5)),
  (TopP(0.8), dict(top_p=0.8)),
  (TopP(0.5, temperature=0.6), dict(temperature=0.6, top_p=0.5)),
  (MinP(0.1, temperature=1.5), dict(temperature=1.5, min_p=0.1)),
  (
    Combined(temperature=0.9, top_k=12, top_p=0.9, min_p=0.02),
    dict(temperature=0.9, top_k=12, top_p=0.9, min_p=0.02),
  ),
]


@pytest.mark.parametrize("strategy,ref_kwargs", STRATEGIES, ids=lambda s: repr(s)[:40])
def test_distribution_matches_float64_reference(strategy, ref_kwargs):
  logits = jax.random.normal(jax.random.key(0), (6, 40)) * 2.0
  logp, threshold = strategy.log_probs(logits)
  ref_probs, ref_keep = _reference_probs(np.asarray(logits), **ref_kwargs)
  assert logp.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(logp) > -1e30, ref_keep)
  np.testing.assert_allclose(np.exp(np.asarray(logp)), ref_probs, atol=1e-6)
  # The threshold separates kept from dropped scaled logits.
  z = np.asarray(logits) / strategy.temperature
  np.testing.assert_array_equal(z >= np.asarray(threshold)[:, None], ref_keep)


def test_combined_matches_transformers_warpers():
  """Same kept set and probabilities as transformers' temperature -> top-k -> top-p -> min-p."""
  logits = jax.random.normal(jax.random.key(1), (8, 64)) * 3.0
  scores = torch.tensor(np.asarray(logits))
  for warper in (
    hf_lp.TemperatureLogitsWarper(0.8),
    hf_lp.TopKLogitsWarper(20),
    hf_lp.TopPLogitsWarper(0.85),
    hf_lp.MinPLogitsWarper(0.05),
  ):
    scores = warper(None, scores)
  hf_probs = torch.softmax(scores.double(), -1).numpy()
  logp, _ = Combined(temperature=0.8, top_k=20, top_p=0.85, min_p=0.05).log_probs(logits)
  np.testing.assert_array_equal(np.asarray(logp) > -1e30, hf_probs > 0)
  np.testing.assert_allclose(np.exp(np.asarray(logp)), hf_probs, atol=1e-6)


def test_top_k_keeps_ties_and_top_p_one_is_untruncated():
  logits = jnp.array([[3.0, 1.0, 2.0, 2.0, 0.0]])
  logp, _ = TopK(2).log_probs(logits)
  # 2.0 is tied at rank 2 and 3: both kept, like transformers' TopKLogitsWarper.
  np.testing.assert_array_equal(np.asarray(logp[0]) > -1e30, [True, False, True, True, False])
  logp, threshold = TopP(1.0).log_probs(logits)
  np.testing.assert_allclose(np.asarray(logp), np.asarray(jax.nn.log_softmax(logits)), atol=1e-7)
  assert float(threshold[0]) < -1e30


def test_greedy_is_point_mass_on_argmax():
  logits = jnp.array([[0.1, 2.0, -1.0, 1.5], [4.0, 0.0, 0.0, 3.0]])
  logp, threshold = Greedy().log_probs(logits)
  np.testing.assert_array_equal(np.asarray(logp) == 0.0, np.eye(4, dtype=bool)[[1, 0]])
  np.testing.assert_allclose(np.asarray(threshold), [1.75, 3.5])
  toks = jax.vmap(Greedy().sample)(jax.random.split(jax.random.key(0), 2), logp)
  np.testing.assert_array_equal(np.asarray(toks), [1, 0])


def _counts(strategy, logits, n):
  @jax.jit
  def draw(logits):
    row_keys = keys.row_keys(jax.random.key(7), jnp.zeros(n, jnp.int32), jnp.arange(n))
    logp, _ = strategy.log_probs(jnp.broadcast_to(logits, (n, logits.shape[-1])))
    return jax.vmap(strategy.sample)(keys.position_keys(row_keys, 0), logp)

  return np.bincount(np.asarray(draw(logits)), minlength=logits.shape[-1])


def chi_square_pvalue(counts, probs, min_expected=5.0):
  """Pearson chi-square p-value, merging the bins with expected count < min_expected into one.

  Tokens of probability 0 must have count 0 (raises otherwise).
  """
  counts = np.asarray(counts, np.float64)
  expected = np.asarray(probs, np.float64) * counts.sum()
  assert counts[expected == 0].sum() == 0, "sampled a token outside the support"
  small = (expected < min_expected) & (expected > 0)
  obs = np.append(counts[expected >= min_expected], counts[small].sum())
  exp = np.append(expected[expected >= min_expected], expected[small].sum())
  if exp[-1] == 0:
    obs, exp = obs[:-1], exp[:-1]
  exp = exp * (obs.sum() / exp.sum())  # float64 rounding: scipy wants equal sums to ~1e-8
  return scipy.stats.chisquare(obs, exp).pvalue


@pytest.mark.parametrize("strategy,ref_kwargs", STRATEGIES, ids=lambda s: repr(s)[:40])
def test_sampled_frequencies_chi_square(strategy, ref_kwargs):
  logits = jax.random.normal(jax.random.key(3), (24,)) * 1.5
  probs, _ = _reference_probs(np.asarray(logits)[None], **ref_kwargs)
  counts = _counts(strategy, logits, 20_000)
  assert chi_square_pvalue(counts, probs[0]) > 1e-3


def test_chi_square_detects_a_wrong_distribution():
  """The statistical test has power: sampling at temperature 1 is rejected against temperature 0.7."""
  logits = jax.random.normal(jax.random.key(3), (24,)) * 1.5
  probs, _ = _reference_probs(np.asarray(logits)[None], temperature=0.7)
  counts = _counts(Temperature(1.0), logits, 20_000)
  assert chi_square_pvalue(counts, probs[0]) < 1e-6


@pytest.mark.parametrize("strategy", [s for s, _ in STRATEGIES] + [Greedy()], ids=repr)
def test_truncated_token_logprobs_reapplies_sampler_distribution(strategy):
  logits = jax.random.normal(jax.random.key(4), (3, 5, 50)) * 2.0
  logp, threshold = strategy.log_probs(logits)
  tokens = jax.vmap(jax.vmap(strategy.sample))(jax.random.split(jax.random.key(5), (3, 5)), logp)
  expected = jnp.take_along_axis(logp, tokens[..., None], -1)[..., 0]
  # The trainer's logits differ from the sampler's by float noise: the kept set must not change.
  noisy = logits + 1e-5 * jax.random.normal(jax.random.key(6), logits.shape)
  got = truncated_token_logprobs(
    noisy, tokens, threshold if strategy.truncates else None, temperature=strategy.temperature
  )
  np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-4)
  grad = jax.grad(
    lambda x: truncated_token_logprobs(x, tokens, threshold, temperature=strategy.temperature).sum()
  )(logits)
  assert np.isfinite(np.asarray(grad)).all()
  # Gradient is zero outside the kept set (they are not in the distribution).
  kept = np.asarray(logp) > -1e30
  assert np.abs(np.asarray(grad)[~kept]).max(initial=0.0) == 0.0


def test_bad_hyperparameters_raise():
  with pytest.raises(ValueError, match="temperature"):
    Temperature(0.0)
  with pytest.raises(ValueError, match="top_p"):
    TopP(1.5)
  with pytest.raises(ValueError, match="top_k"):
    TopK(0)
  with pytest.raises(ValueError, match="min_p"):
    MinP(0.0)
  with pytest.raises(ValueError, match="threshold"):
    truncated_token_logprobs(jnp.zeros((2, 3, 5)), jnp.zeros((2, 3), jnp.int32), jnp.zeros((2,)))


def test_strategies_are_hashable_static_arguments():
  assert hash(TopP(0.9)) == hash(TopP(0.9)) and TopP(0.9) == TopP(0.9)
  assert TopP(0.9) != TopP(0.8)
  f = jax.jit(lambda x, s: s.log_probs(x)[0], static_argnums=1)
  f(jnp.zeros((1, 4)), TopP(0.9))
  f(jnp.ones((1, 4)), TopP(0.9))
  assert f._cache_size() == 1


def test_truncated_logprobs_from_hidden_chunked_equals_full():
  """Chunked over T (T=7, chunk 3: ragged last chunk): same values and gradients as the logits path."""
  from rlvr_jax.sampling import truncated_logprobs_from_hidden

  h = jax.random.normal(jax.random.key(0), (2, 7, 8))
  w = jax.random.normal(jax.random.key(1), (8, 30))
  strategy = Combined(temperature=0.7, top_p=0.8)
  logp, threshold = strategy.log_probs(h @ w)
  tokens = jax.vmap(jax.vmap(strategy.sample))(jax.random.split(jax.random.key(2), (2, 7)), logp)

  def full(h, w):
    return truncated_token_logprobs(h @ w, tokens, threshold, temperature=0.7)

  def chunked(h, w):
    return truncated_logprobs_from_hidden(h, w, tokens, threshold, temperature=0.7, chunk_size=3)

  np.testing.assert_allclose(np.asarray(chunked(h, w)), np.asarray(full(h, w)), atol=1e-5)
  g_full = jax.grad(lambda h, w: full(h, w).sum(), argnums=(0, 1))(h, w)
  g_chunk = jax.grad(lambda h, w: chunked(h, w).sum(), argnums=(0, 1))(h, w)
  for a, b in zip(g_chunk, g_full, strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4)


def test_two_pass_argmax_equals_jnp_argmax_with_ties_and_nan():
  from rlvr_jax.sampling.strategies import argmax

  x = jnp.array(
    [
      [1.0, 3.0, 3.0, 0.0],
      [jnp.nan, 1.0, jnp.nan, 2.0],
      [-1.0, -1.0, -1.0, -1.0],
      [0.0, 1.0, 2.0, 5.0],
    ]
  )
  np.testing.assert_array_equal(np.asarray(jax.jit(argmax)(x)), [1, 0, 0, 3])
  y = jax.random.normal(jax.random.key(0), (16, 300))
  np.testing.assert_array_equal(np.asarray(jax.jit(argmax)(y)), np.asarray(jnp.argmax(y, -1)))


def test_inverse_cdf_sample_stays_in_the_support():
  """Many keys on a distribution with dropped (NEG) tokens between and after the kept ones."""
  from rlvr_jax.sampling.strategies import NEG, inverse_cdf_sample

  logp = jnp.log(jnp.array([0.0, 0.5, 0.0, 0.25, 0.25, 0.0, 0.0]))
  logp = jnp.where(jnp.isfinite(logp), logp, NEG)
  keys = jax.random.split(jax.random.key(1), 4000)
  draws = np.asarray(jax.jit(jax.vmap(inverse_cdf_sample, in_axes=(0, None)))(keys, logp))
  counts = np.bincount(draws, minlength=7)
  assert counts[[0, 2, 5, 6]].sum() == 0
  assert chi_square_pvalue(counts, [0, 0.5, 0, 0.25, 0.25, 0, 0]) > 1e-3


@pytest.mark.parametrize("block", [1, 2, 3, 128])
def test_inverse_cdf_sample_blocks_equal_a_plain_inversion(block):
  """Dyadic probabilities make every partial sum exact, so the blocked search must return exactly
  the first token whose cumulative probability exceeds u (u drawn from the same key), whatever the
  block size: blocks of one token, blocks straddling dropped tokens, a padded last block."""
  from rlvr_jax.sampling.strategies import NEG, inverse_cdf_sample

  probs = np.array([0.0, 0.5, 0.0, 0.125, 0.125, 0.0, 0.25, 0.0, 0.0], np.float32)
  logp = jnp.where(probs > 0, jnp.log(jnp.asarray(probs)), NEG)
  keys = jax.random.split(jax.random.key(2), 3000)
  draw = jax.jit(jax.vmap(lambda k: inverse_cdf_sample(k, logp, block=block)))
  u = np.asarray(jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys))
  expected = np.argmax((np.cumsum(probs)[None, :] > u[:, None]) & (probs > 0)[None, :], axis=1)
  np.testing.assert_array_equal(np.asarray(draw(keys)), expected)
  assert set(np.unique(expected)) == {1, 3, 4, 6}  # every kept token was drawn
