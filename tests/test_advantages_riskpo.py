"""RiskPO (METHODS.md §2.8): goldens, a loop reference with a threaded tracker, properties."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import advantages as adv

ATOL = 1e-5
EPS = 1e-6


@functools.cache
def jit(fn, **static):
  return jax.jit(functools.partial(fn, **static))


def _rewards(seed, num_prompts=6, group_size=5):
  rng = np.random.default_rng(seed)
  r = rng.integers(0, 2, (num_prompts, group_size)).astype(np.float64)
  r += rng.integers(0, 2, r.shape) * 0.5  # non-binary, with ties
  r[rng.random(r.shape) < 0.15] = np.nan
  r[4, :] = np.nan  # bundle 2 has a question with no valid response -> K = 0
  return r


# ----------------------------------------------------------------------------- reference


def np_riskpo(r, bundle_size, alpha, beta, w, credit, tracked=None, mode="batch", seek=False):
  """Loops over bundles/papers; ``tracked`` = (q_down, q_up) from the tracker (or None)."""
  out = np.zeros_like(r)
  all_scores = []
  for nb in range(r.shape[0] // bundle_size):
    qs = list(range(nb * bundle_size, (nb + 1) * bundle_size))
    idx = {q: [g for g in range(r.shape[1]) if np.isfinite(r[q, g])] for q in qs}
    num_papers = min(len(v) for v in idx.values())
    if num_papers == 0:
      continue
    scores = np.array([sum(r[q, idx[q][k]] for q in qs) for k in range(num_papers)])
    all_scores += list(scores)
    q_a, q_b = np.quantile(scores, alpha), np.quantile(scores, beta)
    if tracked is not None and mode == "track":
      q_a, q_b = tracked
    elif tracked is not None and mode == "mix":
      q_a, q_b = (q_a + tracked[0]) / 2, (q_b + tracked[1]) / 2
    std = np.std(scores, ddof=1) if num_papers > 1 else 1.0
    for k, s in enumerate(scores):
      a_r = (max(s - q_a, 0) - max(s - q_b, 0) + q_a - q_b) / (beta - alpha + EPS)
      if seek:
        a = (w * max(s - q_b, 0) / (1 - beta + EPS) + a_r) / (w + 1)
      else:
        a = (w * -max(q_a - s, 0) / (alpha + EPS) + a_r) / (w + 1)
      a /= std + EPS
      den = sum(r[q, idx[q][k]] - np.mean(r[q, idx[q]]) for q in qs)
      for q in qs:
        g = idx[q][k]
        vals = r[q, idx[q]]
        if credit == "uniform":
          out[q, g] = a
        elif credit == "std":
          s_q = np.std(vals, ddof=1) if len(vals) > 1 else 0.0
          out[q, g] = a / ((s_q if s_q > 1e-3 else 1.0) + EPS)
        elif credit == "score":
          out[q, g] = (0.5 if r[q, g] > 0 else 1.5) * a
        else:
          centred = r[q, g] - np.mean(vals)
          out[q, g] = a / bundle_size if abs(den) < 1e-6 else a * centred / den
  return out, np.array(all_scores)


def np_tracker(q, initialized, scores, levels, lr):
  if not initialized:
    return np.array([np.quantile(scores, t) for t in levels])
  return np.array([q[i] + lr * (t - np.mean(scores < q[i])) for i, t in enumerate(levels)])


# ----------------------------------------------------------------------------- goldens


GOLDEN_R = jnp.array([[1.0, 0, 1, 1], [0, 0, 1, 0]])
GOLDEN_PAPER_A = np.array([-0.489897, -2.974365, 0.0, -0.489897])


@pytest.mark.parametrize(
  "credit,scale",
  [("std", np.full((2, 4), 1 / (0.5 + EPS))), ("uniform", np.ones((2, 4))),
   ("score", np.array([[0.5, 1.5, 0.5, 0.5], [1.5, 1.5, 0.5, 1.5]]))],
)  # fmt: skip
def test_golden_one_bundle(credit, scale):
  fn = jit(adv.riskpo_advantages, bundle_size=2, quantile_mode="batch", credit=credit)
  got, state = fn(GOLDEN_R, None)
  assert state is None
  np.testing.assert_allclose(got, scale * GOLDEN_PAPER_A[None, :], atol=ATOL)
  if credit == "std":
    np.testing.assert_allclose(got[0], [-0.979791, -5.948717, 0, -0.979791], atol=ATOL)


def test_golden_tracker_step():
  state = adv.RiskPOState(
    quantiles=jnp.array([0.6, 1.7]), initialized=jnp.array(True), levels=(0.2, 0.9)
  )
  new = jit(adv.riskpo_tracker_update)(state, jnp.array([2.0, 2, 1, 0]), jnp.ones(4, bool))
  np.testing.assert_allclose(new.quantiles, [0.595, 1.74], atol=ATOL)
  assert new.levels == (0.2, 0.9) and bool(new.initialized)
  # First step: the empirical quantiles ([0,1,1,2] -> 0.6 at 0.2, 1.7 at 0.9).
  empty = dataclasses.replace(state, initialized=jnp.array(False))
  first = jit(adv.riskpo_tracker_update)(empty, jnp.array([1.0, 0, 2, 1, 9]), jnp.arange(5) < 4)
  np.testing.assert_allclose(first.quantiles, [0.6, 1.7], atol=ATOL)


def test_state_is_threaded_and_used_next_step():
  """Step 1 uses batch quantiles and sets the tracker; step 2 reads the tracked values."""
  state = adv.riskpo_init(levels=(0.2, 0.9))
  fn = jit(adv.riskpo_advantages, bundle_size=2, credit="uniform", quantile_mode="track")
  a1, state = fn(GOLDEN_R, state)
  np.testing.assert_allclose(a1[0], GOLDEN_PAPER_A, atol=ATOL)
  np.testing.assert_allclose(state.quantiles, [0.6, 1.7], atol=ATOL)
  leaves = jax.tree.leaves(state)
  assert len(leaves) == 2  # levels are static metadata
  a2, state2 = fn(GOLDEN_R, state)  # same batch, tracked == batch values -> same result
  np.testing.assert_allclose(a2, a1, atol=ATOL)
  # Scores [1, 0, 2, 1]: 1/4 below 0.6 and 3/4 below 1.7.
  want = [0.6 + 0.1 * (0.2 - 0.25), 1.7 + 0.1 * (0.9 - 0.75)]
  np.testing.assert_allclose(state2.quantiles, want, atol=ATOL)


# ----------------------------------------------------------------------------- reference


@pytest.mark.parametrize(
  "credit,seek", [("std", False), ("uniform", True), ("score", False), ("sum_mean", False)]
)
def test_batch_mode_matches_numpy(credit, seek):
  r = _rewards(0)
  fn = jit(adv.riskpo_advantages, bundle_size=2, quantile_mode="batch", credit=credit,
           risk_mode="seeking" if seek else "mixed")  # fmt: skip
  got, _ = fn(jnp.asarray(r, jnp.float32), None)
  want, _ = np_riskpo(r, 2, 0.2, 0.9, 1.5, credit, seek=seek)
  np.testing.assert_allclose(got, want, atol=ATOL)
  assert np.isfinite(np.asarray(got)).all()
  if not seek and credit != "sum_mean":  # sum_mean credit may flip signs per response
    assert (np.asarray(got) <= 1e-6).all()  # mixed VaR with the natural baseline: A <= 0


@pytest.mark.parametrize("mode", ["track", "mix"])
def test_three_steps_with_tracker_match_numpy(mode):
  levels = adv.DEFAULT_LEVELS
  state = adv.riskpo_init()
  q, initialized = np.zeros(len(levels)), False
  i_a, i_b = levels.index(0.2), levels.index(0.9)
  fn = jit(adv.riskpo_advantages, bundle_size=3, quantile_mode=mode, credit="std")
  for step in range(3):
    r = _rewards(10 + step)
    got, state = fn(jnp.asarray(r, jnp.float32), state)
    tracked = (q[i_a], q[i_b]) if initialized else None
    want, scores = np_riskpo(r, 3, 0.2, 0.9, 1.5, "std", tracked=tracked, mode=mode)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-5)
    q, initialized = np_tracker(q, initialized, scores, levels, 0.1), True
    np.testing.assert_allclose(state.quantiles, q, atol=ATOL)


# ----------------------------------------------------------------------------- invariances


def test_bundle_split_and_question_permutation():
  r = jnp.asarray(_rewards(20), jnp.float32)
  fn = jit(adv.riskpo_advantages, bundle_size=2, quantile_mode="batch")
  base, _ = fn(r, None)
  split = jnp.concatenate([fn(r[:2], None)[0], fn(r[2:], None)[0]])
  np.testing.assert_allclose(split, base, atol=0)
  # Questions may be reordered inside a bundle (paper scores are sums over questions).
  perm = jnp.array([1, 0, 3, 2, 5, 4])
  np.testing.assert_allclose(fn(r[perm], None)[0], base[perm], atol=ATOL)
  all_nan, _ = fn(jnp.full((4, 3), jnp.nan), None)
  np.testing.assert_array_equal(all_nan, 0.0)


def test_bad_inputs():
  with pytest.raises(ValueError, match=r"B_q = 4 does not divide .* P = 6 .*\(6, 5\)"):
    adv.riskpo_advantages(jnp.zeros((6, 5)), None, bundle_size=4, quantile_mode="batch")
  with pytest.raises(ValueError, match="needs a RiskPOState"):
    adv.riskpo_advantages(jnp.zeros((6, 5)), None, bundle_size=2)
  with pytest.raises(ValueError, match="credit"):
    adv.riskpo_advantages(jnp.zeros((6, 5)), None, credit="sum-mean", quantile_mode="batch")
  with pytest.raises(ValueError, match=r"rank 2.*\(30,\)"):
    adv.riskpo_advantages(jnp.zeros(30), None, quantile_mode="batch")
