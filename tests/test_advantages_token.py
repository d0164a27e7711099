"""Token-level estimators (REINFORCE++, REINFORCE++-baseline, GAE): goldens and loop references."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import advantages as adv

ATOL = 1e-5


@functools.cache
def jit(fn, **static):
  return jax.jit(functools.partial(fn, **static))


def _batch(seed, num_prompts=3, group_size=4, num_tokens=7):
  """Rewards [P, G] with a NaN, and a [B, T] mask with holes (tool tokens) and an empty row."""
  rng = np.random.default_rng(seed)
  r = rng.integers(0, 2, (num_prompts, group_size)).astype(np.float64)
  r[0, 1] = np.nan
  lengths = rng.integers(1, num_tokens + 1, num_prompts * group_size)
  mask = np.arange(num_tokens)[None, :] < lengths[:, None]
  mask &= rng.random(mask.shape) > 0.15  # holes inside responses
  mask[3] = False  # an empty row
  old = rng.normal(size=mask.shape) * 0.3
  ref = rng.normal(size=mask.shape) * 0.3
  values = rng.normal(size=mask.shape)
  return r, mask, old, ref, values


# ----------------------------------------------------------------------------- references


def np_returns(u, m, gamma):
  out = np.zeros_like(u)
  for b in range(u.shape[0]):
    ret = 0.0
    for t in reversed(range(u.shape[1])):
      if m[b, t]:
        ret = u[b, t] + gamma * ret
        out[b, t] = ret
  return out


def np_whiten(x, m, ddof=1, eps=1e-8):
  vals = x[m]
  mean = vals.mean()
  var = np.sum((vals - mean) ** 2) / (len(vals) - ddof)
  return np.where(m, (x - mean) / np.sqrt(var + eps), 0.0)


def np_reinforce_pp(r, m, old, ref, kl_coef, gamma):
  flat = r.reshape(-1)
  m = m & np.isfinite(flat)[:, None]
  u = -kl_coef * (old - ref)
  for b in range(m.shape[0]):
    valid_t = np.nonzero(m[b])[0]
    if len(valid_t):
      u[b, valid_t[-1]] += flat[b]
  return np_whiten(np_returns(u, m, gamma), m)


def np_reinforce_pp_baseline(r, m):
  group_size = r.shape[1]
  flat = r.reshape(-1)
  m = m & np.isfinite(flat)[:, None]
  seq = np.zeros_like(flat)
  for b in range(len(flat)):
    p = b // group_size
    if np.isfinite(flat[b]):
      group = [x for x in r[p] if np.isfinite(x)]
      seq[b] = flat[b] - np.mean(group)
  return np_whiten(np.where(m, seq[:, None], 0.0), m)


def np_gae(u, v, m, gamma, lam):
  adv_out, ret_out = np.zeros_like(u), np.zeros_like(u)
  for b in range(u.shape[0]):
    next_v, next_a = 0.0, 0.0
    for t in reversed(range(u.shape[1])):
      if not m[b, t]:
        continue
      delta = u[b, t] + gamma * next_v - v[b, t]
      next_a = delta + gamma * lam * next_a
      next_v = v[b, t]
      adv_out[b, t], ret_out[b, t] = next_a, next_a + v[b, t]
  return adv_out, ret_out


# ----------------------------------------------------------------------------- goldens


def test_golden_reinforce_pp_baseline():
  r = jnp.array([[1.0, 0, 0, 0], [1, 1, 1, 0]])
  lengths = np.array([1, 2, 1, 2, 2, 1, 1, 1])
  mask = jnp.asarray(np.arange(3)[None, :] < lengths[:, None])
  out = np.asarray(jit(adv.reinforce_plus_plus_baseline_advantages)(r, mask))
  want = [1.884242, -0.554189, -0.554189, -0.554189, 0.665027, 0.665027, 0.665027, -1.773404]
  np.testing.assert_allclose(out[:, 0], want, atol=ATOL)
  np.testing.assert_allclose(out, np.where(mask, out[:, :1], 0.0), atol=0)


def test_golden_returns_and_kl_shaping():
  mask = jnp.ones((1, 3), bool)
  u = jnp.array([[-0.01, -0.02, 0.97]])
  np.testing.assert_allclose(jit(adv.discounted_returns)(u, mask), [[0.94, 0.95, 0.97]], atol=ATOL)
  # The same u from R = 1 on the last token and β (old - ref) = [0.01, 0.02, 0.03].
  fn = jit(adv.reinforce_plus_plus_advantages, whiten=False)
  got = fn(jnp.array([[1.0]]), mask, old_logp=jnp.array([[0.1, 0.2, 0.3]]),
           ref_logp=jnp.zeros((1, 3)), kl_coef=0.1)  # fmt: skip
  np.testing.assert_allclose(got, [[0.94, 0.95, 0.97]], atol=ATOL)
  # A masked hole is skipped: the return flows over it unchanged.
  hole = jnp.array([[True, False, True]])
  np.testing.assert_allclose(jit(adv.discounted_returns)(u, hole), [[0.96, 0.0, 0.97]], atol=ATOL)


def test_golden_gae_and_whiten():
  got_a, got_r = jit(adv.gae_advantages, whiten=False)(
    jnp.array([[0.0, 0, 1]]), jnp.array([[0.5, 0.6, 0.8]]), jnp.ones((1, 3), bool), lam=0.95
  )
  np.testing.assert_allclose(got_a, [[0.4705, 0.39, 0.2]], atol=ATOL)
  np.testing.assert_allclose(got_r, [[0.9705, 0.99, 1.0]], atol=ATOL)
  x, m = jnp.array([[1.0, 2.0], [3.0, 100.0]]), jnp.array([[1, 1], [1, 0]], bool)
  np.testing.assert_allclose(jit(adv.masked_whiten)(x, m), [[-1, 0], [1, 0]], atol=ATOL)


# ----------------------------------------------------------------------------- references


@pytest.mark.parametrize("kl_coef,gamma", [(0.0, 1.0), (0.05, 0.9)])
def test_reinforce_pp_matches_numpy(kl_coef, gamma):
  r, mask, old, ref, _ = _batch(0)
  got = jit(adv.reinforce_plus_plus_advantages)(
    jnp.asarray(r), jnp.asarray(mask), old_logp=jnp.asarray(old), ref_logp=jnp.asarray(ref),
    kl_coef=kl_coef, gamma=gamma,
  )  # fmt: skip
  np.testing.assert_allclose(got, np_reinforce_pp(r, mask, old, ref, kl_coef, gamma), atol=ATOL)


def test_reinforce_pp_baseline_matches_numpy():
  r, mask, *_ = _batch(1)
  got = jit(adv.reinforce_plus_plus_baseline_advantages)(jnp.asarray(r), jnp.asarray(mask))
  np.testing.assert_allclose(got, np_reinforce_pp_baseline(r, mask), atol=ATOL)


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.9)])
def test_gae_matches_numpy(gamma, lam):
  r, mask, old, _, values = _batch(2)
  u = np.where(np.isnan(old), 0.0, old)
  fn = jit(adv.gae_advantages, whiten=False)
  got_a, got_r = fn(jnp.asarray(u), jnp.asarray(values), jnp.asarray(mask), gamma=gamma, lam=lam)
  want_a, want_r = np_gae(u, values, mask, gamma, lam)
  np.testing.assert_allclose(got_a, want_a, atol=ATOL)
  np.testing.assert_allclose(got_r, want_r, atol=ATOL)
  got_w, _ = jit(adv.gae_advantages)(jnp.asarray(u), jnp.asarray(values), jnp.asarray(mask),
                                     gamma=gamma, lam=lam)  # fmt: skip
  np.testing.assert_allclose(got_w, np_whiten(want_a, mask), atol=ATOL)


# ----------------------------------------------------------------------------- invariances


def _token_fns():
  return {
    "reinforce_pp": lambda r, m, o, f, v: jit(adv.reinforce_plus_plus_advantages)(
      r, m, old_logp=o, ref_logp=f, kl_coef=0.1
    ),
    "reinforce_pp_baseline": lambda r, m, o, f, v: jit(adv.reinforce_plus_plus_baseline_advantages)(
      r, m
    ),
    "gae": lambda r, m, o, f, v: jit(adv.gae_advantages)(o, v, m)[0],
  }


@pytest.mark.parametrize("name", list(_token_fns()))
def test_padding_permutation_and_failure(name):
  fn = _token_fns()[name]
  r, mask, old, ref, values = (jnp.asarray(x) for x in _batch(3))
  base = np.asarray(fn(r, mask, old, ref, values))
  assert np.isfinite(base).all()
  np.testing.assert_allclose(base[~np.asarray(mask)], 0.0)
  if name != "gae":
    np.testing.assert_allclose(base[1], 0.0)  # the NaN-reward row
  # More right padding does not change anything on the original columns.
  pad = lambda x: jnp.pad(x, ((0, 0), (0, 3)))
  padded = fn(r, pad(mask), pad(old), pad(ref), pad(values))
  np.testing.assert_allclose(np.asarray(padded)[:, :7], base, atol=ATOL)
  np.testing.assert_allclose(np.asarray(padded)[:, 7:], 0.0)
  # Permuting samples inside each group permutes the rows of the output.
  cols = np.argsort(np.random.default_rng(3).random(r.shape), axis=1)
  rows = (np.arange(r.shape[0])[:, None] * r.shape[1] + cols).reshape(-1)
  got = fn(jnp.take_along_axis(r, jnp.asarray(cols), axis=1), mask[rows], old[rows], ref[rows],
           values[rows])  # fmt: skip
  np.testing.assert_allclose(got, base[rows], atol=ATOL)
  # Everything masked / failed: finite zeros.
  nan_r = jnp.full_like(r, jnp.nan)
  np.testing.assert_array_equal(fn(nan_r, jnp.zeros_like(mask), old, ref, values), 0.0)


def test_bad_inputs_name_shapes():
  r, mask = jnp.zeros((2, 4)), jnp.ones((6, 5), bool)
  with pytest.raises(ValueError, match=r"\(6, 5\).*B = P \* G = 2 \* 4 = 8"):
    adv.reinforce_plus_plus_advantages(r, mask)
  with pytest.raises(ValueError, match=r"\(6, 5\).*B = P \* G = 2 \* 4 = 8"):
    adv.reinforce_plus_plus_baseline_advantages(r, mask)
  mask = jnp.ones((8, 5), bool)
  with pytest.raises(ValueError, match=r"completion_mask\[8, 5\].*old_logp\[8, 4\]"):
    adv.reinforce_plus_plus_advantages(
      r, mask, old_logp=jnp.zeros((8, 4)), ref_logp=jnp.zeros((8, 5)), kl_coef=0.1
    )
  with pytest.raises(ValueError, match="ref_logp given without old_logp"):
    adv.reinforce_plus_plus_advantages(r, mask, ref_logp=jnp.zeros((8, 5)))
  with pytest.raises(ValueError, match=r"values\[8, 6\]"):
    adv.gae_advantages(jnp.zeros((8, 5)), jnp.zeros((8, 6)), mask)
  with pytest.raises(ValueError, match=r"rank 2.*\(40,\)"):
    adv.discounted_returns(jnp.zeros(40), mask)
