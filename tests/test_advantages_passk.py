"""Pass@k estimators: goldens (METHODS.md §2.7) and brute-force enumeration over k-subsets."""

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import advantages as adv

ATOL = 1e-5


@functools.cache
def jit(fn, **static):
  return jax.jit(functools.partial(fn, **static))


def _rewards(seed, binary, num_prompts=6, group_size=6):
  rng = np.random.default_rng(seed)
  if binary:
    r = rng.integers(0, 2, (num_prompts, group_size)).astype(np.float64)
  else:
    r = rng.normal(size=(num_prompts, group_size)).round(1)
  r[rng.random(r.shape) < 0.15] = np.nan
  r[0, :] = np.nan  # fully failed group
  r[1, 2:] = np.nan  # fewer valid samples than k for k > 2
  r[2, :] = 1.0  # all correct
  return r


# ----------------------------------------------------------------------------- references


def _valid(r, p):
  return [g for g in range(r.shape[1]) if np.isfinite(r[p, g])]


def brute_passk_training(r, k):
  out = np.zeros_like(r)
  for p in range(r.shape[0]):
    idx = _valid(r, p)
    if len(idx) < k:
      continue
    subsets = list(itertools.combinations(idx, k))
    vals = np.array([max(float(r[p, j] > 0.5) for j in s) for s in subsets])
    sigma = vals.std()
    if sigma == 0:
      continue
    z = (vals - vals.mean()) / sigma
    for g in idx:
      out[p, g] = np.mean([z[i] for i, s in enumerate(subsets) if g in s])
  return out


def brute_pkpo(r, k):
  out = np.zeros_like(r)
  for p in range(r.shape[0]):
    idx = _valid(r, p)
    if len(idx) < k:
      continue
    for g in idx:
      total = sum(max(r[p, j] for j in s) for s in itertools.combinations(idx, k) if g in s)
      out[p, g] = total / math.comb(len(idx), k)
  return out


def np_rloo(s, r, k):
  out = np.zeros_like(s)
  for p in range(s.shape[0]):
    idx = _valid(r, p)
    if len(idx) < max(k, 2):
      continue
    for g in idx:
      out[p, g] = s[p, g] - np.mean([s[p, j] for j in idx if j != g])
  return out


def np_max_at_g(r, eps=1e-6):
  out = np.zeros_like(r)
  for p in range(r.shape[0]):
    idx = _valid(r, p)
    if len(idx) < 2:
      continue
    vals = sorted((r[p, g] for g in idx), reverse=True)
    best = max(idx, key=lambda g: (r[p, g], -g))  # first argmax
    std = np.std([r[p, g] for g in idx], ddof=1)
    out[p, best] = (vals[0] - vals[1]) / (std + eps)
  return out


# ----------------------------------------------------------------------------- goldens


@pytest.mark.parametrize(
  "n,c,k,pos,neg", [(4, 1, 2, 1.0, -1 / 3), (5, 2, 3, 1 / 3, -2 / 9), (8, 1, 4, 1.0, -1 / 7)]
)
def test_golden_passk_training(n, c, k, pos, neg):
  r = jnp.array([[1.0] * c + [0.0] * (n - c)])
  out = jit(adv.passk_training_advantages, k=k)(r)
  np.testing.assert_allclose(out, [[pos] * c + [neg] * (n - c)], atol=ATOL)


def test_golden_pkpo_max_at_g_pass_at_k():
  r = jnp.array([[0.0, 1.0, 0.0, 0.0]])
  np.testing.assert_allclose(jit(adv.pkpo_rewards, k=2)(r), [[1 / 6, 0.5, 1 / 6, 1 / 6]], atol=ATOL)
  np.testing.assert_allclose(jit(adv.max_at_g_advantages)(r), [[0, 1.999996, 0, 0]], atol=ATOL)
  np.testing.assert_allclose(jit(adv.pass_at_k, k=2)(r), [0.5], atol=ATOL)  # 1 - C(3,2)/C(4,2)
  # pass@k metric on a 3-sample group with one failure: n = 2 < k = 3 -> undefined (NaN).
  assert np.isnan(jit(adv.pass_at_k, k=3)(jnp.array([[1.0, 0.0, jnp.nan]]))[0])
  # Ties at the top give 0 everywhere.
  np.testing.assert_allclose(jit(adv.max_at_g_advantages)(jnp.array([[1.0, 1.0, 0.0]])), 0.0)


def test_passk_k1_is_grpo_with_population_std():
  r = jnp.array([[1.0, 0.0, 0.0, 1.0, 1.0]])
  got = jit(adv.passk_training_advantages, k=1)(r)
  want = jit(adv.grpo_advantages, std_ddof=0, epsilon=0.0)(r)
  np.testing.assert_allclose(got, want, atol=ATOL)


# ----------------------------------------------------------------------------- references


@pytest.mark.parametrize("k", [1, 2, 3, 6])
def test_passk_training_matches_enumeration(k):
  r = _rewards(k, binary=True)
  got = jit(adv.passk_training_advantages, k=k)(jnp.asarray(r, jnp.float32))
  np.testing.assert_allclose(got, brute_passk_training(r, k), atol=ATOL)


@pytest.mark.parametrize("k,binary", [(1, False), (2, False), (3, True), (4, False), (6, False)])
def test_pkpo_matches_enumeration(k, binary):
  r = _rewards(10 + k, binary=binary)
  s = brute_pkpo(r, k)
  got = jit(adv.pkpo_rewards, k=k)(jnp.asarray(r, jnp.float32))
  np.testing.assert_allclose(got, s, atol=ATOL)
  got = jit(adv.pkpo_advantages, k=k)(jnp.asarray(r, jnp.float32))
  np.testing.assert_allclose(got, np_rloo(s, r, k), atol=ATOL)


def test_pkpo_binary_closed_form():
  """Binary rewards: s = k/n if correct, (k/n)(1 - C(n-1-c,k-1)/C(n-1,k-1)) otherwise."""
  n, c, k = 7, 3, 3
  r = jnp.array([[1.0] * c + [0.0] * (n - c)])
  neg = k / n * (1 - math.comb(n - 1 - c, k - 1) / math.comb(n - 1, k - 1))
  want = [[k / n] * c + [neg] * (n - c)]
  np.testing.assert_allclose(jit(adv.pkpo_rewards, k=k)(r), want, atol=ATOL)


def test_max_at_g_and_pass_at_k_match_numpy():
  r = _rewards(20, binary=False)
  got = jit(adv.max_at_g_advantages)(jnp.asarray(r, jnp.float32))
  np.testing.assert_allclose(got, np_max_at_g(r), atol=ATOL)
  rb = _rewards(21, binary=True)
  want = []
  for p in range(rb.shape[0]):
    idx = _valid(rb, p)
    c = sum(rb[p, g] > 0.5 for g in idx)
    n = len(idx)
    want.append(1 - math.comb(n - c, 3) / math.comb(n, 3) if n >= 3 else np.nan)
  np.testing.assert_allclose(jit(adv.pass_at_k, k=3)(jnp.asarray(rb)), want, atol=ATOL)


# ----------------------------------------------------------------------------- invariances


FNS = {
  "passk_training": jit(adv.passk_training_advantages, k=3),
  "pkpo": jit(adv.pkpo_advantages, k=3),
  "max_at_g": jit(adv.max_at_g_advantages),
}


@pytest.mark.parametrize("name", list(FNS))
def test_permutation_split_and_failure_invariances(name):
  fn = FNS[name]
  r = jnp.asarray(_rewards(30, binary=name == "passk_training"), jnp.float32)
  base = np.asarray(fn(r))
  assert np.isfinite(base).all()
  np.testing.assert_allclose(base[0], 0.0)  # fully failed group
  np.testing.assert_allclose(base[~np.isfinite(np.asarray(r))], 0.0)
  cols = np.argsort(np.random.default_rng(31).random(r.shape), axis=1)
  permuted = fn(jnp.take_along_axis(r, jnp.asarray(cols), axis=1))
  np.testing.assert_allclose(permuted, np.take_along_axis(base, cols, axis=1), atol=ATOL)
  split = np.concatenate([fn(r[:2]), fn(r[2:])])
  np.testing.assert_allclose(split, base, atol=0)


def test_bad_k():
  with pytest.raises(ValueError, match=r"k must be an int in \[1, G = 4\], got 5"):
    adv.passk_training_advantages(jnp.zeros((2, 4)), k=5)
  with pytest.raises(ValueError, match=r"got 0"):
    adv.pkpo_rewards(jnp.zeros((2, 4)), k=0)
  with pytest.raises(ValueError, match=r"rank 2.*\(8,\)"):
    adv.pass_at_k(jnp.zeros(8), k=2)
