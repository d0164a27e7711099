"""Per-token surrogates, selections, weights and aggregation of rlvr_jax.losses.

Golden numbers from METHODS.md §1.2 and §3, independent float64 NumPy references on random inputs
(with analytic gradients), and trace-time errors for bad shapes.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import losses

ATOL = 1e-5


def _f32(x):
  return jnp.asarray(x, jnp.float32)


def _value_and_token_grad(fn, logp, mask=None):
  """Per-token loss and d(sum_t m l)/d logp (exact per-token gradient for token-level losses)."""
  m = jnp.ones(jnp.shape(logp)) if mask is None else _f32(mask)
  loss = fn(_f32(logp))[0]
  grad = jax.grad(lambda x: jnp.sum(fn(x)[0] * m))(_f32(logp))
  return np.asarray(loss), np.asarray(grad)


def _random_inputs(seed, shape=(4, 6)):
  rng = np.random.default_rng(seed)
  logp = -rng.uniform(0.05, 3.0, shape)
  old = logp + rng.normal(0.0, 0.35, shape)
  adv = rng.normal(0.0, 1.0, shape)
  lengths = rng.integers(1, shape[1] + 1, shape[0])
  mask = np.arange(shape[1])[None] < lengths[:, None]
  return logp, old, adv, mask


# ---------------------------------------------------------------------------------------------
# Aggregation (§1.2)

AGG_L = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
AGG_M = np.array([[1, 1, 0], [1, 1, 1]], bool)


@pytest.mark.parametrize(
  "mode,value",
  [("token_mean", 3.6), ("seq_mean_token_mean", 3.25), ("seq_mean_token_sum", 9.0),
   ("seq_mean_token_sum_norm", 2.25), ("token_sum", 18.0)],
)  # fmt: skip
def test_aggregate_golden_and_microbatch_split(mode, value):
  kw = dict(mode=mode, num_tokens=5.0, num_seqs=2.0, seq_norm_constant=4.0)
  np.testing.assert_allclose(losses.aggregate(_f32(AGG_L), AGG_M, **kw), value, atol=1e-6)
  parts = [losses.aggregate(_f32(AGG_L[i : i + 1]), AGG_M[i : i + 1], **kw) for i in range(2)]
  np.testing.assert_allclose(sum(parts), value, atol=1e-6)
  if mode == "token_mean":  # the bug to test against: averaging per-micro-batch means
    np.testing.assert_allclose(parts[0], 0.6, atol=1e-6)
    assert abs(np.mean([1.5, 5.0]) - value) > 0.3


def test_aggregate_numpy_reference_and_empty_rows():
  rng = np.random.default_rng(0)
  loss = rng.normal(size=(5, 7))
  mask = np.arange(7)[None] < np.array([7, 3, 0, 1, 5])[:, None]
  n_tok, n_seq, c = mask.sum(), (mask.sum(1) > 0).sum(), 9.0
  rows = (loss * mask).sum(1)
  n = mask.sum(1)
  ref = {
    "token_mean": rows.sum() / n_tok,
    "seq_mean_token_mean": sum(rows[b] / n[b] for b in range(5) if n[b]) / n_seq,
    "seq_mean_token_sum": rows.sum() / n_seq,
    "seq_mean_token_sum_norm": rows.sum() / (n_seq * c),
    "token_sum": rows.sum(),  # verl token-sum: (loss * mask).sum()
  }
  for mode, want in ref.items():
    fn = lambda x, mode=mode: losses.aggregate(
      x, mask, mode=mode, num_tokens=float(n_tok), num_seqs=float(n_seq), seq_norm_constant=c
    )
    np.testing.assert_allclose(fn(_f32(loss)), want, rtol=1e-5)
    grad = np.asarray(jax.grad(fn)(_f32(loss)))
    assert np.all(grad[2] == 0) and np.all(np.isfinite(grad))
  # Everything masked and zero normalisers: 0 with finite gradients.
  fn = lambda x: losses.aggregate(x, np.zeros_like(mask), mode="seq_mean_token_mean",
                                  num_tokens=0.0, num_seqs=0.0)  # fmt: skip
  assert float(fn(_f32(loss))) == 0.0
  assert np.all(np.asarray(jax.grad(fn)(_f32(loss))) == 0)


def test_aggregate_bad_inputs():
  with pytest.raises(ValueError, match="not one of"):
    losses.aggregate(_f32(AGG_L), AGG_M, mode="mean", num_tokens=5.0, num_seqs=2.0)
  with pytest.raises(ValueError, match="seq_norm_constant"):
    losses.aggregate(
      _f32(AGG_L), AGG_M, mode="seq_mean_token_sum_norm", num_tokens=5.0, num_seqs=2.0
    )
  with pytest.raises(ValueError, match=r"per_token_loss\[2, 3\].*completion_mask\[2, 2\]"):
    losses.aggregate(_f32(AGG_L), AGG_M[:, :2], mode="token_mean", num_tokens=5.0, num_seqs=2.0)
  with pytest.raises(ValueError, match=r"rank 2.*\[6\]"):
    losses.aggregate(
      _f32(AGG_L).reshape(-1), AGG_M, mode="token_mean", num_tokens=5.0, num_seqs=2.0
    )


# ---------------------------------------------------------------------------------------------
# Surrogates: golden numbers (§3.1-3.6)

PPO_A = np.array([[1.0, 1.0, -1.0, -1.0, -1.0]])
PPO_R = np.array([[1.5, 0.5, 0.7, 1.2, 4.0]])


def test_ppo_clip_golden():
  fn = lambda x: losses.ppo_clip_loss(x, jnp.zeros((1, 5)), PPO_A, dual_clip=3.0)
  loss, grad = _value_and_token_grad(fn, np.log(PPO_R))
  np.testing.assert_allclose(loss, [[-1.28, -0.5, 0.8, 1.2, 3.0]], atol=ATOL)
  np.testing.assert_allclose(loss.mean(), 0.644, atol=ATOL)
  np.testing.assert_allclose(grad / 5, [[0, -0.1, 0, 0.24, 0]], atol=ATOL)
  info = fn(_f32(np.log(PPO_R)))[1]
  np.testing.assert_array_equal(info["high"], [[1, 0, 0, 0, 0]])
  np.testing.assert_array_equal(info["low"], [[0, 0, 1, 0, 0]])
  np.testing.assert_array_equal(info["dual"], [[0, 0, 0, 0, 1]])


def test_gppo_golden():
  fn = lambda x: losses.gppo_loss(x, jnp.zeros((1, 5)), PPO_A, dual_clip=3.0)
  loss, grad = _value_and_token_grad(fn, np.log(PPO_R))
  np.testing.assert_allclose(loss.mean(), 0.644, atol=ATOL)
  np.testing.assert_allclose(grad / 5, [[-0.256, -0.1, 0.16, 0.24, 0]], atol=ATOL)


def test_ppo_ratio_cap_and_bad_dual_clip():
  # r = 4 with A = +1 is clipped anyway; with A = -1, no dual clip, the cap 2 bounds the loss.
  fn = lambda x: losses.ppo_clip_loss(x, jnp.zeros((1, 1)), -jnp.ones((1, 1)), ratio_cap=2.0)
  loss, grad = _value_and_token_grad(fn, np.log([[4.0]]))
  np.testing.assert_allclose(loss, [[2.0]], atol=ATOL)
  np.testing.assert_allclose(grad, [[0.0]], atol=ATOL)
  with pytest.raises(ValueError, match="dual_clip"):
    losses.ppo_clip_loss(jnp.zeros((1, 1)), jnp.zeros((1, 1)), jnp.ones((1, 1)), dual_clip=0.5)


@pytest.mark.parametrize(
  "delta,adv,value,grad",
  [([0.0002, -0.0004, 0.0005], 1.0, -1.000100, -0.333367),
   ([0.1, -0.2, 0.4], 1.0, -1.0004, 0.0),
   ([0.1, -0.2, 0.4], -1.0, 1.105171, 0.368390)],
)  # fmt: skip
def test_gspo_golden(delta, adv, value, grad):
  m = jnp.ones((1, 3), bool)
  old = jnp.full((1, 3), -1.0)
  fn = lambda x: losses.aggregate(
    losses.gspo_loss(x, old, jnp.array([adv]), m)[0], m, mode="seq_mean_token_mean",
    num_tokens=3.0, num_seqs=1.0,
  )  # fmt: skip
  logp = old + _f32([delta])
  np.testing.assert_allclose(fn(logp), value, atol=ATOL)
  np.testing.assert_allclose(jax.grad(fn)(logp), np.full((1, 3), grad), atol=ATOL)


@pytest.mark.parametrize(
  "adv,value,grad",
  [(1.0, -1.142631, [0, -0.380877, -0.380877]), (-1.0, 1.181360, [0.393787] * 3)],
)
def test_gmpo_golden(adv, value, grad):
  m = jnp.ones((1, 3), bool)
  fn = lambda x: losses.aggregate(
    losses.gmpo_loss(x, jnp.zeros((1, 3)), jnp.full((1, 3), adv), m)[0], m,
    mode="seq_mean_token_mean", num_tokens=3.0, num_seqs=1.0,
  )  # fmt: skip
  logp = _f32([[0.5, -0.1, 0.1]])
  np.testing.assert_allclose(fn(logp), value, atol=ATOL)
  np.testing.assert_allclose(jax.grad(fn)(logp), [grad], atol=ATOL)


def test_cispo_golden():
  adv = _f32([[1, 1, -1]])
  logp = _f32([[-0.5, -1.0, -2.0]])
  old = logp - jnp.log(_f32([[1.5, 0.9, 0.5]]))
  fn = lambda x: losses.cispo_loss(x, old, adv, weight_min=0.8, weight_max=1.28)
  loss, grad = _value_and_token_grad(fn, logp)
  np.testing.assert_allclose(loss, [[0.64, 0.9, -1.6]], atol=ATOL)
  np.testing.assert_allclose(grad, [[-1.28, -0.9, 0.8]], atol=ATOL)
  _, grad = _value_and_token_grad(lambda x: losses.cispo_loss(x, old, adv, weight_max=5.0), logp)
  np.testing.assert_allclose(grad, [[-1.5, -0.9, 0.5]], atol=ATOL)


def test_sapo_golden():
  fn = lambda x: losses.sapo_loss(x, jnp.zeros((1, 3)), _f32([[1, 1, -1]]))
  loss, grad = _value_and_token_grad(fn, np.log([[1.0, 1.5, 0.5]]))
  np.testing.assert_allclose(loss, [[-2.0, -2.489837, 1.415938]], atol=ATOL)
  np.testing.assert_allclose(grad, [[-1.0, -1.410022, 0.467070]], atol=ATOL)


def test_on_policy_gradients_equal_minus_advantage():
  """At r = 1 the clip-family gradients are the plain policy gradient -A (PPO, GPPO, CISPO, SAPO)."""
  logp, _, adv, _ = _random_inputs(5)
  for fn in (
    lambda x: losses.ppo_clip_loss(x, logp, adv, dual_clip=3.0),
    lambda x: losses.gppo_loss(x, logp, adv),
    lambda x: losses.cispo_loss(x, logp, adv),
    lambda x: losses.sapo_loss(x, logp, adv),
    lambda x: losses.policy_gradient_loss(x, logp, adv),
  ):
    np.testing.assert_allclose(_value_and_token_grad(fn, logp)[1], -adv, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Surrogates: float64 NumPy references on random inputs


def _np_ppo(logp, old, adv, lo, hi, c, preserve=False):
  r = np.exp(np.clip(logp - old, -20, 20))
  loss = np.maximum(-adv * r, -adv * np.clip(r, 1 - lo, 1 + hi))
  high, low = (adv > 0) & (r > 1 + hi), (adv < 0) & (r < 1 - lo)
  grad = np.where(high | low, 0.0, -adv * r)
  if preserve:
    grad = np.where(high, -adv * (1 + hi), np.where(low, -adv * (1 - lo), grad))
  if c is not None:
    dual = (adv < 0) & (loss > -adv * c)
    loss = np.where(dual, -adv * c, loss)
    grad = np.where(dual, 0.0, grad)
  return loss, grad


@pytest.mark.parametrize("seed", [0, 1])
def test_ppo_and_gppo_numpy_reference(seed):
  logp, old, adv, _ = _random_inputs(seed)
  for preserve, c in ((False, None), (False, 1.5), (True, 1.5)):
    fn = lambda x, p=preserve, c=c: losses.ppo_clip_loss(
      x, old, adv, clip_low=0.2, clip_high=0.28, dual_clip=c, gradient_preserving=p
    )
    loss, grad = _value_and_token_grad(fn, logp)
    want_loss, want_grad = _np_ppo(logp, old, adv, 0.2, 0.28, c, preserve)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-5)


def test_gspo_gmpo_numpy_reference_and_finite_difference():
  logp, old, adv_tok, mask = _random_inputs(2)
  old = logp + np.random.default_rng(9).normal(0, 0.05, logp.shape)
  adv = adv_tok[:, 0]  # per-sequence advantages
  n = mask.sum(1)

  def np_gspo(lp):
    s = np.exp(np.minimum(((lp - old) * mask).sum(1) / n, 10.0))[:, None]
    return np.maximum(-adv[:, None] * s, -adv[:, None] * np.clip(s, 1 - 0.05, 1 + 0.06))

  def np_gmpo(lp):
    d = lp - old
    a = adv[:, None]
    dt = np.where(a > 0, np.minimum(d, 0.1), np.maximum(d, -0.1))
    return np.broadcast_to(-a * np.exp((dt * mask).sum(1, keepdims=True) / n[:, None]), d.shape)

  cases = (
    (np_gspo, lambda x: losses.gspo_loss(x, old, adv, mask, clip_low=0.05, clip_high=0.06)),
    (np_gmpo, lambda x: losses.gmpo_loss(x, old, adv, mask, clip_low=0.1, clip_high=0.1)),
  )
  for np_fn, jax_fn in cases:
    np.testing.assert_allclose(
      jax_fn(_f32(logp))[0] * mask, np_fn(logp) * mask, rtol=1e-5, atol=1e-6
    )
    # Central finite differences of the float64 reference, aggregated seq_mean_token_mean.
    agg = lambda per_tok: ((per_tok * mask).sum(1) / n).mean()
    fd = np.zeros_like(logp)
    for idx in np.ndindex(logp.shape):
      e = np.zeros_like(logp)
      e[idx] = 1e-6
      fd[idx] = (agg(np_fn(logp + e)) - agg(np_fn(logp - e))) / 2e-6
    got = jax.grad(lambda x, f=jax_fn: losses.aggregate(
      f(x)[0], mask, mode="seq_mean_token_mean", num_tokens=float(n.sum()),
      num_seqs=float(len(n))))(_f32(logp))  # fmt: skip
    np.testing.assert_allclose(got, fd, atol=2e-5)


def test_cispo_sapo_numpy_reference():
  logp, old, adv, _ = _random_inputs(3)
  r = np.exp(logp - old)
  w = np.clip(r, 0.7, 1.2)
  loss, grad = _value_and_token_grad(
    lambda x: losses.cispo_loss(x, old, adv, weight_min=0.7, weight_max=1.2), logp
  )
  np.testing.assert_allclose(loss, -w * adv * logp, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(grad, -w * adv, rtol=1e-5, atol=1e-6)
  tau = np.where(adv > 0, 1.0, 1.05)
  sig = 1 / (1 + np.exp(-tau * (r - 1)))
  loss, grad = _value_and_token_grad(lambda x: losses.sapo_loss(x, old, adv), logp)
  np.testing.assert_allclose(loss, -adv * 4 / tau * sig, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(grad, -adv * 4 * sig * (1 - sig) * r, rtol=1e-5, atol=1e-6)


def test_surrogate_bad_inputs():
  with pytest.raises(ValueError, match=r"logp\[2, 3\].*old_logp\[2, 4\]"):
    losses.ppo_clip_loss(jnp.zeros((2, 3)), jnp.zeros((2, 4)), jnp.zeros((2, 3)))
  with pytest.raises(ValueError, match=r"advantages must be .*\[2, 3\].*got shape \[3\]"):
    losses.sapo_loss(jnp.zeros((2, 3)), jnp.zeros((2, 3)), jnp.zeros((3,)))
  with pytest.raises(ValueError, match=r"rank 2"):
    losses.gspo_loss(jnp.zeros((2, 3, 1)), jnp.zeros((2, 3, 1)), jnp.zeros(2), jnp.ones((2, 3)))


# ---------------------------------------------------------------------------------------------
# Selections and weights (§3.7-3.10)

COV_A = _f32([[1, 1, 1, -1, -1, -1]])
COV_LOGP = _f32([[-0.1, -2.0, -0.5, -0.2, -3.0, -1.0]])
COV_M = jnp.ones((1, 6), bool)


def test_covariance_golden_kl_cov_and_clip_cov():
  stats = losses.kl_cov_stats(COV_LOGP, COV_A, COV_M, kl_cov_ratio=2e-4)
  scores = losses.covariance_scores(
    COV_LOGP, COV_A, COV_M, adv_mean=stats.adv_mean, logp_mean=stats.logp_mean
  )
  np.testing.assert_allclose(
    scores, [[1.033333, -0.866667, 0.633333, -0.933333, 1.866667, -0.133333]], atol=ATOL
  )
  np.testing.assert_array_equal(
    losses.kl_cov_mask(COV_LOGP, COV_A, COV_M, stats), [[0, 0, 0, 0, 1, 0]]
  )
  noise = _f32([[0.9, 0.1, 0.2, 0.3, 0.5, 0.4]])
  for ratio, want in ((0.5, [1, 0, 0, 0, 1, 0]), (2e-4, [0, 0, 0, 0, 1, 0])):  # k = 3 / k = 1
    st = losses.clip_cov_stats(COV_LOGP, COV_LOGP, COV_A, COV_M, noise, clip_cov_ratio=ratio)
    got = losses.clip_cov_mask(COV_LOGP, COV_LOGP, COV_A, COV_M, noise, st)
    np.testing.assert_array_equal(got, [want])
  # A candidate already clipped by PPO (A > 0, r = 1.5 > 1.28) is not a candidate.
  old = COV_LOGP - jnp.log(_f32([[1.5, 1, 1, 1, 1, 1]]))
  st = losses.clip_cov_stats(COV_LOGP, old, COV_A, COV_M, noise, clip_cov_ratio=0.5)
  np.testing.assert_array_equal(losses.clip_cov_mask(COV_LOGP, old, COV_A, COV_M, noise, st),
                                [[0, 0, 0, 0, 1, 0]])  # fmt: skip


def test_high_entropy_golden_and_numpy_reference():
  h = _f32([[2.0, 0.1, 0.5, 3.0, 0.2, 1.0, 0.05, 0.3, 0.4, 0.6]])
  m = jnp.ones((1, 10), bool)
  thr = losses.high_entropy_threshold(h, m, top_entropy_frac=0.2)
  np.testing.assert_allclose(thr, 2.0)
  np.testing.assert_array_equal(np.flatnonzero(losses.high_entropy_mask(h, m, thr)), [0, 3])
  rng = np.random.default_rng(6)
  h = rng.uniform(0, 4, (5, 8))
  mask = rng.uniform(size=(5, 8)) < 0.7
  k = int(np.ceil(0.3 * mask.sum()))
  want = np.zeros_like(mask)
  flat = np.flatnonzero(mask)
  want.flat[flat[np.argsort(-h.flat[flat])[:k]]] = True
  thr = losses.high_entropy_threshold(_f32(h), mask, top_entropy_frac=0.3)
  np.testing.assert_array_equal(losses.high_entropy_mask(_f32(h), mask, thr), want)


def test_steer_golden():
  p = _f32([[0.9, 0.3, 0.5]])
  omega = losses.steer_omega(jnp.log(p), jnp.log(p), _f32([[1, 1, -1]]), _f32([[0.4, 1.5, 0.7]]))
  np.testing.assert_allclose(omega, [[0.029464, 0.207219, 0.003426]], atol=1e-6)
  lo, hi = losses.steer_omega_range(omega, jnp.ones((1, 3), bool))
  w = losses.steer_weights(omega, omega_min=lo, omega_max=hi, mode="exp", weight_min=0.8)
  np.testing.assert_allclose(w, [[0.968770, 0.8, 0.996317]], atol=1e-6)
  w = losses.steer_weights(omega, omega_min=lo, omega_max=hi, mode="linear")
  np.testing.assert_allclose(w, [[1.148894, 0.8, 1.2]], atol=1e-6)
  flat = losses.steer_weights(omega, omega_min=hi, omega_max=hi, mode="linear")
  np.testing.assert_allclose(flat, [[1.0, 1.0, 1.0]])


MM_OLD = _f32([[0.0, 0.5, -1.5, 2.0]])
MM_SMP = jnp.zeros((1, 4))
MM_M = jnp.ones((1, 4), bool)


@pytest.mark.parametrize(
  "mode,low,high,want",
  [("token_truncate", None, 2.0, [1, 1.648721, 0.223130, 2]),
   ("token_truncate", 0.5, 2.0, [1, 1.648721, 0.5, 2]),
   ("token_mask", 0.5, 2.0, [1, 1.648721, 0, 0]),
   ("seq_mask", None, 3.0, [2.718282] * 4),
   ("seq_mask", None, 2.0, [0.0] * 4),
   ("seq_truncate", None, 2.0, [2.0] * 4),
   ("geo_mask", 0.5, 2.0, [1, 1.648721, 0.223130, 7.389056]),
   ("geo_mask", 0.5, 1.2, [0.0] * 4),
   ("none", None, None, [1.0] * 4)],
)  # fmt: skip
def test_mismatch_weights_golden(mode, low, high, want):
  w = losses.mismatch_weights(MM_OLD, MM_SMP, MM_M, mode=mode, low=low, high=high)
  np.testing.assert_allclose(w, [want], rtol=1e-5)


def test_mismatch_ignores_padding_and_opsm():
  m = jnp.array([[1, 1, 0, 0]], bool)  # the padded tokens must not enter the sequence ratio
  w = losses.mismatch_weights(MM_OLD, MM_SMP, m, mode="seq_truncate", high=None)
  np.testing.assert_allclose(w, np.full((1, 4), np.exp(0.5)), rtol=1e-5)
  logp = _f32([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]])
  smp = _f32([[-0.5, -0.5], [-0.5, -0.5], [-1.0, -1.0]])
  keep = losses.opsm_mask(logp, smp, _f32([-1.0, 1.0, -1.0]), jnp.ones((3, 2), bool), threshold=0.3)
  np.testing.assert_array_equal(keep, [[0, 0], [1, 1], [1, 1]])


def test_selections_and_weights_numpy_reference_random():
  logp, old, adv, mask = _random_inputs(11, (5, 8))
  rng = np.random.default_rng(12)
  noise = rng.uniform(size=logp.shape)
  entropy = rng.uniform(0, 3, logp.shape)
  smp = old + rng.normal(0, 0.4, logp.shape)
  m = mask.astype(float)
  n = mask.sum()
  valid = np.flatnonzero(mask)
  # Covariance scores and the KL-Cov top-k.
  c = (adv - (adv * m).sum() / n) * (logp - (logp * m).sum() / n) * m
  stats = losses.kl_cov_stats(_f32(logp), _f32(adv), mask, kl_cov_ratio=0.1)
  got_c = losses.covariance_scores(_f32(logp), _f32(adv), mask, adv_mean=stats.adv_mean,
                                   logp_mean=stats.logp_mean)  # fmt: skip
  np.testing.assert_allclose(got_c, c, rtol=1e-5, atol=1e-6)
  k = max(1, int(0.1 * n))
  want = np.zeros(mask.shape, bool)
  want.flat[valid[np.argsort(-c.flat[valid])[:k]]] = True
  np.testing.assert_array_equal(losses.kl_cov_mask(_f32(logp), _f32(adv), mask, stats), want)
  # Clip-Cov: the k smallest noise values among unclipped candidates with lb < c < ub.
  r = np.exp(logp - old)
  clipped = ((adv > 0) & (r > 1.28)) | ((adv < 0) & (r < 0.8))
  cand = mask & (c > 0.05) & (c < 5.0) & ~clipped
  kw = dict(cov_low=0.05, cov_high=5.0)
  st = losses.clip_cov_stats(
    _f32(logp), _f32(old), _f32(adv), mask, _f32(noise), clip_cov_ratio=0.1, **kw
  )
  got = losses.clip_cov_mask(_f32(logp), _f32(old), _f32(adv), mask, _f32(noise), st, **kw)
  idx = np.flatnonzero(cand)
  want = np.zeros(mask.shape, bool)
  want.flat[idx[np.argsort(noise.flat[idx])[:k]]] = True
  assert want.sum() == min(k, cand.sum()) > 0
  np.testing.assert_array_equal(got, want)
  # STEER.
  p = np.clip(np.exp(logp), 1e-8, 1 - 1e-8)
  omega = np.abs(adv / np.clip(np.exp(old), 1e-8, 1) * p * (1 - p) * (np.log(p) + entropy))
  got_omega = losses.steer_omega(_f32(logp), _f32(old), _f32(adv), _f32(entropy))
  np.testing.assert_allclose(got_omega, omega, rtol=1e-4, atol=1e-6)
  lo, hi = losses.steer_omega_range(got_omega, mask)
  np.testing.assert_allclose([lo, hi], [omega[mask].min(), omega[mask].max()], rtol=1e-4)
  kappa = -np.log(0.8) / max(omega[mask].max(), 0.02)
  w = losses.steer_weights(got_omega, omega_min=lo, omega_max=hi, weight_min=0.8)
  np.testing.assert_allclose(w, np.clip(np.exp(-kappa * omega), 0.8, 1.0), rtol=1e-4)
  # Mismatch weights.
  log_rho = old - smp
  rho = np.exp(log_rho)
  seq = np.exp((log_rho * m).sum(1, keepdims=True))
  geo = np.exp((log_rho * m).sum(1, keepdims=True) / m.sum(1, keepdims=True))
  cases = {
    "token_truncate": np.clip(rho, 0.5, 2.0),
    "token_mask": np.where((rho >= 0.5) & (rho <= 2.0), rho, 0.0),
    "seq_truncate": np.broadcast_to(np.clip(seq, 0.5, 2.0), rho.shape),
    "seq_mask": np.broadcast_to(np.where((seq >= 0.5) & (seq <= 2.0), seq, 0.0), rho.shape),
    "geo_mask": np.where((geo >= 0.5) & (geo <= 2.0), rho, 0.0),
  }
  for mode, want in cases.items():
    got = losses.mismatch_weights(_f32(old), _f32(smp), mask, mode=mode, low=0.5, high=2.0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=mode)
  # OPSM.
  gap = ((smp - logp) * m).sum(1) / m.sum(1)
  a_row = (adv * m).sum(1) / m.sum(1)
  keep = ~((a_row < 0) & (gap > 0.1))
  got = losses.opsm_mask(_f32(logp), _f32(smp), _f32(adv), mask, threshold=0.1)
  np.testing.assert_array_equal(got, np.broadcast_to(keep[:, None], mask.shape))


def test_statistics_of_empty_scope_select_nothing():
  z = jnp.zeros((2, 3))
  m = jnp.zeros((2, 3), bool)
  assert not bool(losses.high_entropy_mask(z, m, losses.high_entropy_threshold(z, m)).any())
  st = losses.kl_cov_stats(z, z, m)
  assert not bool(losses.kl_cov_mask(z, z, m, st).any())
  st = losses.clip_cov_stats(z, z, z, m, z)
  assert not bool(losses.clip_cov_mask(z, z, z, m, z, st).any())
  lo, hi = losses.steer_omega_range(z, m)
  assert float(lo) == 0.0 and float(hi) == 0.0
