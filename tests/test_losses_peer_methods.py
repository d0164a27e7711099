"""The peers' objectives in ``losses/recipes_peers.py`` (verl ``core_algos``, TRL ``GRPOTrainer``):
for each, golden numbers and a NumPy reference of the peer's formula (loss and gradient) on random
inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import losses

B, T = 6, 5


def _f32(x):
  return jnp.asarray(x, jnp.float32)


def _random(seed=0):
  rng = np.random.default_rng(seed)
  logp = -rng.uniform(0.05, 2.5, (B, T))
  mask = np.arange(T)[None] < np.array([5, 3, 4, 1, 5, 2])[:, None]
  adv = np.repeat(rng.normal(size=(B, 1)), T, 1)
  return logp, logp + rng.normal(0, 0.4, (B, T)), adv, mask


def _run(name, logp, old, adv, mask, **kw):
  """(loss, d loss / d logp, metrics) of objective ``name`` with the batch's own normalisers."""
  n_tok = float(mask.sum())
  n_seq = float(mask.any(1).sum())
  fn = lambda x: losses.OBJECTIVES[name](x, _f32(old), _f32(adv), jnp.asarray(mask),
                                         num_tokens=n_tok, num_seqs=n_seq, **kw)  # fmt: skip
  (loss, metrics), grad = jax.value_and_grad(fn, has_aux=True)(_f32(logp))
  return float(loss), np.asarray(grad), losses.finalize_metrics(metrics)


def _token_mean(per_token, mask):
  return float((per_token * mask).sum() / mask.sum())


def test_gpg_golden_and_reference():
  # l = -A logp: logp = [-1, -2], A = [2, -1] -> mean(2, -2) = 0; grad = -A / 2.
  loss, grad, _ = _run("gpg", np.array([[-1.0, -2.0]]), np.zeros((1, 2)),
                       np.array([[2.0, -1.0]]), np.ones((1, 2), bool))  # fmt: skip
  assert loss == pytest.approx(0.0, abs=1e-6)
  np.testing.assert_allclose(grad, [[-1.0, 0.5]], rtol=1e-6)
  logp, old, adv, mask = _random()
  loss, grad, _ = _run("gpg", logp, old, adv, mask)
  np.testing.assert_allclose(loss, _token_mean(-adv * logp, mask), rtol=1e-5)  # verl gpg
  np.testing.assert_allclose(grad, -adv * mask / mask.sum(), rtol=1e-5, atol=1e-7)


def _np_dppo(logp, old, adv, mask, divergence, lo=0.2, hi=0.2, cap=20.0):
  """verl compute_policy_loss_dppo_{tv,kl}: (per-token loss, d per-token / d logp)."""
  ratio = np.exp(np.clip(logp - old, -20, 20))
  w = np.minimum(ratio, cap)
  p, p_old = np.exp(logp), np.exp(old)
  if divergence == "tv":
    pos, neg = (p - p_old) <= hi, (p - p_old) >= -lo
  else:
    kl = p_old * (old - logp) + (1 - p_old) * np.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
    pos, neg = (kl <= hi) | (p <= p_old), (kl <= lo) | (p >= p_old)
  keep = np.where(adv > 0, pos, neg).astype(float)
  return -adv * w * logp * keep, -adv * w * keep


@pytest.mark.parametrize("divergence, lo, hi", [("tv", 0.03, 0.05), ("kl", 0.002, 0.004)])
def test_dppo_reference(divergence, lo, hi):
  logp, old, adv, mask = _random(1)
  loss, grad, metrics = _run(f"dppo_{divergence}", logp, old, adv, mask, clip_low=lo, clip_high=hi)
  per_token, dper = _np_dppo(logp, old, adv, mask, divergence, lo=lo, hi=hi)
  np.testing.assert_allclose(loss, _token_mean(per_token, mask), rtol=1e-5)
  np.testing.assert_allclose(grad, dper * mask / mask.sum(), rtol=1e-5, atol=1e-7)
  assert 0 < metrics["clip_frac/high"] + metrics["clip_frac/low"] < 1  # some tokens left out


def test_dppo_tv_golden():
  # p_old = 0.5; A = +1: p = 0.6 kept (dp 0.1 <= 0.2), p = 0.8 dropped (dp 0.3);
  # A = -1: p = 0.25 dropped (dp -0.25 < -0.2), p = 0.45 kept.
  old = np.log(np.full((1, 4), 0.5))
  logp = np.log(np.array([[0.6, 0.8, 0.25, 0.45]]))
  adv = np.array([[1.0, 1.0, -1.0, -1.0]])
  loss, grad, metrics = _run("dppo_tv", logp, old, adv, np.ones((1, 4), bool))
  r = np.exp(logp - old)
  np.testing.assert_allclose(grad, [[-r[0, 0] / 4, 0, 0, r[0, 3] / 4]], rtol=1e-5)
  np.testing.assert_allclose(loss, (-r[0, 0] * logp[0, 0] + r[0, 3] * logp[0, 3]) / 4, rtol=1e-5)
  assert metrics["clip_frac/high"] == pytest.approx(0.25) and metrics["clip_frac/low"] == 0.25


def test_dro_golden_and_reference():
  # logp = -1, old = -1.5, A = 2, beta = 0.1: l = -(2 * -1 - 0.05 * 0.25) = 2.0125;
  # dl/dlogp = -2 + 0.1 * 0.5 = -1.95.
  loss, grad, _ = _run("dro", np.array([[-1.0]]), np.array([[-1.5]]), np.array([[2.0]]),
                       np.ones((1, 1), bool))  # fmt: skip
  assert loss == pytest.approx(2.0125, rel=1e-6)
  np.testing.assert_allclose(grad, [[-1.95]], rtol=1e-6)
  logp, old, adv, mask = _random(2)
  loss, grad, _ = _run("dro", logp, old, adv, mask, dro_beta=0.3)
  want = -(logp * adv - 0.15 * (logp - old) ** 2)  # verl dro
  np.testing.assert_allclose(loss, _token_mean(want, mask), rtol=1e-5)
  np.testing.assert_allclose(grad, (-adv + 0.3 * (logp - old)) * mask / mask.sum(), rtol=1e-5,
                             atol=1e-7)  # fmt: skip
  with pytest.raises(ValueError, match="dro_beta"):
    _run("dro", logp, old, adv, mask, dro_beta=0.0)


def _np_vespo_phi(logp, old, adv, mask, k_pos=2.0, l_pos=3.0, k_neg=3.0, l_neg=2.0):
  """TRL get_gamma_weights: [B, 1]."""
  seq = (np.clip(logp - old, -20, 20) * mask).sum(-1, keepdims=True)
  log_w = np.clip(seq, np.log(1e-8), 20.0)
  a = adv[:, :1]
  k, lam = np.where(a >= 0, k_pos, k_neg), np.where(a >= 0, l_pos, l_neg)
  return np.exp(lam + k * log_w - lam * np.exp(log_w))


def test_vespo_golden_and_reference():
  # On-policy (w = 1): phi = e^{lambda + 0 - lambda} = 1, so VESPO is REINFORCE there.
  loss, grad, _ = _run("vespo", np.array([[-1.0, -2.0]]), np.array([[-1.0, -2.0]]),
                       np.array([[1.0, 1.0]]), np.ones((1, 2), bool))  # fmt: skip
  assert loss == pytest.approx(1.5, rel=1e-6)
  np.testing.assert_allclose(grad, [[-0.5, -0.5]], rtol=1e-6)
  # w = 2 (sum of log-ratios ln 2), A > 0: phi = 2^2 e^{3 (1 - 2)} = 4 e^-3.
  loss, grad, _ = _run("vespo", np.array([[np.log(2.0) - 1.0]]), np.array([[-1.0]]),
                       np.array([[1.0]]), np.ones((1, 1), bool))  # fmt: skip
  np.testing.assert_allclose(grad, [[-4 * np.exp(-3.0)]], rtol=1e-5)
  logp, old, adv, mask = _random(3)
  loss, grad, _ = _run("vespo", logp, old, adv, mask)
  phi = _np_vespo_phi(logp, old, adv, mask)
  np.testing.assert_allclose(loss, _token_mean(-phi * adv * logp, mask), rtol=1e-5)
  np.testing.assert_allclose(grad, -phi * adv * mask / mask.sum(), rtol=1e-5, atol=1e-7)


def _np_seq_ratio(logp, old, mask):
  return np.exp((np.clip(logp - old, -20, 20) * mask).sum(-1, keepdims=True) / mask.sum(-1,
                keepdims=True).clip(1))  # fmt: skip


def test_cispo_seq_golden_and_reference():
  # Row ratio s = exp(mean(ln 2, ln 8)) = 4 (< cap 5): grad = -4 A / N_tok per token.
  old = np.zeros((1, 2))
  loss, grad, _ = _run("cispo_seq", np.log([[2.0, 8.0]]), old, np.array([[1.0, 1.0]]),
                       np.ones((1, 2), bool))  # fmt: skip
  np.testing.assert_allclose(grad, [[-2.0, -2.0]], rtol=1e-5)
  logp, old, adv, mask = _random(4)
  old = old - 1.0  # some rows above the cap
  loss, grad, metrics = _run("cispo_seq", logp, old, adv, mask, weight_max=2.0)
  w = np.minimum(_np_seq_ratio(logp, old, mask), 2.0)  # TRL: clamp(coef_1, max=eps_high).detach()
  np.testing.assert_allclose(loss, _token_mean(-w * adv * logp, mask), rtol=1e-5)
  np.testing.assert_allclose(grad, -w * adv * mask / mask.sum(), rtol=1e-5, atol=1e-7)
  assert metrics["clip_frac/high"] > 0


def test_sapo_seq_golden_and_reference():
  # On-policy, A = 1, tau = 1: l = -4 sigmoid(0) = -2; dl/dlogp_t = -4 * 1/4 * 1 / n_b.
  loss, grad, _ = _run("sapo_seq", np.array([[-1.0, -2.0]]), np.array([[-1.0, -2.0]]),
                       np.array([[1.0, 1.0]]), np.ones((1, 2), bool))  # fmt: skip
  assert loss == pytest.approx(-2.0, rel=1e-6)
  np.testing.assert_allclose(grad, [[-0.5, -0.5]], rtol=1e-5)
  logp, old, adv, mask = _random(5)
  loss, grad, _ = _run("sapo_seq", logp, old, adv, mask)
  s = _np_seq_ratio(logp, old, mask)
  a = adv[:, :1]
  tau = np.where(a > 0, 1.0, 1.05)
  sig = 1 / (1 + np.exp(-tau * (s - 1)))
  n = mask.sum(-1, keepdims=True)
  rows = mask.any(-1, keepdims=True)
  want = float(np.sum(np.where(rows, -a * 4 / tau * sig, 0.0)) / rows.sum())  # TRL sapo seq
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  dl = -a * 4 * sig * (1 - sig) * s / n.clip(1) / rows.sum()
  np.testing.assert_allclose(grad, np.where(mask, dl, 0.0), rtol=1e-4, atol=1e-7)


def test_luspo_normalize_then_sum_golden_and_reference():
  # Two rows on-policy (s = 1, no clip), A = [1, -1], lengths 3 and 1:
  # L = (3 * -1 + 1 * 1) / 2 = -1; dL/dlogp = -A s / N_seq per valid token.
  mask = np.array([[1, 1, 1], [1, 0, 0]], bool)
  logp = -np.ones((2, 3))
  adv = np.array([[1.0] * 3, [-1.0] * 3])
  loss, grad, _ = _run("luspo", logp, logp, adv, mask)
  assert loss == pytest.approx(-1.0, rel=1e-6)
  np.testing.assert_allclose(grad, np.where(mask, -adv / 2, 0.0), rtol=1e-5)
  logp, old, adv, mask = _random(6)
  old = logp + 0.0005 * np.sign(np.random.default_rng(0).normal(size=logp.shape))
  loss, grad, _ = _run("luspo", logp, old, adv, mask)
  s = _np_seq_ratio(logp, old, mask)
  a = adv[:, :1]
  row = np.maximum(-a * s, -a * np.clip(s, 1 - 3e-4, 1 + 4e-4))  # TRL luspo: mean_b(l_b n_b)
  n = mask.sum(-1, keepdims=True)
  np.testing.assert_allclose(loss, float((row * n).sum() / mask.any(-1).sum()), rtol=1e-5)
