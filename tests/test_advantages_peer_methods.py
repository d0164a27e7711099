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
