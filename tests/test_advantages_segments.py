"""SPO's segment credit and R3L's retry credit (``advantages.segments``): cutpoints, chain
segments and advantages, tree values and advantages, pivotal masks and positive amplification,
against hand-computed goldens and float64 references."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import advantages as adv
from rlvr_jax.advantages import segments as seg

# One row of 7 completion tokens; pi_old of the sampled tokens. Cutpoints (< 0.9): t = 1, 3, 4, 6.
PROBS = np.array([[0.95, 0.5, 0.99, 0.3, 0.8, 0.97, 0.2]])
MASK = np.ones((1, 7), bool)


def _cut():
  return seg.spo_cutpoints(jnp.log(jnp.asarray(PROBS)), jnp.asarray(MASK))


def test_cutpoints_are_the_unlikely_tokens():
  np.testing.assert_array_equal(np.asarray(_cut())[0], [0, 1, 0, 1, 1, 0, 1])
  masked = seg.spo_cutpoints(jnp.log(jnp.asarray(PROBS)), jnp.asarray(MASK).at[0, 3:].set(False))
  np.testing.assert_array_equal(np.asarray(masked)[0], [0, 1, 0, 0, 0, 0, 0])


def test_chain_segments_start_at_every_kth_cutpoint():
  # K = 2: the 2nd cutpoint (t = 3) and the 4th (t = 6) open segments: [0, 3), [3, 6), [6, 7).
  ids, starts, n = seg.spo_segments(_cut(), jnp.asarray(MASK), cutpoint_interval=2, max_segments=4)
  np.testing.assert_array_equal(np.asarray(ids)[0], [0, 0, 0, 1, 1, 1, 2])
  np.testing.assert_array_equal(np.asarray(starts)[0], [0, 3, 6, 7])  # 7 = T: no 4th segment
  assert int(n[0]) == 3
  # At most 2 segments: the boundary at t = 6 is dropped, the last segment runs to the end.
  ids, starts, n = seg.spo_segments(_cut(), jnp.asarray(MASK), cutpoint_interval=2, max_segments=2)
  np.testing.assert_array_equal(np.asarray(ids)[0], [0, 0, 0, 1, 1, 1, 1])
  np.testing.assert_array_equal(np.asarray(starts)[0], [0, 3])
  # K = 1: every cutpoint opens one.
  ids, _, n = seg.spo_segments(_cut(), jnp.asarray(MASK), cutpoint_interval=1, max_segments=8)
  np.testing.assert_array_equal(np.asarray(ids)[0], [0, 1, 1, 2, 3, 3, 4])
  with pytest.raises(ValueError, match="cutpoint_interval"):
    seg.spo_segments(_cut(), jnp.asarray(MASK), cutpoint_interval=0, max_segments=2)


def test_chain_advantages_golden():
  # V_0 = 0.5 (the prompt), V_1 = 0.25, V_2 = 1.0 (prefixes before t = 3 and t = 6), reward 1:
  # segment advantages 0.25 - 0.5, 1.0 - 0.25, 1 - 1.0.
  ids, _, n = seg.spo_segments(_cut(), jnp.asarray(MASK), cutpoint_interval=2, max_segments=4)
  values = jnp.asarray([[0.5, 0.25, 1.0, jnp.nan]])
  adv = seg.spo_chain_advantages(values, jnp.asarray([1.0]), ids, n)
  np.testing.assert_allclose(np.asarray(adv)[0], [-0.25] * 3 + [0.75] * 3 + [0.0])
  # use_prob_mask: only the cutpoints t = 1, 3, 4, 6 keep theirs.
  adv = seg.spo_chain_advantages(values, jnp.asarray([1.0]), ids, n, cutpoints=_cut())
  np.testing.assert_allclose(np.asarray(adv)[0], [0, -0.25, 0, 0.75, 0.75, 0, 0.0])
  # A failed reward (NaN) gives the row nothing; padding gets 0.
  adv = seg.spo_chain_advantages(values, jnp.asarray([jnp.nan]), ids, n)
  assert (np.asarray(adv) == 0).all()
  ids_pad = jnp.asarray(ids).at[0, 5:].set(-1)
  adv = seg.spo_chain_advantages(values, jnp.asarray([0.0]), ids_pad, n)
  assert (np.asarray(adv)[0, 5:] == 0).all() and np.asarray(adv)[0, 3] == 0.75


def test_chain_advantages_telescope_to_reward_minus_prompt_value():
  """Summed over one token per segment, the advantages telescope to R - V_0, whatever the
  intermediate values (an invariance of the definition)."""
  rng = np.random.default_rng(0)
  B, T, M = 6, 40, 5
  probs = rng.uniform(0.3, 1.0, (B, T))
  mask = np.arange(T)[None, :] < rng.integers(10, T + 1, B)[:, None]
  cut = seg.spo_cutpoints(jnp.log(jnp.asarray(probs)), jnp.asarray(mask))
  ids, starts, n = seg.spo_segments(cut, jnp.asarray(mask), cutpoint_interval=3, max_segments=M)
  values = rng.uniform(0, 1, (B, M))
  rewards = rng.integers(0, 2, B).astype(np.float32)
  adv = np.asarray(seg.spo_chain_advantages(jnp.asarray(values), jnp.asarray(rewards), ids, n))
  starts = np.asarray(starts)
  for b in range(B):
    firsts = starts[b, : int(n[b])]
    np.testing.assert_allclose(adv[b, firsts].sum(), rewards[b] - values[b, 0], atol=1e-6)


def test_complete_tree_layout():
  t = seg.complete_tree((2, 3), num_trees=2)
  assert t.parent.shape == (2 + 4 + 12,)
  np.testing.assert_array_equal(np.asarray(t.parent)[:6], [-1, -1, 0, 0, 1, 1])
  np.testing.assert_array_equal(np.asarray(t.parent)[6:9], [2, 2, 2])
  np.testing.assert_array_equal(np.bincount(np.asarray(t.depth)), [2, 4, 12])


def test_tree_values_and_advantages_golden():
  # Root 0; children 1, 2; leaves 3, 4 (under 1) and 5, 6 (under 2) with rewards 1, 0, 1, 1:
  # V = 0.75 (root), 0.5, 1; advantages -0.25, 0.25, then 0.5, -0.5, 0, 0 for the leaves.
  t = seg.complete_tree((2, 2))
  t = dataclasses.replace(t, reward=t.reward.at[3:].set(jnp.asarray([1.0, 0.0, 1.0, 1.0])))
  np.testing.assert_allclose(np.asarray(seg.tree_values(t, max_depth=2))[:3], [0.75, 0.5, 1.0])
  np.testing.assert_allclose(
    np.asarray(seg.tree_advantages(t, max_depth=2)), [0, -0.25, 0.25, 0.5, -0.5, 0, 0]
  )
  # A failed leaf (NaN) counts in no mean and gets 0: node 2 = 1 (leaf 5 alone), root = 2 / 3.
  t = dataclasses.replace(t, reward=t.reward.at[6].set(jnp.nan))
  adv = np.asarray(seg.tree_advantages(t, max_depth=2))
  np.testing.assert_allclose(adv[1:3], [0.5 - 2 / 3, 1 - 2 / 3], atol=1e-6)
  assert adv[6] == 0


def _reference_tree(parent, reward):
  """Float64 recursion: value = mean of the finite leaf rewards under the node."""
  children = {i: [] for i in range(len(parent))}
  for i, p in enumerate(parent):
    if p >= 0:
      children[p].append(i)

  def leaves(i):
    if not children[i]:
      return [reward[i]] if np.isfinite(reward[i]) else []
    return [r for c in children[i] for r in leaves(c)]

  values = np.array([np.mean(leaves(i)) if leaves(i) else np.nan for i in range(len(parent))])
  adv = np.array([
    values[i] - values[p] if p >= 0 and np.isfinite(values[i] - values[p]) else 0.0
    for i, p in enumerate(parent)
  ])  # fmt: skip
  return values, adv


def test_spo_tree_6_6_6_against_a_float64_recursion():
  t = seg.complete_tree((6, 6, 6), num_trees=2)
  rng = np.random.default_rng(1)
  leaf = np.asarray(t.depth) == 3
  reward = np.where(leaf, rng.integers(0, 2, leaf.size), np.nan).astype(np.float64)
  reward[np.flatnonzero(leaf)[:5]] = np.nan  # a few failed rewards
  t = dataclasses.replace(t, reward=jnp.asarray(reward))
  values, adv = _reference_tree(np.asarray(t.parent), reward)
  got = jax.jit(seg.tree_values, static_argnames="max_depth")(t, max_depth=3)
  np.testing.assert_allclose(np.asarray(got), values, atol=1e-6)
  np.testing.assert_allclose(np.asarray(seg.tree_advantages(t, max_depth=3)), adv, atol=1e-6)


def test_pivotal_mask_drops_the_shared_prefix():
  mask = jnp.asarray([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool)
  out = seg.pivotal_mask(mask, jnp.asarray([2, 0]))
  np.testing.assert_array_equal(np.asarray(out), [[0, 0, 1, 1, 0], [1, 1, 1, 1, 1]])
  with pytest.raises(ValueError, match="shared_prefix"):
    seg.pivotal_mask(mask, jnp.asarray([1, 2, 3]))


def test_r3l_positive_amplification_golden():
  # Group mean 0.375: R = 1 -> 1 (a success), 0.5 -> 3 x 0.125, 0 -> -0.375 (unchanged).
  r = jnp.asarray([[1.0, 0.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, jnp.nan, 0.0, 0.0]])
  adv = np.asarray(seg.r3l_advantages(r))
  np.testing.assert_allclose(adv[0], [1.0, -0.375, 0.375, -0.375])
  np.testing.assert_allclose(adv[1], 0.0)  # all fail: every score 0 (>= 0, times 3)
  np.testing.assert_allclose(adv[2], [1.0, 0.0, -1 / 3, -1 / 3], atol=1e-6)  # NaN excluded
  one = seg.r3l_advantages(jnp.asarray([[0.7, jnp.nan]]))
  np.testing.assert_allclose(np.asarray(one), 0.0)  # fewer than 2 valid samples


def test_r3l_soft_baseline_against_float64():
  rng = np.random.default_rng(2)
  r = rng.uniform(0, 1, (5, 6))
  r[0, 2] = 1.0
  tau = 0.5
  b = tau * (np.log(np.exp(r / tau).sum(1, keepdims=True)) - np.log(6))
  score = r - b
  expected = np.where(r >= 1.0, 1.0, np.where(score >= 0, 3.0 * score, score))
  got = seg.r3l_advantages(jnp.asarray(r, jnp.float32), baseline="soft", tau=tau)
  np.testing.assert_allclose(np.asarray(got), expected, atol=1e-5)
  # The soft baseline is at least the mean: fewer scores are amplified.
  assert (b[:, 0] >= r.mean(1) - 1e-12).all()


def test_spo_chain_estimator_golden():
  """The registered ``spo_chain``: rewards [P, G] flattened, a row whose reward failed (or is
  invalid) gets 0, the probability mask on or off. Row 0: segments [0, 0, 1, 1], V = (0.5, 0.25)
  then R = 1: advantages -0.25 on segment 0, 0.75 on segment 1; cutpoints at tokens 1 and 2."""
  rewards = jnp.array([[1.0, jnp.nan]])
  values = jnp.array([[0.5, 0.25], [0.5, 0.0]])
  seg = jnp.array([[0, 0, 1, 1], [0, 0, 0, -1]])
  nseg = jnp.array([2, 1])
  cut = jnp.array([[False, True, True, False], [True, True, True, False]])
  spec = adv.get_estimator("spo_chain")
  assert spec.level == "token" and spec.hyperparameters() == {"use_prob_mask": True}
  full = adv.spo_chain_token_advantages(rewards, values, seg, nseg, cut, use_prob_mask=False)
  np.testing.assert_allclose(full, [[-0.25, -0.25, 0.75, 0.75], [0, 0, 0, 0]])
  masked = adv.spo_chain_token_advantages(rewards, values, seg, nseg, cut)
  np.testing.assert_allclose(masked, [[0, -0.25, 0.75, 0], [0, 0, 0, 0]])
  invalid = adv.spo_chain_token_advantages(
    rewards, values, seg, nseg, cut, valid=jnp.array([[False, True]])
  )
  np.testing.assert_allclose(invalid, 0.0)
