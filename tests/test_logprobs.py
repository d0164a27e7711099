"""Tests for rlvr_jax.logprobs: golden values, float64 NumPy reference, gradients, chunking, memory."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import logprobs as lp

# ------------------------------------------------------------------------------------------------
# Independent float64 NumPy reference.


def _np_log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _np_stats(logits, tokens, temperature):
  """(logp, entropy, mean_log_softmax) in float64 from logits [..., V]."""
  ls = _np_log_softmax(np.asarray(logits, np.float64) / temperature)
  v = ls.shape[-1]
  y = np.clip(np.asarray(tokens), 0, v - 1)
  logp = np.take_along_axis(ls, y[..., None], -1)[..., 0]
  entropy = -(np.exp(ls) * ls).sum(-1)
  return logp, entropy, ls.mean(-1)


def _random_case(seed, lead=(2, 13), d=8, v=37, dtype=jnp.float32):
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  hidden = (2.0 * jax.random.normal(k1, (*lead, d))).astype(dtype)
  unembed = jax.random.normal(k2, (d, v)).astype(dtype)
  tokens = jax.random.randint(k3, lead, 0, v)
  return hidden, unembed, tokens


def _stats_tuple(stats):
  return stats.logp, stats.entropy, stats.mean_log_softmax


def _weighted_sum(stats, weights):
  """A scalar that gives each of (logp, H, mu) its own random cotangent."""
  return sum(jnp.sum(s * w) for s, w in zip(stats, weights, strict=True))


def _naive_stats(hidden, unembed, tokens, temperature):
  """Unchunked float32 JAX computation (autodiff through log_softmax)."""
  ls = jax.nn.log_softmax(jnp.einsum("...d,dv->...v", hidden, unembed) / temperature)
  logp = jnp.take_along_axis(ls, tokens[..., None], -1)[..., 0]
  return logp, -jnp.sum(jnp.exp(ls) * ls, -1), jnp.mean(ls, -1)


# ------------------------------------------------------------------------------------------------
# Values.


@pytest.mark.parametrize(
  "temperature, logp_y0, entropy, mu",
  [
    # z = [2, 1, 0]: lse = 2 + log(1 + e^-1 + e^-2) = 2.407606; H = Σ p·(lse − z); μ = 1 − lse.
    (1.0, -0.40760596, 0.83239558, -1.40760596),
    # z / 2 = [1, 0.5, 0]: lse = 1.680270.
    (2.0, -0.68026967, 1.02019134, -1.18026967),
  ],
)
def test_golden_three_logits(temperature, logp_y0, entropy, mu):
  logits = jnp.array([[[2.0, 1.0, 0.0], [2.0, 1.0, 0.0]]])
  tokens = jnp.array([[0, 2]])
  # The same logits from hidden [1, 2, 2] @ unembed [2, 3].
  hidden = jnp.array([[[1.0, 0.0], [1.0, 0.0]]])
  unembed = jnp.array([[2.0, 1.0, 0.0], [5.0, -3.0, 7.0]])
  kw = dict(temperature=temperature, compute_mean_log_softmax=True)
  for stats in (
    lp.token_stats_from_logits(logits, tokens, **kw),
    lp.token_stats_from_hidden(hidden, unembed, tokens, **kw),
  ):
    logp_y2 = logp_y0 - 2.0 / temperature
    np.testing.assert_allclose(stats.logp, [[logp_y0, logp_y2]], atol=1e-6)
    np.testing.assert_allclose(stats.entropy, [[entropy, entropy]], atol=1e-6)
    np.testing.assert_allclose(stats.mean_log_softmax, [[mu, mu]], atol=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_matches_float64_numpy_reference(temperature):
  hidden, unembed, tokens = _random_case(0)
  ref = _np_stats(np.einsum("btd,dv->btv", hidden, unembed), tokens, temperature)
  kw = dict(temperature=temperature, chunk_size=5, compute_mean_log_softmax=True)
  from_hidden = lp.token_stats_from_hidden(hidden, unembed, tokens, vocab_chunk_size=10, **kw)
  from_logits = lp.token_stats_from_logits(hidden @ unembed, tokens, **kw)
  for stats in (from_hidden, from_logits):
    for got, want in zip(_stats_tuple(stats), ref, strict=True):
      assert got.dtype == jnp.float32
      np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)


def test_contract_entry_points_and_compute_entropy_flag():
  hidden, unembed, tokens = _random_case(1)
  logp, entropy = lp.token_logprobs_from_hidden(hidden, unembed, tokens, temperature=0.8)
  logp2, entropy2 = lp.token_logprobs_from_logits(hidden @ unembed, tokens, temperature=0.8)
  ref = _np_stats(np.einsum("btd,dv->btv", hidden, unembed), tokens, 0.8)
  for got in (logp, logp2):
    np.testing.assert_allclose(got, ref[0], atol=2e-5)
  for got in (entropy, entropy2):
    np.testing.assert_allclose(got, ref[1], atol=2e-5)
  _, none_entropy = lp.token_logprobs_from_hidden(hidden, unembed, tokens, compute_entropy=False)
  assert none_entropy is None
  assert lp.token_stats_from_logits(hidden @ unembed, tokens).mean_log_softmax is None


def test_any_leading_shape_and_jit():
  hidden, unembed, tokens = _random_case(2, lead=(11,))
  fn = jax.jit(lambda h, w, y: lp.token_logprobs_from_hidden(h, w, y, chunk_size=4))
  logp, entropy = fn(hidden, unembed, tokens)
  ref = _np_stats(hidden @ unembed, tokens, 1.0)
  np.testing.assert_allclose(logp, ref[0], atol=2e-5)
  np.testing.assert_allclose(entropy, ref[1], atol=2e-5)


# ------------------------------------------------------------------------------------------------
# Gradients.


@pytest.mark.parametrize("chunk_size", [4, 64])
def test_gradients_match_naive_unchunked_autodiff(chunk_size):
  hidden, unembed, tokens = _random_case(3)
  weights = jax.random.normal(jax.random.key(9), (3, *tokens.shape))
  kw = dict(temperature=0.7, chunk_size=chunk_size, compute_mean_log_softmax=True)

  def ours(h, w):
    stats = lp.token_stats_from_hidden(h, w, tokens, vocab_chunk_size=chunk_size, **kw)
    return _weighted_sum(_stats_tuple(stats), weights)

  def naive(h, w):
    return _weighted_sum(_naive_stats(h, w, tokens, 0.7), weights)

  got = jax.jit(jax.grad(ours, argnums=(0, 1)))(hidden, unembed)
  want = jax.grad(naive, argnums=(0, 1))(hidden, unembed)
  for g, w in zip(got, want, strict=True):
    np.testing.assert_allclose(g, w, atol=2e-5, rtol=1e-5)

  logits = hidden @ unembed
  got_logits = jax.grad(
    lambda z: _weighted_sum(_stats_tuple(lp.token_stats_from_logits(z, tokens, **kw)), weights)
  )(logits)
  want_logits = jax.grad(
    lambda z: _weighted_sum(_naive_stats(z, jnp.eye(z.shape[-1]), tokens, 0.7), weights)
  )(logits)
  np.testing.assert_allclose(got_logits, want_logits, atol=2e-5, rtol=1e-5)


def test_gradients_match_float64_finite_differences():
  hidden, unembed, tokens = _random_case(4, lead=(1, 3), d=3, v=5)
  weights = np.asarray(jax.random.normal(jax.random.key(5), (3, 1, 3)), np.float64)
  tau = 0.9

  def f64(h, w):
    stats = _np_stats(np.einsum("btd,dv->btv", h, w), tokens, tau)
    return sum((s * c).sum() for s, c in zip(stats, weights, strict=True))

  def fd_grad(x, fn, eps=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
      step = np.zeros_like(x)
      step[i] = eps
      g[i] = (fn(x + step) - fn(x - step)) / (2 * eps)
    return g

  h64, w64 = np.asarray(hidden, np.float64), np.asarray(unembed, np.float64)
  fd_h = fd_grad(h64, lambda h: f64(h, w64))
  fd_w = fd_grad(w64, lambda w: f64(h64, w))
  kw = dict(temperature=tau, chunk_size=2, vocab_chunk_size=2, compute_mean_log_softmax=True)
  g_h, g_w = jax.grad(
    lambda h, w: _weighted_sum(
      _stats_tuple(lp.token_stats_from_hidden(h, w, tokens, **kw)), jnp.asarray(weights)
    ),
    argnums=(0, 1),
  )(hidden, unembed)
  np.testing.assert_allclose(g_h, fd_h, atol=2e-5, rtol=1e-4)
  np.testing.assert_allclose(g_w, fd_w, atol=2e-5, rtol=1e-4)


def test_chunk_size_invariance_including_ragged_last_chunk():
  hidden, unembed, tokens = _random_case(6, lead=(3, 7))  # 21 tokens: no chunk size below divides
  weights = jax.random.normal(jax.random.key(7), (3, 3, 7))

  def run(chunk, vocab_chunk):
    def stats_and_grads(h, w):
      kw = dict(chunk_size=chunk, compute_mean_log_softmax=True)
      hkw = dict(kw, vocab_chunk_size=vocab_chunk)
      fn = lambda h, w: _weighted_sum(
        _stats_tuple(lp.token_stats_from_hidden(h, w, tokens, **hkw)), weights
      )
      stats = lp.token_stats_from_hidden(h, w, tokens, **hkw)
      logits_stats = lp.token_stats_from_logits(h @ w, tokens, **kw)
      grads = jax.grad(fn, argnums=(0, 1))(h, w)
      return (*_stats_tuple(stats), *_stats_tuple(logits_stats), *grads)

    return jax.jit(stats_and_grads)(hidden, unembed)

  base = run(21, None)
  # V = 37: vocabulary blocks of 5 and 16 leave a ragged (shifted) last block.
  for chunk, vocab_chunk in ((1, 5), (4, 37), (8, 16), (1000, 1000)):
    for got, want in zip(run(chunk, vocab_chunk), base, strict=True):
      np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-6)


def test_temperature_rule():
  hidden, unembed, tokens = _random_case(8)
  tau = 0.5
  tempered = lp.token_stats_from_hidden(hidden, unembed, tokens, temperature=tau)
  # Dividing the logits by τ is the same as scaling the hidden states by 1/τ at τ = 1.
  scaled = lp.token_stats_from_hidden(hidden / tau, unembed, tokens)
  np.testing.assert_allclose(tempered.logp, scaled.logp, atol=1e-5)
  np.testing.assert_allclose(tempered.entropy, scaled.entropy, atol=1e-5)
  # A traced temperature gives the same values, and τ changes the result.
  traced = jax.jit(
    lambda t: lp.token_stats_from_hidden(hidden, unembed, tokens, temperature=t).logp
  )(jnp.float32(tau))
  np.testing.assert_allclose(traced, tempered.logp, atol=1e-6)
  untempered = lp.token_stats_from_hidden(hidden, unembed, tokens)
  assert np.abs(np.asarray(untempered.logp - tempered.logp)).max() > 0.1


def test_bfloat16_inputs_accumulate_in_float32():
  hidden, unembed, tokens = _random_case(10, dtype=jnp.bfloat16)
  # Reference on the exactly upcast bf16 values, in float64.
  ref = _np_stats(
    np.einsum("btd,dv->btv", np.asarray(hidden, np.float64), np.asarray(unembed, np.float64)),
    tokens,
    1.0,
  )
  stats = lp.token_stats_from_hidden(hidden, unembed, tokens, chunk_size=6)
  assert stats.logp.dtype == jnp.float32 and stats.entropy.dtype == jnp.float32
  np.testing.assert_allclose(stats.logp, ref[0], atol=1e-4, rtol=1e-5)
  np.testing.assert_allclose(stats.entropy, ref[1], atol=1e-4, rtol=1e-5)
  g_h, g_w = jax.grad(
    lambda h, w: jnp.sum(lp.token_stats_from_hidden(h, w, tokens).logp), argnums=(0, 1)
  )(hidden, unembed)
  assert g_h.dtype == jnp.bfloat16 and g_w.dtype == jnp.bfloat16
  want_h, want_w = jax.grad(
    lambda h, w: jnp.sum(_naive_stats(h, w, tokens, 1.0)[0]), argnums=(0, 1)
  )(hidden.astype(jnp.float32), unembed.astype(jnp.float32))
  np.testing.assert_allclose(g_h.astype(jnp.float32), want_h, atol=3e-2, rtol=2e-2)
  np.testing.assert_allclose(g_w.astype(jnp.float32), want_w, atol=3e-2, rtol=2e-2)
  logits_stats = lp.token_stats_from_logits(
    jnp.einsum("btd,dv->btv", hidden, unembed, preferred_element_type=jnp.float32).astype(
      jnp.bfloat16
    ),
    tokens,
  )
  assert logits_stats.logp.dtype == jnp.float32
  np.testing.assert_allclose(logits_stats.logp, ref[0], atol=0.1)


def test_padding_positions_give_finite_values_and_gradients():
  hidden, unembed, tokens = _random_case(11, lead=(2, 5))
  # Padded positions: zero hidden states, out-of-range ids (-1 and V + 3).
  hidden = hidden.at[1, 2:].set(0.0)
  tokens = tokens.at[1, 2:].set(jnp.array([-1, 40, -1]))
  mask = jnp.ones((2, 5), bool).at[1, 2:].set(False)

  def loss(h, w):
    logp, entropy = lp.token_logprobs_from_hidden(h, w, tokens, chunk_size=3)
    return jnp.sum(jnp.where(mask, logp + 0.1 * entropy, 0.0))

  value, (g_h, g_w) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(hidden, unembed)
  assert np.isfinite(value) and np.isfinite(g_h).all() and np.isfinite(g_w).all()
  np.testing.assert_array_equal(g_h[1, 2:], 0.0)  # masked positions carry no gradient
  logp, entropy = lp.token_logprobs_from_hidden(hidden, unembed, tokens)
  # A zero hidden state is the uniform distribution: logp = -log V, H = log V.
  np.testing.assert_allclose(logp[1, 2:], -np.log(37.0), atol=1e-5)
  np.testing.assert_allclose(entropy[1, 2:], np.log(37.0), atol=1e-5)


@pytest.mark.parametrize(
  "call, error, match",
  [
    (lambda h, w, y: lp.token_stats_from_hidden(h, w[:-1], y), ValueError, r"\(7, 37\)"),
    (lambda h, w, y: lp.token_stats_from_hidden(h, w[None], y), ValueError, "unembed must be"),
    (lambda h, w, y: lp.token_stats_from_hidden(h, w, y[:, :-1]), ValueError, r"\(2, 12\)"),
    (lambda h, w, y: lp.token_stats_from_hidden(h, w, y * 1.0), TypeError, "integer"),
    (lambda h, w, y: lp.token_stats_from_hidden(y, w, y), TypeError, "floating"),
    (
      lambda h, w, y: lp.token_stats_from_hidden(h, w, y, temperature=0.0),
      ValueError,
      "temperature",
    ),
    (lambda h, w, y: lp.token_stats_from_hidden(h, w, y, chunk_size=0), ValueError, "chunk_size"),
    (
      lambda h, w, y: lp.token_stats_from_hidden(h, w, y, vocab_chunk_size=0),
      ValueError,
      "vocab_chunk_size",
    ),
    (lambda h, w, y: lp.token_stats_from_logits(h @ w, y[0]), ValueError, r"\(2, 13, 37\)"),
  ],
)
def test_bad_inputs_raise_naming_shapes(call, error, match):
  hidden, unembed, tokens = _random_case(12)
  with pytest.raises(error, match=match):
    call(hidden, unembed, tokens)


# ------------------------------------------------------------------------------------------------
# Memory: the compiled forward + backward never holds a whole [N, V] float32 array.


def _temp_bytes(fn, *args):
  stats = jax.jit(fn).lower(*args).compile().memory_analysis()
  if stats is None:
    pytest.skip("memory_analysis is not available on this backend")
  return stats.temp_size_in_bytes


def test_compiled_memory_is_far_below_full_logits():
  d, v = 16, 8192
  unembed = jax.ShapeDtypeStruct((d, v), jnp.float32)

  def shapes(n):
    return (
      jax.ShapeDtypeStruct((1, n, d), jnp.float32),
      unembed,
      jax.ShapeDtypeStruct((1, n), jnp.int32),
    )

  def chunked(h, w, y):
    def loss(h, w):
      logp, entropy = lp.token_logprobs_from_hidden(h, w, y, chunk_size=128, vocab_chunk_size=1024)
      return jnp.sum(logp) + jnp.sum(entropy)

    return jax.value_and_grad(loss, argnums=(0, 1))(h, w)

  def naive(h, w, y):
    def loss(h, w):
      logp, entropy, _ = _naive_stats(h, w, y, 1.0)
      return jnp.sum(logp) + jnp.sum(entropy)

    return jax.value_and_grad(loss, argnums=(0, 1))(h, w)

  n = 2048
  full = n * v * 4  # 64 MiB
  chunked_bytes = _temp_bytes(chunked, *shapes(n))
  naive_bytes = _temp_bytes(naive, *shapes(n))
  assert naive_bytes >= full  # the measure sees the [N, V] buffers when they exist
  # A few [C, V] float32 tiles (C = 128; XLA:CPU does not reuse the buffers of the unrolled
  # vocabulary blocks) plus the [D, V] float32 accumulator: 1/8 of the full array here, and
  # independent of N.
  assert chunked_bytes < full / 6, (chunked_bytes, full)
  assert _temp_bytes(chunked, *shapes(4 * n)) < 1.1 * chunked_bytes
