"""Group advantage estimators: goldens (METHODS.md §2), float64 NumPy references, invariances."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import advantages as adv

ATOL = 1e-5


@functools.cache
def jit(fn, **static):
  """One compiled program per (function, hyperparameters): eager op-by-op dispatch is slow."""
  return jax.jit(functools.partial(fn, **static))


def _rewards(seed, num_prompts=5, group_size=6, nan_frac=0.15, binary=False):
  rng = np.random.default_rng(seed)
  if binary:
    r = rng.integers(0, 2, (num_prompts, group_size)).astype(np.float64)
  else:
    r = rng.normal(size=(num_prompts, group_size)).round(1)  # ties on purpose
  r[rng.random(r.shape) < nan_frac] = np.nan
  r[0] = 0.7  # a zero-variance group
  r[1, :] = np.nan  # a fully failed group
  r[2, 1:] = np.nan  # a single valid sample
  return r


# ----------------------------------------------------------------------------- references


def _np_std(x, ddof):
  return np.sqrt(np.sum((x - x.mean()) ** 2) / (len(x) - ddof)) if len(x) > ddof else 0.0


def np_group_norm(r, mean_scope, std_scope, ddof=1, eps=1e-6):
  out = np.zeros_like(r)
  ok = np.isfinite(r)
  allv = r[ok]
  for p in range(r.shape[0]):
    vals = r[p][ok[p]]
    const = len(vals) < 2 or np.all(vals == vals[0])
    for g in range(r.shape[1]):
      if not ok[p, g]:
        continue
      mean = {"group": vals.mean(), "rollout": allv.mean(), "none": 0.0}[mean_scope]
      a = r[p, g] - mean
      if std_scope == "group":
        a /= _np_std(vals, ddof) + eps
      elif std_scope == "rollout":
        a /= _np_std(allv, ddof) + eps
      out[p, g] = 0.0 if ("group" in (mean_scope, std_scope) and const) else a
  return out


def np_rloo(r):
  out = np.zeros_like(r)
  for p in range(r.shape[0]):
    idx = [g for g in range(r.shape[1]) if np.isfinite(r[p, g])]
    if len(idx) < 2:
      continue
    for g in idx:
      others = [r[p, j] for j in idx if j != g]
      out[p, g] = r[p, g] - sum(others) / len(others)
  return out


def np_canon(r, metric, alpha, beta, lam, max_length):
  out = np.zeros_like(r)
  for p in range(r.shape[0]):
    idx = [g for g in range(r.shape[1]) if np.isfinite(r[p, g])]
    if len(idx) < 2:
      continue
    idx = sorted(idx, key=lambda g: (metric[p, g], g))
    low, high = idx[: len(idx) // 2], idx[len(idx) // 2 :]
    mu_l = np.mean([r[p, g] for g in low]) if low else 0.0
    mu_h = np.mean([r[p, g] for g in high])
    for g in high:
      out[p, g] = lam * (r[p, g] - alpha * mu_l + beta) + (1 - lam) * (r[p, g] - mu_h)
    for g in low:
      out[p, g] = lam * (alpha * r[p, g] - mu_h - beta) + (1 - lam) * (r[p, g] - mu_l)
  return out / max_length


def np_copo(r, ids, k, b0, penalty, eps=1e-6):
  num_prompts, group_size = r.shape
  ent, glob, has = np.zeros(num_prompts), np.zeros(num_prompts), np.zeros(num_prompts, bool)
  for p in range(num_prompts):
    idx = [g for g in range(group_size) if np.isfinite(r[p, g])]
    if not idx:
      continue
    has[p] = True
    answers = [ids[p, g] for g in idx]
    for a in set(answers):
      f = answers.count(a) / len(answers)
      ent[p] -= f * np.log2(f)
    glob[p] = np.mean([r[p, g] for g in idx])
    if penalty:
      glob[p] *= 1 - (1 - 1 / group_size) / np.log2(group_size) * ent[p]
  gvals = glob[has]
  gadv = np.where(has, (glob - gvals.mean()) / (_np_std(gvals, 1) + eps), 0.0)
  local = np_group_norm(r, "group", "group")
  weight = np.where(np.isfinite(r) & (local != 0), 1 / (1 + np.exp(-k * (ent - b0)))[:, None], 0)
  return np.where(np.isfinite(r), gadv[:, None], 0.0), local, weight, ent


# ----------------------------------------------------------------------------- goldens


def test_goldens_grpo_family():
  r = jnp.array([[1.0, 0, 0, 0]])
  np.testing.assert_allclose(
    jit(adv.grpo_advantages)(r), [[1.499997, -0.499999, -0.499999, -0.499999]], atol=ATOL
  )
  np.testing.assert_allclose(
    jit(adv.dr_grpo_advantages)(r), [[0.75, -0.25, -0.25, -0.25]], atol=ATOL
  )
  np.testing.assert_allclose(jit(adv.rloo_advantages)(r), [[1, -1 / 3, -1 / 3, -1 / 3]], atol=ATOL)
  lite = jit(adv.lite_ppo_advantages)(jnp.array([[1.0, 0, 0, 0], [1, 1, 1, 0]]))
  a, b = 1.403119, 0.467706
  np.testing.assert_allclose(lite, [[a, -b, -b, -b], [b, b, b, -a]], atol=ATOL)


def test_golden_remax():
  out = jit(adv.remax_advantages)(jnp.array([[1.0], [0.0], [1.0]]), jnp.array([0.0, 1.0, jnp.nan]))
  np.testing.assert_allclose(out, [[1.0], [-1.0], [0.0]], atol=ATOL)


def test_golden_canon():
  r, ent = jnp.array([[1.0, 0, 1, 1]]), jnp.array([[0.9, 0.2, 0.5, 0.7]])
  out = jit(adv.canon_advantages)(r, ent)
  np.testing.assert_allclose(out * 8192, [[0.5, -1, 0, 0.5]], atol=ATOL)
  out = jit(adv.canon_advantages, lam=0.5, max_length=1.0)(r, ent)
  np.testing.assert_allclose(out, [[0.25, -0.75, 0.25, 0.25]], atol=ATOL)


def test_golden_copo():
  r = jnp.array([[1.0, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 1]])
  ids = jnp.array([[4, 4, 5, 7], [4, 4, 4, 5], [4, 4, 4, 4], [1, 1, 2, 1]])
  out = jit(adv.copo_advantages)(r, ids)
  np.testing.assert_allclose(out.answer_entropy[:2], [1.5, 0.811278], atol=ATOL)
  np.testing.assert_allclose(out.local_weight[0], 1 - 2.1e-9, atol=ATOL)
  np.testing.assert_allclose(out.local_weight[1], 0.998026, atol=ATOL)
  np.testing.assert_allclose(out.local_weight[2], 0.0)  # consensus group: purely global
  # R^glob = [0.25, 0.75, 1, 0.75] -> same A^glob as the golden [1,0,0.5,0.75] shifted/scaled.
  glob = np.array([0.25, 0.75, 1.0, 0.75])
  want = (glob - glob.mean()) / (glob.std(ddof=1) + 1e-6)
  np.testing.assert_allclose(out.global_advantages[:, 0], want, atol=ATOL)
  # The golden R^glob = [1, 0, 0.5, 0.75] -> A^glob = [1.024693, -1.317462, -0.146385, 0.439154].
  r2 = jnp.array([[1.0, 1], [0, 0], [1, 0], [1, 0.5]])
  out2 = jit(adv.copo_advantages)(r2, jnp.zeros((4, 2), jnp.int32))
  want2 = [1.024693, -1.317462, -0.146385, 0.439154]
  np.testing.assert_allclose(out2.global_advantages[:, 0], want2, atol=ATOL)


def test_golden_copo_entropy_penalty_lambda():
  # G = 8, λ = 0.291667; answers split 4/4 -> H = 1 bit; R^glob multiplied by 1 - λ.
  r = jnp.array([[1.0] * 4 + [0.0] * 4, [1.0] * 8, [0.0] * 8])
  ids = jnp.array([[0] * 4 + [1] * 4, [0] * 8, [0] * 8])
  out = jit(adv.copo_advantages, entropy_penalty=True)(r, ids)
  glob = np.array([0.5 * (1 - 0.291667), 1.0, 0.0])
  want = (glob - glob.mean()) / (glob.std(ddof=1) + 1e-6)
  np.testing.assert_allclose(out.global_advantages[:, 0], want, atol=ATOL)


def test_helpers_golden():
  a = jnp.array([[1.0, 2.0], [3.0, 4.0]])
  mask = jnp.array([[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1]], bool)
  np.testing.assert_allclose(
    jit(adv.to_tokens)(a, mask), [[1, 1, 0], [2, 0, 0], [0, 0, 0], [4, 4, 4]], atol=0
  )
  np.testing.assert_array_equal(
    jit(adv.to_groups, group_size=3)(jnp.arange(6)), [[0, 1, 2], [3, 4, 5]]
  )
  outcomes = jnp.array([[1.0, 1, 1], [0, 1, 0], [jnp.nan, 1, jnp.nan], [0, jnp.nan, 0]])
  np.testing.assert_array_equal(jit(adv.zero_variance_groups)(outcomes), [True, False, True, True])
  np.testing.assert_allclose(jit(adv.gradient_group_fraction)(outcomes), 0.25)
  metrics = jit(adv.zero_variance_metrics)(outcomes)
  np.testing.assert_allclose(metrics["groups/zero_var_frac"], (3.0, 4.0))
  np.testing.assert_allclose(metrics["groups/grad_frac"], (1.0, 4.0))
  # Phantom advantage: shaped rewards vary, the outcome does not -> A = 0 under both policies.
  shaped = jnp.array([[0.1, -0.2, 0.0], [0.0, 1.0, 0.0], [1.0, 2.0, 3.0], [0.0, 0.5, 0.0]])
  a = jit(adv.grpo_advantages)(shaped)
  zero_var = jit(adv.zero_variance_groups)(outcomes)
  kept, rows = jit(adv.handle_zero_variance, handling="keep")(a, zero_var)
  np.testing.assert_allclose(np.asarray(kept)[[0, 2, 3]], 0.0)
  np.testing.assert_allclose(kept[1], a[1])
  assert bool(rows.all())
  _, rows = jit(adv.handle_zero_variance, handling="mask")(a, zero_var)
  np.testing.assert_array_equal(rows[:, 0], [False, True, False, False])


# ----------------------------------------------------------------------------- references


@pytest.mark.parametrize(
  "mean_scope,std_scope,ddof",
  [("group", "group", 1), ("group", "none", 1), ("group", "rollout", 1), ("rollout", "rollout", 0),
   ("none", "group", 0)],
)  # fmt: skip
def test_group_normalized_matches_numpy(mean_scope, std_scope, ddof):
  r = _rewards(0)
  fn = functools.partial(
    adv.group_normalized_advantages, mean_scope=mean_scope, std_scope=std_scope, std_ddof=ddof
  )
  out = jax.jit(fn)(jnp.asarray(r, jnp.float32))
  want = np_group_norm(r, mean_scope, std_scope, ddof)
  np.testing.assert_allclose(out, want, atol=ATOL, rtol=1e-5)


def test_rloo_remax_match_numpy():
  r = _rewards(1)
  np.testing.assert_allclose(jax.jit(adv.rloo_advantages)(jnp.asarray(r)), np_rloo(r), atol=ATOL)
  greedy = np.random.default_rng(1).normal(size=r.shape[0])
  want = np.where(np.isfinite(r), r - greedy[:, None], 0.0)
  got = jax.jit(adv.remax_advantages)(jnp.asarray(r), jnp.asarray(greedy))
  np.testing.assert_allclose(got, want, atol=ATOL)


@pytest.mark.parametrize("alpha,beta,lam", [(1.0, 0.0, 1.0), (0.8, 0.1, 0.3)])
def test_canon_matches_numpy(alpha, beta, lam):
  r = _rewards(2, group_size=7)
  metric = np.random.default_rng(2).random(r.shape).round(1)  # ties: broken by index
  fn = functools.partial(adv.canon_advantages, alpha=alpha, beta=beta, lam=lam, max_length=4.0)
  got = jax.jit(fn)(jnp.asarray(r), jnp.asarray(metric))
  np.testing.assert_allclose(got, np_canon(r, metric, alpha, beta, lam, 4.0), atol=ATOL)


@pytest.mark.parametrize("penalty", [False, True])
def test_copo_matches_numpy(penalty):
  r = _rewards(3, binary=True)
  ids = np.random.default_rng(3).integers(0, 3, r.shape)
  fn = functools.partial(adv.copo_advantages, entropy_penalty=penalty, sharpness=3.0)
  got = jax.jit(fn)(jnp.asarray(r), jnp.asarray(ids))
  for g, w in zip(got, np_copo(r, ids, 3.0, 0.5, penalty), strict=True):
    np.testing.assert_allclose(g, w, atol=ATOL)


# ----------------------------------------------------------------------------- invariances


def _all_group_fns():
  metric = jnp.asarray(np.random.default_rng(7).random((5, 6)))
  ids = jnp.asarray(np.random.default_rng(8).integers(0, 3, (5, 6)))
  greedy = jnp.linspace(-1.0, 1.0, 5)
  return {
    "grpo": lambda r, perm: jit(adv.grpo_advantages)(r),
    "dr_grpo": lambda r, perm: jit(adv.dr_grpo_advantages)(r),
    "lite_ppo": lambda r, perm: jit(adv.lite_ppo_advantages)(r),
    "rloo": lambda r, perm: jit(adv.rloo_advantages)(r),
    "remax": lambda r, perm: jit(adv.remax_advantages)(r, greedy[perm[0]]),
    "canon": lambda r, perm: jit(adv.canon_advantages)(r, _apply(metric, perm)),
    "copo_local_weight": lambda r, perm: (
      jit(adv.copo_advantages)(r, _apply(ids, perm)).local_weight
    ),
    "copo_global": lambda r, perm: jit(adv.copo_advantages)(r, _apply(ids, perm)).global_advantages,
  }


def _apply(x, perm):
  rows, cols = perm
  return jnp.take_along_axis(x[rows], cols, axis=1)


@pytest.mark.parametrize("name", list(_all_group_fns()))
def test_permutation_invariance(name):
  """Permuting prompts and the samples inside each group permutes the advantages the same way."""
  fn = _all_group_fns()[name]
  r = jnp.asarray(_rewards(4))
  rng = np.random.default_rng(4)
  identity = (jnp.arange(5), jnp.tile(jnp.arange(6), (5, 1)))
  perm = (jnp.asarray(rng.permutation(5)), jnp.asarray(np.argsort(rng.random((5, 6)), axis=1)))
  base = fn(r, identity)
  np.testing.assert_allclose(fn(_apply(r, perm), perm), _apply(base, perm), atol=ATOL)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "remax", "canon", "copo_local_weight"])
def test_batch_split_invariance(name):
  """Group-scope estimators give the same advantages on any split of the prompts."""
  r = jnp.asarray(_rewards(5))
  metric = jnp.asarray(np.random.default_rng(9).random((5, 6)))
  ids = jnp.asarray(np.random.default_rng(10).integers(0, 3, (5, 6)))
  greedy = jnp.linspace(-1.0, 1.0, 5)
  fns = {
    "grpo": lambda s: jit(adv.grpo_advantages)(r[s]),
    "dr_grpo": lambda s: jit(adv.dr_grpo_advantages)(r[s]),
    "rloo": lambda s: jit(adv.rloo_advantages)(r[s]),
    "remax": lambda s: jit(adv.remax_advantages)(r[s], greedy[s]),
    "canon": lambda s: jit(adv.canon_advantages)(r[s], metric[s]),
    "copo_local_weight": lambda s: jit(adv.copo_advantages)(r[s], ids[s]).local_weight,
  }
  fn = fns[name]
  split = jnp.concatenate([fn(slice(0, 2)), fn(slice(2, 3)), fn(slice(3, 5))])
  np.testing.assert_allclose(split, fn(slice(0, 5)), atol=0)


@pytest.mark.parametrize("name", list(_all_group_fns()))
def test_failed_and_masked_groups_are_finite_and_zero(name):
  fn = _all_group_fns()[name]
  r = jnp.asarray(_rewards(6))
  identity = (jnp.arange(5), jnp.tile(jnp.arange(6), (5, 1)))
  out = np.asarray(fn(r, identity))
  assert np.isfinite(out).all()
  np.testing.assert_allclose(out[~np.isfinite(np.asarray(r))], 0.0)
  np.testing.assert_array_equal(fn(jnp.full_like(r, jnp.nan), identity), 0.0)
  masked = jit(adv.grpo_advantages)(r, valid=jnp.zeros(r.shape, bool))  # valid=False everywhere
  np.testing.assert_array_equal(masked, 0.0)


def test_nan_is_not_zero_reward():
  """A failed reward is excluded: same advantages as if the sample were absent."""
  with_nan = jnp.array([[1.0, 0.0, jnp.nan, 0.0]])
  np.testing.assert_allclose(
    np.asarray(jit(adv.grpo_advantages)(with_nan))[0, [0, 1, 3]],
    jit(adv.grpo_advantages)(jnp.array([[1.0, 0, 0]]))[0],
  )
  masked = jit(adv.grpo_advantages)(
    jnp.array([[1.0, 0, 5.0, 0]]), valid=jnp.array([[1, 1, 0, 1]], bool)
  )
  np.testing.assert_allclose(masked, jit(adv.grpo_advantages)(with_nan).at[0, 2].set(0.0))


# ----------------------------------------------------------------------------- bad input


def test_bad_inputs_name_shapes():
  r = jnp.zeros((2, 4))
  with pytest.raises(ValueError, match=r"rank 2.*\(8,\)"):
    adv.grpo_advantages(jnp.zeros(8))
  with pytest.raises(ValueError, match=r"rewards\[2, 4\].*valid\[2, 3\]"):
    adv.rloo_advantages(r, valid=jnp.ones((2, 3), bool))
  with pytest.raises(ValueError, match=r"G = 3 does not divide the batch B = 8"):
    adv.to_groups(jnp.zeros(8), group_size=3)
  with pytest.raises(ValueError, match=r"\(2, 4\).*\(6, 5\)"):
    adv.to_tokens(r, jnp.ones((6, 5), bool))
  with pytest.raises(ValueError, match=r"greedy_rewards.*\(3,\)"):
    adv.remax_advantages(r, jnp.zeros(3))
  with pytest.raises(ValueError, match=r"rewards\[2, 4\].*metric\[2, 5\]"):
    adv.canon_advantages(r, jnp.zeros((2, 5)))
  with pytest.raises(ValueError, match=r"answer_ids.*\(8,\)"):
    adv.copo_advantages(r, jnp.zeros(8, jnp.int32))
  with pytest.raises(ValueError, match="std_scope"):
    adv.group_normalized_advantages(r, std_scope="batch")
  with pytest.raises(ValueError, match="handling"):
    adv.handle_zero_variance(r, jnp.zeros(2, bool), handling="drop")
  with pytest.raises(ValueError, match=r"\(3,\).*\(2, 4\)"):
    adv.handle_zero_variance(r, jnp.zeros(3, bool))
  with pytest.raises(ValueError, match=r"\(8,\)"):  # raised at trace time, under jit too
    jax.jit(adv.dr_grpo_advantages)(jnp.zeros(8))


def test_sequence_estimators_map_uniform_convention():
  """Every entry takes (rewards [P, G], *, valid=) and equals the named function."""
  r = jnp.asarray(_rewards(11))
  valid = jnp.asarray(np.random.default_rng(11).random(r.shape) > 0.2)
  assert adv.SEQUENCE_ESTIMATORS["grpo"] is adv.grpo_advantages
  assert adv.SEQUENCE_ESTIMATORS["grpo_passk"] is adv.max_at_g_advantages
  for name, fn in adv.SEQUENCE_ESTIMATORS.items():
    kw = {"k": 2} if name in ("passk_training", "pkpo") else {}
    out = np.asarray(jit(fn, **kw)(r, valid=valid))
    assert out.shape == r.shape and np.isfinite(out).all(), name
    dropped = ~np.asarray(valid) | ~np.isfinite(np.asarray(r))
    np.testing.assert_array_equal(out[dropped], 0.0, err_msg=name)
    assert np.abs(out).max() > 0, name


@pytest.mark.parametrize("name", ["grpo", "lite_ppo", "rloo", "passk_training", "pkpo"])
def test_gradient_through_estimator_is_finite(name):
  """The trainer stop-gradients advantages, but a gradient through them is still finite
  (double-where divisions / sqrt), even with constant, single-sample and failed groups."""
  fn = adv.SEQUENCE_ESTIMATORS[name]
  kw = {"k": 2} if name in ("passk_training", "pkpo") else {}
  r = jnp.asarray(_rewards(12))
  weights = jnp.asarray(np.random.default_rng(12).normal(size=r.shape))
  grad = jax.jit(jax.grad(lambda x: jnp.sum(weights * fn(x, **kw))))(r)
  assert np.isfinite(np.asarray(grad)).all()
  np.testing.assert_array_equal(np.asarray(grad)[~np.isfinite(np.asarray(r))], 0.0)
