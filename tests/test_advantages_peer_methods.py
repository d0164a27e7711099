"""verl's extra baselines in ``advantages/baselines.py``: golden numbers and a NumPy reference of
verl's formula on random inputs for each."""

import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import advantages

P, G, T = 3, 4, 6


def _random(seed=0):
  rng = np.random.default_rng(seed)
  rewards = rng.integers(0, 2, (P, G)).astype(np.float32)
  rewards[0] = [1, 0, 0, 1]
  lengths = rng.integers(1, T + 1, P * G)
  mask = np.arange(T)[None] < lengths[:, None]
  return rewards, mask


def _est(name, rewards, **inputs):
  out = advantages.ESTIMATORS[name].compute(
    {"rewards": jnp.asarray(rewards, jnp.float32), **{k: jnp.asarray(v) for k, v in inputs.items()}}
  )
  return np.asarray(out.advantages)


def test_opo_golden_and_reference():
  # lengths [1, 3], rewards [1, 0]: b = (1*1 + 3*0) / 4 = 0.25 -> A = [0.75, -0.25].
  mask = np.array([[1, 0, 0], [1, 1, 1]], bool)
  np.testing.assert_allclose(_est("opo", [[1.0, 0.0]], completion_mask=mask), [[0.75, -0.25]])
  rewards, mask = _random()
  got = _est("opo", rewards, completion_mask=mask)
  lengths = mask.sum(-1).reshape(P, G)
  b = (lengths * rewards).sum(-1, keepdims=True) / lengths.sum(-1, keepdims=True)  # verl opo
  np.testing.assert_allclose(got, rewards - b, rtol=1e-6, atol=1e-7)
  # A failed reward is excluded from the baseline and gets 0.
  r = rewards.copy()
  r[1, 0] = np.nan
  got = _est("opo", r, completion_mask=mask)
  keep = lengths[1, 1:]
  assert got[1, 0] == 0.0
  want = r[1, 1:] - (keep * r[1, 1:]).sum() / keep.sum()
  np.testing.assert_allclose(got[1, 1:], want, rtol=1e-6, atol=1e-7)


def test_gpg_golden_and_reference():
  # 2 groups of 2: rewards [[1, 0], [0, 0]] -> 4 samples, 1 nonzero: alpha = 4;
  # group 0: mean 0.5 -> A = 4 * [0.5, -0.5] = [2, -2]; group 1: 0.
  np.testing.assert_allclose(_est("gpg", [[1.0, 0.0], [0.0, 0.0]]), [[2.0, -2.0], [0.0, 0.0]])
  rewards, _ = _random(1)
  got = _est("gpg", rewards)
  alpha = rewards.size / max(1, np.count_nonzero(rewards))  # verl: bsz / count_nonzero(scores)
  np.testing.assert_allclose(got, alpha * (rewards - rewards.mean(-1, keepdims=True)), rtol=1e-6)
  assert advantages.SEQUENCE_ESTIMATORS["gpg"] is advantages.ESTIMATORS["gpg"].fn


def _np_grpo(r):
  mean, std = r.mean(-1, keepdims=True), r.std(-1, ddof=1, keepdims=True)
  return np.where(std > 0, (r - mean) / (std + 1e-6), 0.0)


def _np_whiten(x, m):
  v = x[m]
  return np.where(m, (x - v.mean()) / np.sqrt(v.var(ddof=1) + 1e-8), 0.0)


def test_gdpo_golden_and_reference():
  # One group of 2, two components: [1, 0] and [0, 10]: per-component z-scores
  # [0.7071, -0.7071] and [-0.7071, 0.7071] cancel (up to eps), where GRPO on the sum (1 vs 10)
  # gives [-0.7071, 0.7071].
  comps = np.array([[[1.0, 0.0], [0.0, 10.0]]])
  mask = np.ones((2, 3), bool)
  got = _est("gdpo", comps.sum(-1), reward_components=comps, completion_mask=mask)
  np.testing.assert_allclose(got, 0.0, atol=0.01)
  np.testing.assert_allclose(_est("grpo", comps.sum(-1)), [[-0.7071, 0.7071]], atol=1e-4)
  rng = np.random.default_rng(2)
  comps = rng.integers(0, 2, (P, G, 2)).astype(np.float32) * np.array([1.0, 5.0])
  _, mask = _random(2)
  got = advantages.ESTIMATORS["gdpo"].compute(
    {"rewards": jnp.asarray(comps.sum(-1)), "reward_components": jnp.asarray(comps),
     "completion_mask": jnp.asarray(mask)}, component_weights=(1.0, 0.5),
  ).advantages  # fmt: skip
  s = _np_grpo(comps[..., 0]) + 0.5 * _np_grpo(comps[..., 1])  # verl gdpo: sum_k w_k A_k
  want = _np_whiten(np.repeat(s.reshape(-1, 1), T, 1) * mask, mask)  # then masked_whiten
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match="component_weights"):
    advantages.ESTIMATORS["gdpo"].compute(
      {"rewards": jnp.asarray(comps.sum(-1)), "reward_components": jnp.asarray(comps),
       "completion_mask": jnp.asarray(mask)}, component_weights=(1.0,))  # fmt: skip


def _np_otb(rewards, mask, old_logp, sum_pi_sq, compact, zero_tail=True, eps=1e-8):
  """verl compute_(multi_turn_)optimal_token_baseline_advantage, outcome rewards, loops."""
  B, Tn = mask.shape
  g_size = rewards.shape[1]
  w = (1 - 2 * np.exp(old_logp) + sum_pi_sq) * mask
  wc = np.cumsum(w, -1)
  ret = np.repeat(rewards.reshape(-1, 1), Tn, 1) * mask
  if compact:
    n = mask.sum(-1)
    wc = np.stack([np.pad(wc[i][mask[i]], (0, Tn - n[i])) for i in range(B)])
    ret = np.stack([np.pad(ret[i][mask[i]], (0, Tn - n[i])) for i in range(B)])
    m2 = np.arange(Tn)[None] < n[:, None]
  else:
    m2 = mask
  adv = np.zeros((B, Tn))
  for p in range(B // g_size):
    idx = np.arange(p * g_size, (p + 1) * g_size)
    base = (ret[idx] * wc[idx] * m2[idx]).sum(0) / ((wc[idx] * m2[idx]).sum(0) + eps)
    bl = np.repeat(base[None], g_size, 0)
    if zero_tail:
      ln = m2[idx].sum(-1)
      s = np.sort(ln)
      if (ln == s[-1]).sum() == 1 and s[-1] > s[-2]:
        bl[np.argmax(ln), s[-2] :] = 0.0
    adv[idx] = (ret[idx] - bl) * m2[idx]
  if compact:
    out = np.zeros_like(adv)
    for i in range(B):
      out[i][mask[i]] = adv[i, : mask[i].sum()]
    adv = out
  return adv


def _otb_inputs(seed, gaps):
  rng = np.random.default_rng(seed)
  rewards, mask = _random(seed)
  if gaps:  # tool tokens masked inside responses
    mask = mask & (rng.uniform(size=mask.shape) > 0.25)
    mask[:, 0] = True
  old_logp = -rng.uniform(0.05, 3.0, mask.shape)
  sum_pi_sq = rng.uniform(np.exp(old_logp) ** 2, 1.0)
  return rewards, mask, old_logp, sum_pi_sq


def test_optimal_token_baseline_golden_and_reference():
  # One group of 2 rows of length 2, pi = 0.5, sum pi^2 = 0.5: ||s||^2 = 0.5 per token, so
  # W = [0.5, 1.0] for both rows: B_t = mean(R) = 0.5; A = R - 0.5 (both rows as long).
  mask = np.ones((2, 2), bool)
  lp = np.log(np.full((2, 2), 0.5))
  got = _est("optimal_token_baseline", [[1.0, 0.0]], completion_mask=mask, old_logp=lp,
             sum_pi_squared=np.full((2, 2), 0.5))  # fmt: skip
  np.testing.assert_allclose(got, [[0.5, 0.5], [-0.5, -0.5]], rtol=1e-6)
  rewards, mask, lp, sp = _otb_inputs(3, gaps=False)
  got = _est("optimal_token_baseline", rewards, completion_mask=mask, old_logp=lp,
             sum_pi_squared=sp)  # fmt: skip
  np.testing.assert_allclose(got, _np_otb(rewards, mask, lp, sp, compact=False), rtol=1e-5,
                             atol=1e-6)  # fmt: skip


def test_tir_optimal_token_baseline_reference():
  rewards, mask, lp, sp = _otb_inputs(4, gaps=True)
  kw = dict(completion_mask=mask, old_logp=lp, sum_pi_squared=sp)
  got = _est("tir_optimal_token_baseline", rewards, **kw)
  np.testing.assert_allclose(got, _np_otb(rewards, mask, lp, sp, compact=True), rtol=1e-5,
                             atol=1e-6)  # fmt: skip
  assert not np.allclose(got, _est("optimal_token_baseline", rewards, **kw))  # gaps matter
  prefix = np.arange(T)[None] < mask.sum(-1)[:, None]  # without gaps both forms agree
  kw["completion_mask"] = prefix
  np.testing.assert_allclose(_est("tir_optimal_token_baseline", rewards, **kw),
                             _est("optimal_token_baseline", rewards, **kw), rtol=1e-6)  # fmt: skip


def test_pass_rate_filter_rejects_all_wrong_and_all_right_groups():
  outcomes = np.array([[0, 0, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [0.5, 0.5, 0.5, 0.5]], np.float32)
  flt = advantages.GROUP_FILTERS["pass_rate"].fn
  np.testing.assert_array_equal(flt(jnp.asarray(outcomes)), [True, True, False, True])
  # Varying partial credit that no sample passes: pass_rate rejects, constant_outcome keeps.
  zv = advantages.GROUP_FILTERS["constant_outcome"].fn
  partial = jnp.asarray([[0.2, 0.4, 0.0, 0.0]])
  assert bool(flt(partial)[0]) and not bool(zv(partial)[0])
  np.testing.assert_array_equal(zv(jnp.asarray(outcomes)), [True, True, False, True])
  # A failed (NaN) sample is left out; a group with none valid is rejected.
  mixed = np.array([[1.0, np.nan, 0.0, 1.0], [np.nan] * 4], np.float32)
  np.testing.assert_array_equal(flt(jnp.asarray(mixed)), [False, True])
  # PRIME's band [0.2, 0.8]: a_p = 0.25 is kept with low = 0.2, rejected with low = 0.25.
  assert not bool(flt(jnp.asarray(outcomes[2:3]), low=0.2)[0])
  assert bool(flt(jnp.asarray(outcomes[2:3]), low=0.25)[0])
  rng = np.random.default_rng(5)
  o = rng.integers(0, 2, (20, 4)).astype(np.float32)
  rate = o.mean(-1)
  np.testing.assert_array_equal(flt(jnp.asarray(o)), (rate <= 0) | (rate >= 1))
