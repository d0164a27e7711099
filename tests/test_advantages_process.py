"""Dense credit (PRIME, PURE, step segmentation) and the RLPR / PRIME prompt filters: METHODS.md
goldens, float64 NumPy references, and invariance to 8 simulated devices."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as PS

from rlvr_jax import advantages as adv

P, G, T = 4, 4, 7


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  b = P * G
  lengths = rng.integers(1, T + 1, b)
  lengths[3] = 0  # an empty row
  mask = np.arange(T)[None, :] < lengths[:, None]
  outcome = rng.integers(0, 2, (P, G)).astype(np.float32)
  outcome[1, 2] = np.nan  # a failed reward
  return dict(
    mask=mask,
    outcome=outcome,
    prm=rng.normal(size=(b, T)).astype(np.float32),
    ref=rng.normal(size=(b, T)).astype(np.float32),
    dense=rng.normal(size=(b, T)).astype(np.float32),
    tokens=rng.integers(0, 5, (b, T)).astype(np.int32),
  )


# ----------------------------------------------------------------------------------------------
# NumPy float64 references (plain loops).


def _np_loo(r, at, ok, g):
  """PRIME LOO at the positions ``at`` over rows ``ok``."""
  r = np.where(at, r, 0.0).astype(np.float64)
  out = np.zeros_like(r)
  for p in range(r.shape[0] // g):
    rows = [b for b in range(p * g, (p + 1) * g) if ok[b] and at[b].any()]
    if len(rows) < 2:
      continue
    means = {b: r[b][at[b]].mean() for b in rows}
    n, total = len(rows), sum(means.values())
    for b in rows:
      out[b][at[b]] = (n * r[b][at[b]] - total) / (n - 1)
  return out


def _np_returns(u, mask, gamma=1.0):
  out = np.zeros_like(u, dtype=np.float64)
  for b in range(u.shape[0]):
    carry = 0.0
    for t in reversed(range(u.shape[1])):
      if mask[b, t]:
        carry = u[b, t] + gamma * carry
        out[b, t] = carry
  return out


def _np_whiten(x, mask):
  vals = x[mask]
  mu, var = vals.mean(), vals.var(ddof=1)
  return np.where(mask, (x - mu) / np.sqrt(var + 1e-8), 0.0)


def _np_last(mask):
  out = np.zeros_like(mask)
  for b in range(mask.shape[0]):
    idx = np.flatnonzero(mask[b])
    if idx.size:
      out[b, idx[-1]] = True
  return out


def _np_prime(x, cp=5.0, co=1.0):
  ok = np.isfinite(x["outcome"]).reshape(-1)
  mask = x["mask"] & ok[:, None]
  proc = 0.05 * np.where(mask, x["prm"].astype(np.float64) - x["ref"], 0.0)
  last = _np_last(mask)
  out_tok = np.where(last, np.nan_to_num(x["outcome"]).reshape(-1)[:, None], 0.0)
  u = cp * _np_loo(proc, mask, ok, G) + co * _np_loo(out_tok, last, ok, G)
  return _np_whiten(_np_returns(u, mask), mask)


# ----------------------------------------------------------------------------------------------
# Goldens.


def test_prime_token_reward_golden():
  e = jnp.ones((1, 3), bool)
  r = adv.implicit_process_rewards(
    jnp.array([[-1.0, -0.5, -2.0]]), jnp.array([[-1.2, -0.5, -1.0]]), e, beta=0.05
  )
  np.testing.assert_allclose(r, [[0.01, 0.0, -0.05]], atol=1e-7)
  np.testing.assert_allclose(r.sum(), -0.04, atol=1e-7)


def test_pure_min_form_golden():
  p, e = jnp.array([[0.8, -0.2, 0.5]]), jnp.ones((1, 3), bool)
  credit = adv.min_form_credit(p, e, temperature=0.1)
  w = credit / p
  np.testing.assert_allclose(w, [[0.000045, 0.999044, 0.000911]], atol=1e-6)
  np.testing.assert_allclose(credit, [[0.000036, -0.199809, 0.000456]], atol=1e-6)
  np.testing.assert_allclose(credit.sum(), -0.199317, atol=1e-6)
  rtg = adv.discounted_returns(credit, e)
  np.testing.assert_allclose(rtg, [[-0.199317, -0.199353, 0.000456]], atol=1e-6)
  # Smaller T -> the sum approaches the minimum.
  cold = adv.min_form_credit(p, e, temperature=0.01)
  np.testing.assert_allclose(cold.sum(), -0.2, atol=1e-6)


def test_min_form_credit_ignores_non_step_positions():
  p = jnp.array([[0.8, 99.0, -0.2, 0.5], [5.0, 5.0, 5.0, 5.0]])
  ends = jnp.array([[True, False, True, True], [False, False, False, False]])
  credit = adv.min_form_credit(p, ends, temperature=0.1)
  ref = adv.min_form_credit(jnp.array([[0.8, -0.2, 0.5]]), jnp.ones((1, 3), bool))
  np.testing.assert_allclose(credit[0, jnp.array([0, 2, 3])], ref[0], atol=1e-7)
  assert credit[0, 1] == 0 and not np.any(credit[1])


# ----------------------------------------------------------------------------------------------
# Step segmentation.


def test_segment_steps_matches_loop():
  x = _inputs()
  seps = (0, 3)
  seg = adv.segment_steps(jnp.asarray(x["tokens"]), jnp.asarray(x["mask"]), separator_ids=seps)
  for b in range(P * G):
    step = 0
    for t in range(T):
      if not x["mask"][b, t]:
        assert seg.step_index[b, t] == -1 and not seg.step_end[b, t]
        continue
      assert seg.step_index[b, t] == step
      last = t == np.flatnonzero(x["mask"][b])[-1]
      end = x["tokens"][b, t] in seps or last
      assert bool(seg.step_end[b, t]) == end
      step += end
    assert seg.num_steps[b] == step


def test_segment_steps_example():
  tokens = jnp.array([[5, 6, 9, 7, 9, 8, 0]])
  mask = jnp.array([[1, 1, 1, 1, 1, 1, 0]], bool)
  seg = adv.segment_steps(tokens, mask, separator_ids=(9,))
  np.testing.assert_array_equal(seg.step_index, [[0, 0, 0, 1, 1, 2, -1]])
  np.testing.assert_array_equal(seg.step_end, [[0, 0, 1, 0, 1, 1, 0]])
  assert seg.num_steps[0] == 3
  with pytest.raises(ValueError, match="separator_ids"):
    adv.segment_steps(tokens, mask, separator_ids=())


# ----------------------------------------------------------------------------------------------
# Leave-one-out baselines and the two recipes against float64 references.


def test_group_loo_single_position_is_rloo():
  x = _inputs()
  mask = jnp.asarray(x["mask"])
  last = jnp.asarray(_np_last(x["mask"]))
  rewards = jnp.asarray(x["outcome"])
  tokens = jnp.where(last, jnp.nan_to_num(rewards).reshape(-1)[:, None], 0.0)
  valid = jnp.isfinite(rewards) & mask.any(axis=1).reshape(P, G)
  loo = adv.group_loo_token_rewards(tokens, last, group_size=G, valid=valid)
  rloo = adv.rloo_advantages(rewards, valid=valid)
  np.testing.assert_allclose(loo.sum(axis=1), rloo.reshape(-1), atol=1e-6)


def test_group_loo_matches_reference():
  x = _inputs()
  ok = np.isfinite(x["outcome"]).reshape(-1)
  got = adv.group_loo_token_rewards(
    jnp.asarray(x["dense"]),
    jnp.asarray(x["mask"]),
    group_size=G,
    valid=jnp.asarray(ok.reshape(P, G)),
  )
  np.testing.assert_allclose(got, _np_loo(x["dense"], x["mask"], ok, G), atol=1e-5)


def test_token_rloo_returns_matches_reference():
  x = _inputs()
  ok = np.isfinite(x["outcome"]).reshape(-1)
  mask = x["mask"] & ok[:, None]
  r = np.where(mask, x["dense"], 0.0).astype(np.float64)
  per_tok = np.array([r[b][mask[b]].mean() if mask[b].any() else 0.0 for b in range(P * G)])
  u = np.zeros_like(r)
  for p in range(P):
    rows = [b for b in range(p * G, (p + 1) * G) if mask[b].any()]
    for b in rows:
      others = [per_tok[j] for j in rows if j != b]
      if others:
        u[b] = np.where(mask[b], r[b] - np.mean(others), 0.0)
  want = _np_returns(u, mask, gamma=0.9)
  got = adv.token_rloo_returns(
    jnp.asarray(x["dense"]),
    jnp.asarray(x["mask"]),
    group_size=G,
    valid=jnp.asarray(ok.reshape(P, G)),
    gamma=0.9,
  )
  np.testing.assert_allclose(got, want, atol=1e-5)


def test_prime_advantages_matches_reference():
  x = _inputs()
  proc = adv.implicit_process_rewards(
    jnp.asarray(x["prm"]), jnp.asarray(x["ref"]), jnp.asarray(x["mask"]), beta=0.05
  )
  got = adv.prime_advantages(proc, jnp.asarray(x["outcome"]), jnp.asarray(x["mask"]))
  np.testing.assert_allclose(got, _np_prime(x), atol=1e-5)
  # The coefficient is linear: scaling the process source before or after LOO is the same.
  a = adv.prime_advantages(
    proc * 5.0, jnp.asarray(x["outcome"]), jnp.asarray(x["mask"]), process_coef=1.0, whiten=False
  )
  b = adv.prime_advantages(
    proc, jnp.asarray(x["outcome"]), jnp.asarray(x["mask"]), process_coef=5.0, whiten=False
  )
  np.testing.assert_allclose(a, b, atol=1e-5)


def test_pure_advantages_matches_reference():
  x = _inputs()
  seg = adv.segment_steps(jnp.asarray(x["tokens"]), jnp.asarray(x["mask"]), separator_ids=(0,))
  step_rewards = jnp.tanh(jnp.asarray(x["dense"]))
  verifiable = jnp.asarray(x["outcome"]) - 1.0
  got = adv.pure_advantages(
    step_rewards,
    seg.step_end,
    jnp.asarray(x["mask"]),
    group_size=G,
    verifiable_rewards=verifiable,
    temperature=0.1,
  )
  # Reference: softmin per row in float64, token-mode RLOO returns, RLOO'd verifiable at EOS.
  ok = np.isfinite(x["outcome"]).reshape(-1)
  mask = x["mask"] & ok[:, None]
  ends = np.asarray(seg.step_end)
  p = np.tanh(x["dense"].astype(np.float64))
  credit = np.zeros_like(p)
  for b in range(P * G):
    idx = np.flatnonzero(ends[b])
    if idx.size:
      w = np.exp(-p[b, idx] / 0.1 - np.max(-p[b, idx] / 0.1))
      credit[b, idx] = w / w.sum() * p[b, idx]
  per_tok = np.array([credit[b][mask[b]].mean() if mask[b].any() else 0 for b in range(P * G)])
  u = np.zeros_like(credit)
  for q in range(P):
    rows = [b for b in range(q * G, (q + 1) * G) if mask[b].any()]
    for b in rows:
      others = [per_tok[j] for j in rows if j != b]
      u[b] = np.where(mask[b], credit[b] - np.mean(others), 0.0) if others else 0.0
  last = _np_last(mask)
  v = np.where(last, np.nan_to_num(x["outcome"] - 1.0).reshape(-1)[:, None], 0.0)
  want = _np_returns(u + _np_loo(v, last, ok, G), mask)
  np.testing.assert_allclose(got, want, atol=1e-5)


def test_step_sums_match_a_loop():
  x = _inputs(1)
  seg = adv.segment_steps(jnp.asarray(x["tokens"]), jnp.asarray(x["mask"]), separator_ids=(0, 3))
  got = np.asarray(adv.step_sums(jnp.asarray(x["dense"]), seg))
  want = np.zeros_like(got, dtype=np.float64)
  for b in range(P * G):
    total = 0.0
    for t in range(T):
      if not x["mask"][b, t]:
        continue
      total += x["dense"][b, t]
      if x["tokens"][b, t] in (0, 3) or t == np.flatnonzero(x["mask"][b])[-1]:
        want[b, t], total = total, 0.0
  np.testing.assert_allclose(got, want, atol=1e-5)
  assert np.count_nonzero(got) > P * G  # several steps per row: not vacuous


def test_pure_token_advantages_compose_segments_step_sums_and_pure():
  x = _inputs(2)
  mask, tokens = jnp.asarray(x["mask"]), jnp.asarray(x["tokens"])
  dense = jnp.asarray(x["dense"])
  spec = adv.ESTIMATORS["pure"]
  assert spec.reads[2] == "prm_token_rewards" and "completion_tokens" in spec.reads
  assert adv.ESTIMATORS["pure_token_rewards"].reads[2] == "token_rewards"
  inputs = {"rewards": jnp.asarray(x["outcome"]), "completion_mask": mask,
            "prm_token_rewards": dense, "completion_tokens": tokens,
            "valid": jnp.isfinite(jnp.asarray(x["outcome"]))}  # fmt: skip
  got = spec.compute(inputs, separator_ids=(1,), outcome_coef=2.0, temperature=0.2).advantages
  seg = adv.segment_steps(tokens, mask, separator_ids=(1,))
  want = adv.pure_advantages(
    adv.step_sums(dense, seg), seg.step_end, mask, group_size=G,
    verifiable_rewards=2.0 * jnp.asarray(x["outcome"]), temperature=0.2,
  )  # fmt: skip
  np.testing.assert_allclose(got, want, atol=1e-6)
  assert spec.check(P, G, {}) is not None  # separator_ids is required
  assert spec.check(P, G, {"separator_ids": (4,)}) is None


def test_reinforce_pp_takes_dense_rewards():
  x = _inputs()
  rewards, mask = jnp.asarray(x["outcome"]), jnp.asarray(x["mask"])
  dense = jnp.asarray(x["dense"])
  got = adv.reinforce_plus_plus_advantages(rewards, mask, token_rewards=dense, whiten=False)
  base = adv.reinforce_plus_plus_advantages(rewards, mask, whiten=False)
  ok = np.isfinite(x["outcome"]).reshape(-1)
  want = np.asarray(base) + _np_returns(np.asarray(dense), x["mask"] & ok[:, None])
  np.testing.assert_allclose(got, want, atol=1e-5)


# ----------------------------------------------------------------------------------------------
# Filters.


def test_rlpr_std_filter_matches_loop():
  rng = np.random.default_rng(3)
  state, ema = adv.std_filter_init(), None
  for step in range(1, 15):
    r = rng.random((6, 4)).astype(np.float32) * rng.random((6, 1)).astype(np.float32)
    r[0] = 0.5  # zero std: always dropped once active
    keep, state, metrics = adv.rlpr_std_filter(jnp.asarray(r), state, start_step=11)
    stds = r.astype(np.float64).std(axis=1)
    mean_std = stds.mean()
    ema = mean_std if ema is None else 0.99 * ema + 0.01 * mean_std
    want = stds >= 0.5 * ema if step >= 11 else np.ones(6, bool)
    np.testing.assert_array_equal(keep, want)
    np.testing.assert_allclose(metrics["std_filter/ema"], ema, rtol=1e-5)
  assert int(state.steps) == 14


# ----------------------------------------------------------------------------------------------
# 8 simulated devices: sharded rows under jit, and shard_map with axis_name.


def test_dense_credit_sharded_equals_unsharded():
  assert jax.device_count() >= 8
  x = _inputs()
  x = {**x, **{k: np.tile(v, (2, 1)) for k, v in x.items() if k != "outcome"}}
  x["outcome"] = np.tile(x["outcome"], (2, 1))  # P = 8 prompts, B = 32 rows

  def run(mask, outcome, prm, ref, tokens, dense, axis_name=None):
    proc = adv.implicit_process_rewards(prm, ref, mask)
    seg = adv.segment_steps(tokens, mask, separator_ids=(0,))
    return dict(
      prime=adv.prime_advantages(proc, outcome, mask, axis_name=axis_name),
      pure=adv.pure_advantages(
        jnp.tanh(dense),
        seg.step_end,
        mask,
        group_size=G,
        verifiable_rewards=outcome,
        whiten=True,
        axis_name=axis_name,
      ),
    )

  args = {k: jnp.asarray(v) for k, v in x.items()}
  want = jax.jit(run)(**args)
  mesh = jax.make_mesh((8,), ("data",))
  sharded = {k: jax.device_put(v, NamedSharding(mesh, PS("data"))) for k, v in args.items()}
  got = jax.jit(run)(**sharded)
  names = ("mask", "outcome", "prm", "ref", "tokens", "dense")
  mapped = jax.shard_map(
    functools.partial(run, axis_name="data"),
    mesh=mesh,
    in_specs=tuple(PS("data") for _ in names),
    out_specs=PS("data"),
  )
  got_map = jax.jit(mapped)(*(sharded[k] for k in names))
  for key in want:
    np.testing.assert_allclose(got[key], want[key], atol=1e-5, err_msg=key)
    np.testing.assert_allclose(got_map[key], want[key], atol=1e-5, err_msg=key)
