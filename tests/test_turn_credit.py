"""Turn-level credit: AGENTS.md §2 goldens, float64 NumPy references with missing turns, jit, grads."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.advantages import turns as tc

N = np.nan
R_GOLDEN = np.array([[1, 0, 1], [0, 1, N], [1, 1, 0]], np.float32)
ATOL = 1e-5


@functools.cache
def jit(fn, **static):
  return jax.jit(functools.partial(fn, **static))


def _turn_rewards(seed, num_prompts=4, group_size=5, num_turns=4):
  """Random per-turn rewards; each row reaches a random prefix of turns (NaN after), with ties,
  a fully missing row, a constant group at one turn and a turn reached by one rollout only."""
  rng = np.random.default_rng(seed)
  r = rng.normal(size=(num_prompts * group_size, num_turns)).round(1)
  lengths = rng.integers(1, num_turns + 1, size=r.shape[0])
  lengths[0] = 0
  lengths[group_size : 2 * group_size] = [num_turns] + [1] * (group_size - 1)
  r[np.arange(num_turns)[None, :] >= lengths[:, None]] = np.nan
  r[2 * group_size : 3 * group_size, 0] = 0.3
  return r


# ----------------------------------------------------------------------------- NumPy references


def np_returns(r, gamma):
  out = np.full_like(r, np.nan)
  for b in range(r.shape[0]):
    for k in range(r.shape[1]):
      if np.isfinite(r[b, k]):
        out[b, k] = sum(
          gamma ** (j - k) * r[b, j] for j in range(k, r.shape[1]) if np.isfinite(r[b, j])
        )
  return out


def _std(x, ddof=1):
  return np.sqrt(np.sum((x - x.mean()) ** 2) / (len(x) - ddof)) if len(x) > ddof else 0.0


def np_turn_norm(x, group_size, use_std, min_count=2, eps=1e-6):
  out = np.zeros_like(x)
  for p in range(x.shape[0] // group_size):
    rows = slice(p * group_size, (p + 1) * group_size)
    for k in range(x.shape[1]):
      col = x[rows, k]
      ok = np.isfinite(col)
      vals = col[ok]
      if len(vals) < min_count or np.all(vals == vals[0]):
        continue
      a = col - vals.mean()
      if use_std:
        a = a / (_std(vals) + eps)
      out[rows, k] = np.where(ok, a, 0.0)
  return out


def np_batch_z(x, eps=1e-6):
  ok = np.isfinite(x)
  vals = x[ok]
  return np.where(ok, (x - vals.mean()) / (_std(vals) + eps), 0.0)


def np_depth(x, gamma):
  g = np_returns(x, gamma)
  out = np.zeros_like(x)
  for b in range(x.shape[0]):
    num = np.isfinite(x[b]).sum()
    for t in range(x.shape[1]):
      if np.isfinite(x[b, t]):
        out[b, t] = g[b, t] / np.sqrt(num - t)
  return out


# ----------------------------------------------------------------------------- goldens


def test_golden_discounted_returns():
  got = jit(tc.discounted_turn_returns, gamma=0.9)(jnp.array([[0.0, 0.5, 1.0]]))
  np.testing.assert_allclose(got, [[1.26, 1.4, 1.0]], atol=ATOL)


def test_golden_turn_norm_mean_only():
  got = jit(tc.turn_group_normalize, group_size=3)(R_GOLDEN)
  want = [[1 / 3, -2 / 3, 0.5], [-2 / 3, 1 / 3, 0.0], [1 / 3, 1 / 3, -0.5]]
  np.testing.assert_allclose(got, want, atol=ATOL)


def test_golden_turn_norm_std():
  got = np.asarray(jit(tc.turn_group_normalize, group_size=3, use_std=True)(R_GOLDEN))
  np.testing.assert_allclose(got[:, 0], [0.5773, -1.1547, 0.5773], atol=1e-4)
  np.testing.assert_allclose(got[:, 2], [0.7071, 0.0, -0.7071], atol=1e-4)


def test_golden_turn_norm_min_count():
  """Turn 3 is reached by 2 rollouts: min_count=3 zeroes it and leaves turns 1-2 alone."""
  got = np.asarray(jit(tc.turn_group_normalize, group_size=3, min_count=3)(R_GOLDEN))
  np.testing.assert_array_equal(got[:, 2], 0.0)
  np.testing.assert_allclose(got[:, 0], [1 / 3, -2 / 3, 1 / 3], atol=ATOL)


def test_golden_mapo():
  got = jit(tc.mapo_advantages, group_size=3, mix=0.5)(R_GOLDEN)
  want = [[0.651, -1.1812, 0.7158], [-1.1812, 0.651, 0.0], [0.651, 0.651, -0.9574]]
  np.testing.assert_allclose(got, want, atol=1e-4)


def test_golden_depth_scaling():
  got = jit(tc.depth_scaled_returns, gamma=1.0)(jnp.array([[0.5, -0.2, 1.0], [0.5, 1.0, N]]))
  np.testing.assert_allclose(got[0], [0.7506, 0.5657, 1.0], atol=1e-4)
  np.testing.assert_allclose(got[1], [1.5 / np.sqrt(2), 1.0, 0.0], atol=1e-5)


def test_golden_geometric_and_gate_and_episode_return():
  reached = jnp.array([[True, True, True], [True, False, False]])
  got = jit(tc.geometric_outcome_credit, gamma=0.5)(jnp.array([1.0, 2.0]), reached)
  np.testing.assert_allclose(got, [[0.25, 0.5, 1.0], [2.0, N, N]], atol=ATOL)
  gated = jit(tc.gated_return, threshold=0.5)(
    jnp.array([1.0, 0.0, N]), jnp.array([[0.1, 0.2], [0.1, 0.2], [0.3, N]])
  )
  np.testing.assert_allclose(gated, [1.3, 0.0, N], atol=ATOL)
  np.testing.assert_allclose(jit(tc.episode_return)(R_GOLDEN), [1.0, 1.0, 0.0])
  np.testing.assert_allclose(jit(tc.episode_return, mode="sum")(R_GOLDEN), [2.0, 1.0, 2.0])
  none = jit(tc.episode_return)(jnp.array([[N, N]]))
  assert np.isnan(np.asarray(none)).all()


def test_golden_turn_clip_range():
  got = jit(tc.turn_clip_range, epsilon=0.2, coef=0.5)(jnp.array([[0.0, 1.0, N]]))
  np.testing.assert_allclose(got, [[0.2, 0.2 * (1 + 0.5 * np.tanh(1.0)), 0.2]], atol=1e-6)


def test_golden_broadcast_to_tokens():
  values = jnp.array([[0.5, -1.0, N]])
  turn_index = jnp.array([[0, 0, 1, 1, 0, 2, 2, 2, 0]])
  got = jit(tc.turn_values_to_tokens)(values, turn_index)
  np.testing.assert_allclose(got, [[0, 0, 0.5, 0.5, 0, -1, -1, -1, 0]])


# ----------------------------------------------------------------------------- references


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("use_std, min_count", [(False, 2), (True, 2), (True, 3)])
def test_turn_norm_matches_numpy(seed, use_std, min_count):
  r = _turn_rewards(seed)
  got = jit(tc.turn_group_normalize, group_size=5, use_std=use_std, min_count=min_count)(r)
  np.testing.assert_allclose(got, np_turn_norm(r, 5, use_std, min_count), atol=ATOL)


def test_turn_norm_valid_mask_equals_nan():
  r = _turn_rewards(3)
  valid = np.random.default_rng(3).random(r.shape) > 0.2
  fn = jit(tc.turn_group_normalize, group_size=5, use_std=True)
  np.testing.assert_allclose(fn(r, valid=valid), fn(np.where(valid, r, np.nan)), atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
def test_returns_mapo_matchtir_a2tgpo_match_numpy(seed):
  r = _turn_rewards(seed)
  ok = np.isfinite(r)
  np.testing.assert_allclose(
    jit(tc.discounted_turn_returns, gamma=0.8)(r), np_returns(r, 0.8), atol=ATOL
  )
  want_mapo = np.where(ok, 0.3 * np_turn_norm(r, 5, True) + 0.7 * np_batch_z(r), 0.0)
  np.testing.assert_allclose(
    jit(tc.mapo_advantages, group_size=5, mix=0.3)(r), want_mapo, atol=ATOL
  )
  total = np.where(ok.any(-1), np.nansum(r, -1), np.nan)[:, None]
  want_mt = np.where(
    ok, 0.5 * (np_turn_norm(total, 5, True) + np_turn_norm(np_returns(r, 0.9), 5, True)), 0.0
  )
  np.testing.assert_allclose(jit(tc.matchtir_advantages, group_size=5)(r), want_mt, atol=ATOL)
  x = np.where(ok, np_turn_norm(r, 5, True), np.nan)
  np.testing.assert_allclose(
    jit(tc.a2tgpo_advantages, group_size=5, gamma=0.9)(r), np_depth(x, 0.9), atol=ATOL
  )


def test_broadcast_matches_numpy():
  rng = np.random.default_rng(0)
  values = rng.normal(size=(3, 4)).astype(np.float32)
  turn_index = rng.integers(0, 5, size=(3, 11))
  want = np.where(turn_index > 0, values[np.arange(3)[:, None], np.maximum(turn_index - 1, 0)], 0)
  np.testing.assert_allclose(jit(tc.turn_values_to_tokens)(values, turn_index), want)


# ----------------------------------------------------------------------------- properties


@pytest.mark.parametrize(
  "name, kw",
  [
    ("turn_group_normalize", {"group_size": 5, "use_std": True}),
    ("mapo_advantages", {"group_size": 5}),
    ("matchtir_advantages", {"group_size": 5}),
    ("a2tgpo_advantages", {"group_size": 5}),
  ],
)
def test_gradient_through_estimator_is_finite(name, kw):
  """Advantages are stop-gradient constants for the loss, but a gradient through them stays
  finite (double-where divisions) and is 0 on missing turns."""
  r = jnp.asarray(_turn_rewards(4))
  weights = jnp.asarray(np.random.default_rng(1).normal(size=r.shape), jnp.float32)
  fn = getattr(tc, name)
  grad = np.asarray(jax.jit(jax.grad(lambda x: jnp.sum(weights * fn(x, **kw))))(r))
  assert np.isfinite(grad).all()
  np.testing.assert_array_equal(grad[~np.isfinite(np.asarray(r))], 0.0)


def test_group_permutation_invariance():
  """Permuting the rollouts inside a group permutes the advantages the same way."""
  r = _turn_rewards(5)
  perm = np.concatenate([p * 5 + np.random.default_rng(p).permutation(5) for p in range(4)])
  fn = jit(tc.turn_group_normalize, group_size=5, use_std=True)
  np.testing.assert_allclose(np.asarray(fn(r))[perm], fn(r[perm]), atol=1e-6)


def test_shape_errors_name_shapes():
  with pytest.raises(ValueError, match="does not divide"):
    tc.turn_group_normalize(jnp.zeros((5, 3)), group_size=2)
  with pytest.raises(ValueError, match=r"\[B, K\]"):
    tc.discounted_turn_returns(jnp.zeros(3))
  with pytest.raises(ValueError, match="differ in B"):
    tc.turn_values_to_tokens(jnp.zeros((2, 3)), jnp.zeros((3, 4), jnp.int32))
  with pytest.raises(ValueError, match="mode"):
    tc.episode_return(jnp.zeros((2, 3)), mode="last")
