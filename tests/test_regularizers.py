"""Tests for rlvr_jax.regularizers: golden numbers (METHODS.md §4), float64 NumPy references,
gradient checks, expected-gradient enumeration, masked rows and bad inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import regularizers as reg

ATOL = 1e-5


def _grad_sum(fn, x):
  """d/dx of sum(fn(x)) (elementwise functions: the per-token derivative)."""
  return np.asarray(jax.grad(lambda z: jnp.sum(fn(z)))(jnp.asarray(x, jnp.float32)))


# ---------------------------------------------------------------------------------------------
# KL estimators (§4.1)


def test_kl_golden_per_token():
  logp, ref = jnp.array([[0.3]]), jnp.array([[0.0]])
  expect = {"k1": (0.3, 1.0), "k2": (0.045, 0.3), "k3": (0.040818, 0.259182)}
  for est, (value, grad) in expect.items():
    fn = lambda x, est=est: reg.kl_estimate(x, ref, estimator=est)
    np.testing.assert_allclose(fn(logp), [[value]], atol=ATOL)
    np.testing.assert_allclose(_grad_sum(fn, logp), [[grad]], atol=ATOL)


def test_kl_numpy_reference_random():
  rng = np.random.default_rng(0)
  logp = rng.normal(-2.0, 1.0, (3, 7))
  ref = rng.normal(-2.0, 1.0, (3, 7))
  d = logp - ref
  ref_values = {"k1": d, "k2": 0.5 * d**2, "k3": np.exp(-d) - 1 + d}
  ref_grads = {"k1": np.ones_like(d), "k2": d, "k3": 1 - np.exp(-d)}
  for est in ("k1", "k2", "k3"):
    fn = lambda x, est=est: reg.kl_estimate(x, jnp.asarray(ref, jnp.float32), estimator=est)
    np.testing.assert_allclose(
      fn(jnp.asarray(logp, jnp.float32)), ref_values[est], rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(_grad_sum(fn, logp), ref_grads[est], rtol=1e-5, atol=1e-5)


def test_kl_abs_estimator_golden_and_reference():
  # verl kl_penalty 'abs': |logp - ref|, gradient sign(logp - ref) (0 at equality).
  fn = lambda x: reg.kl_estimate(x, jnp.zeros((1, 3)), estimator="abs")
  x = jnp.array([[0.3, -0.5, 0.0]])
  np.testing.assert_allclose(fn(x), [[0.3, 0.5, 0.0]], atol=ATOL)
  np.testing.assert_allclose(_grad_sum(fn, x), [[1.0, -1.0, 0.0]], atol=ATOL)
  rng = np.random.default_rng(2)
  logp, ref = rng.normal(-2.0, 1.0, (3, 7)), rng.normal(-2.0, 1.0, (3, 7))
  got = reg.kl_estimate(jnp.asarray(logp, jnp.float32), jnp.asarray(ref, jnp.float32),
                        estimator="abs")  # fmt: skip
  np.testing.assert_allclose(got, np.abs(logp - ref), rtol=1e-5, atol=1e-6)
  # As a penalty value with the k2 gradient (straight-through), like every other estimator.
  kl, _ = reg.kl_penalty(jnp.asarray(logp, jnp.float32), jnp.asarray(ref, jnp.float32),
                         value="abs", grad="k2")  # fmt: skip
  np.testing.assert_allclose(kl, np.abs(logp - ref), rtol=1e-5, atol=1e-6)


def test_kl_penalty_straight_through_value_and_grad():
  rng = np.random.default_rng(1)
  logp = rng.normal(-1.0, 0.5, (2, 5))
  ref = rng.normal(-1.0, 0.5, (2, 5))
  d = logp - ref
  fn = lambda x: reg.kl_penalty(x, jnp.asarray(ref, jnp.float32))[0]  # default: value k3, grad k2
  np.testing.assert_allclose(fn(jnp.asarray(logp, jnp.float32)), np.exp(-d) - 1 + d, atol=1e-5)
  np.testing.assert_allclose(_grad_sum(fn, logp), d, atol=1e-5)


def test_kl_clamp_zeroes_gradient_and_reports_fraction():
  # d = -3 makes k3 = e^3 - 4 = 16.09 > 10: clamped; d = 0.5 is not.
  logp, ref = jnp.array([[-3.0, 0.5]]), jnp.zeros((1, 2))
  fn = lambda x: reg.kl_penalty(x, ref, value="k3", grad="k3", clamp=10.0)
  value, clamped = fn(logp)
  np.testing.assert_allclose(value, [[10.0, np.exp(-0.5) - 0.5]], atol=1e-5)
  np.testing.assert_array_equal(clamped, [[True, False]])
  np.testing.assert_allclose(
    _grad_sum(lambda x: fn(x)[0], logp), [[0.0, 1 - np.exp(-0.5)]], atol=1e-5
  )
  # With the default k2 gradient the clamp only touches the value, the gradient survives.
  g = _grad_sum(lambda x: reg.kl_penalty(x, ref)[0], logp)
  np.testing.assert_allclose(g, [[-3.0, 0.5]], atol=1e-5)


@pytest.mark.parametrize(
  "value,grad,expected",
  [
    ("k1", "k1", [0.0, 0.0, 0.0]),
    ("k2", "k2", [0.006215, 0.007095, -0.013311]),
    ("k3", "k3", [0.006480, 0.007196, -0.013676]),
    ("k3", "k3_is", [0.006215, 0.007095, -0.013311]),
    ("k3", "k2", [0.006215, 0.007095, -0.013311]),  # the default
  ],
)
def test_kl_expected_gradient_by_enumeration(value, grad, expected):
  theta = jnp.array([0.5, 0.0, -0.5])
  ref = jnp.log(jnp.array([0.5, 0.3, 0.2]))

  def expected_loss(th):
    logp = jax.nn.log_softmax(th)
    probs = jax.lax.stop_gradient(jnp.exp(logp))  # sampling distribution: no gradient
    k, _ = reg.kl_penalty(logp[None], ref[None], value=value, grad=grad, clamp=None)
    return jnp.sum(probs * k[0])

  np.testing.assert_allclose(jax.grad(expected_loss)(theta), expected, atol=2e-6)


def test_kl_expected_value_enumeration():
  logp = jax.nn.log_softmax(jnp.array([0.5, 0.0, -0.5]))
  ref = jnp.log(jnp.array([0.5, 0.3, 0.2]))
  probs = jnp.exp(logp)
  for est in ("k1", "k3"):
    value = jnp.sum(probs * reg.kl_estimate(logp[None], ref[None], estimator=est)[0])
    np.testing.assert_allclose(value, 6.0607e-4, atol=1e-7)


def test_kl_bad_inputs():
  with pytest.raises(ValueError, match=r"logp\[2, 3\].*ref_logp\[2, 4\]"):
    reg.kl_estimate(jnp.zeros((2, 3)), jnp.zeros((2, 4)))
  with pytest.raises(ValueError, match="not one of"):
    reg.kl_penalty(jnp.zeros((2, 3)), jnp.zeros((2, 3)), value="k4")


def test_adaptive_kl_coef():
  np.testing.assert_allclose(reg.adaptive_kl_coef(0.1, 0.2, target=0.1, horizon=10.0), 0.102)
  np.testing.assert_allclose(reg.adaptive_kl_coef(0.1, 0.1, target=0.1, horizon=10.0), 0.1)


# ---------------------------------------------------------------------------------------------
# Entropy bonus and adaptive coefficient (§4.2, §4.3)


def test_entropy_bonus_value_grad_and_masked_rows():
  h = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
  m = jnp.array([[1, 1, 0], [0, 0, 0]], bool)
  fn = lambda x: reg.entropy_bonus(x, m, coef=0.1, num_tokens=2.0)
  np.testing.assert_allclose(fn(h), -0.1 * 3.0 / 2.0, atol=1e-7)
  np.testing.assert_allclose(jax.grad(fn)(h), -0.05 * np.asarray(m, float), atol=1e-7)
  zero = reg.entropy_bonus(h, jnp.zeros_like(m), coef=0.1, num_tokens=0.0)
  assert float(zero) == 0.0 and np.all(np.isfinite(jax.grad(lambda x: reg.entropy_bonus(
    x, jnp.zeros_like(m), coef=0.1, num_tokens=0.0))(h)))  # fmt: skip


def test_adaptive_entropy_golden():
  state = reg.AdaptiveEntropyState(jnp.float32(0.005), jnp.float32(0.15))
  np.testing.assert_allclose(reg.adaptive_entropy_coef(state, target=0.2), 0.005)
  nxt = reg.update_adaptive_entropy(state, 0.15, target=0.2, delta=0.005)
  np.testing.assert_allclose(nxt.coef, 0.010, atol=1e-8)
  state = reg.AdaptiveEntropyState(jnp.float32(0.005), jnp.float32(0.25))
  np.testing.assert_allclose(reg.adaptive_entropy_coef(state, target=0.2), 0.0)
  nxt = reg.update_adaptive_entropy(state, 0.25, target=0.2, delta=0.005)
  np.testing.assert_allclose(nxt.coef, 0.0, atol=1e-8)
  np.testing.assert_allclose(nxt.last_entropy, 0.25)
  # Pure and jittable: the state is a pytree.
  jitted = jax.jit(lambda s, h: reg.update_adaptive_entropy(s, h, coef_max=0.006))
  np.testing.assert_allclose(jitted(reg.init_adaptive_entropy(0.005), 0.1).coef, 0.006)
  np.testing.assert_allclose(reg.proportional_entropy_coef(0.01, 0.5, target=0.3, lr=0.1), 0.0)
  np.testing.assert_allclose(reg.proportional_entropy_coef(0.01, 0.2, target=0.3, lr=0.1), 0.02)


# ---------------------------------------------------------------------------------------------
# SIREN (§4.4)


def test_siren_golden():
  h = jnp.array([[0.1, 0.5, 2.0, 1.0, 0.3]])
  m = jnp.ones((1, 5), bool)
  np.testing.assert_array_equal(reg.siren_peak_mask(h, m), [[False, False, True, False, False]])
  penalty, h_sel = reg.siren_penalty(h, m, anchor=1.5, num_tokens=5.0, num_seqs=1.0)
  np.testing.assert_allclose(h_sel, 2.0, atol=1e-6)
  np.testing.assert_allclose(penalty, 0.00125, atol=1e-8)
  # d penalty / dH on the selected token: 2 * 0.005 * (2.0 - 1.5) = 0.005.
  grad = jax.grad(lambda x: reg.siren_penalty(x, m, anchor=1.5, num_tokens=5.0, num_seqs=1.0)[0])(h)
  np.testing.assert_allclose(grad, [[0, 0, 0.005, 0, 0]], atol=1e-7)


def test_siren_quantile_matches_numpy_per_sequence():
  rng = np.random.default_rng(2)
  h = rng.uniform(0, 3, (4, 9))
  lengths = [9, 5, 1, 0]
  m = np.arange(9)[None] < np.array(lengths)[:, None]
  got = np.asarray(reg.siren_peak_mask(jnp.asarray(h, jnp.float32), jnp.asarray(m)))
  for b, n in enumerate(lengths):
    want = np.zeros(9, bool)
    if n:
      q = np.quantile(h[b, :n], 0.8)  # numpy "linear" interpolation
      want[:n] = h[b, :n] > q
    np.testing.assert_array_equal(got[b], want)


def test_siren_microbatch_split_with_selected_entropy():
  rng = np.random.default_rng(3)
  h = jnp.asarray(rng.uniform(0, 3, (4, 6)), jnp.float32)
  m = jnp.asarray(np.arange(6)[None] < np.array([[6], [4], [0], [5]]))
  kw = dict(anchor=1.0, num_tokens=float(m.sum()), num_seqs=3.0, coef=0.1)
  full = lambda x: reg.siren_penalty(x, m, **kw)[0]
  h_sel = reg.siren_penalty(h, m, **kw)[1]
  parts = lambda x: sum(
    reg.siren_penalty(x[s], m[s], selected_entropy=h_sel, **kw)[0]
    for s in (slice(0, 2), slice(2, 4))
  )
  np.testing.assert_allclose(parts(h), full(h), rtol=1e-6)
  np.testing.assert_allclose(jax.grad(parts)(h), jax.grad(full)(h), atol=1e-7)


# ---------------------------------------------------------------------------------------------
# Lp-Reg (§4.5)


def test_min_p_proxy_golden():
  probs = np.array([0.60, 0.25, 0.10, 0.04, 0.01])
  logits = jnp.asarray(np.log(probs)[None, None].repeat(5, 1), jnp.float32)  # [1, 5, 5]
  tokens = jnp.arange(5)[None]
  proxy = np.exp(np.asarray(reg.min_p_proxy_logp(logits, tokens, min_p=0.02)))
  np.testing.assert_allclose(proxy[0], [0.606061, 0.252525, 0.101010, 0.040404, 0.0], atol=1e-6)


def test_min_p_proxy_from_hidden_matches_the_logits_form():
  """One matmul pass over token tiles x vocabulary blocks (V = 20,000 > the 8192-column block, so
  the last block is narrower) == the [B, T, V] reference; the golden row above through it."""
  rng = np.random.default_rng(0)
  hidden = jnp.asarray(rng.normal(size=(3, 7, 8)), jnp.float32)
  unembed = jnp.asarray(rng.normal(size=(8, 20_000)), jnp.float32)
  logits = jnp.einsum("btd,dv->btv", hidden, unembed)
  tokens = jnp.asarray(rng.integers(0, 20_000, (3, 7)))
  tokens = tokens.at[0].set(jnp.argsort(logits[0], -1)[:, -2])  # row 0: kept (second best)
  want = reg.min_p_proxy_logp(logits, tokens, min_p=0.02)
  got = reg.min_p_proxy_logp_from_hidden(hidden, unembed, tokens, min_p=0.02, chunk_size=4)
  assert np.all(np.asarray(want[0]) > -100) and np.all(np.asarray(want[1:]) < -9000)
  np.testing.assert_allclose(got[0], want[0], atol=2e-5)
  np.testing.assert_allclose(got[1:], want[1:], rtol=1e-6)
  # Golden: the 5-token distribution above, as logits = hidden @ unembed with D = 5, W = I.
  probs = np.array([0.60, 0.25, 0.10, 0.04, 0.01])
  hid = jnp.asarray(np.log(probs)[None, None].repeat(5, 1), jnp.float32)
  proxy = reg.min_p_proxy_logp_from_hidden(hid, jnp.eye(5), jnp.arange(5)[None], min_p=0.02)
  np.testing.assert_allclose(
    np.exp(np.asarray(proxy[0])), [0.606061, 0.252525, 0.101010, 0.040404, 0.0], atol=1e-6
  )
  with pytest.raises(ValueError, match="min_p must be in"):
    reg.min_p_proxy_logp_from_hidden(hidden, unembed, tokens, min_p=0.0)


def test_lp_reg_penalty_golden_and_grad():
  logp, proxy = jnp.log(jnp.array([[0.01]])), jnp.log(jnp.array([[0.05]]))
  fn = lambda x: reg.lp_reg_penalty(x, proxy)
  np.testing.assert_allclose(fn(logp), [[2.390562]], atol=1e-5)
  np.testing.assert_allclose(_grad_sum(fn, logp), [[-4.0]], atol=1e-4)  # 1 - pi~/pi
  # The clamp at 10 zeros the pull where pi~/pi > 13.6.
  far = jnp.log(jnp.array([[0.001]]))
  np.testing.assert_allclose(fn(far), [[10.0]])
  np.testing.assert_allclose(_grad_sum(fn, far), [[0.0]])
  np.testing.assert_allclose(_grad_sum(lambda x: reg.lp_reg_penalty(x, proxy, clamp=None), far),
                             [[1 - 50.0]], rtol=1e-4)  # fmt: skip


def test_lp_reg_threshold_k_and_selection():
  rng = np.random.default_rng(4)
  for n_neg, active in ((400, True), (150, False)):
    logp = jnp.asarray(-rng.uniform(0.1, 8.0, (1, n_neg)), jnp.float32)
    adv = -jnp.ones((1, n_neg))
    m = jnp.ones((1, n_neg), bool)
    thr = reg.lp_reg_threshold(logp, adv, m, lp_reg_frac=0.01)
    chosen = reg.lp_reg_mask(logp, jnp.zeros_like(logp), adv, m, thr)
    if active:  # k = 4: the 4 lowest log-probs
      want = np.zeros(n_neg, bool)
      want[np.argsort(np.asarray(logp[0]))[:4]] = True
      np.testing.assert_array_equal(chosen[0], want)
    else:  # k = 1: the reference skips the term
      assert not bool(chosen.any())
  # Positive-advantage and masked tokens are never selected; logp >= proxy is not selected.
  logp = jnp.array([[-9.0, -8.0, -7.0, -6.0]])
  adv = jnp.array([[1.0, -1.0, -1.0, -1.0]])
  m = jnp.array([[1, 1, 0, 1]], bool)
  proxy = jnp.array([[0.0, -8.5, 0.0, 0.0]])
  chosen = reg.lp_reg_mask(logp, proxy, adv, m, jnp.float32(0.0))
  np.testing.assert_array_equal(chosen, [[False, False, False, True]])
