"""SPO-tree in the trainer (``train/tree_round.py``, ``rl.advantage='spo_tree'``; Guo et al., arXiv
2505.23564): the tree's values and advantages by hand, the tree round's leaves (shared prefixes,
the static sampler's tokens per level, log-prob parity) and the collected batch's advantages."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import advantages as adv_lib
from rlvr_jax import sampling
from rlvr_jax.train import config as config_lib
from rlvr_jax.train import tree_round as tree_lib
from rlvr_jax.train.loop import Trainer

BRANCHING, SEG, T = (2, 2), 3, 8  # G = 4 leaves; level 0 samples 3 tokens, level 1 the other 5
SPO = dict(tree_branching=BRANCHING, tree_segment_tokens=SEG, prob_threshold=0.6)
REWARD = dict(name=f"{__name__}:digit_share")  # importable in the reward workers (tests/ on path)
# A key whose tree round has a node that ended at level 0 (copies) next to live ones (found once).
KEY = 6


def digit_share(prompts, completions, **fields):
  """The share of digits in a completion: a reward that varies for the untrained tiny model."""
  return np.array([sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions], np.float32)


def _config(tmp_path, **overrides):
  kw = dict(
    rl=dict(advantage="spo_tree", prompts_per_step=2), spo=SPO, reward=REWARD,
    sampling=dict(max_new_tokens=T, temperature=1.5, engine="continuous", num_slots=5),
  )  # fmt: skip
  for block, values in overrides.items():
    kw[block] = {**kw.get(block, {}), **values}
  return config_lib.tiny_config(tmp_path, **kw)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
  trainer = Trainer(_config(tmp_path_factory.mktemp("spo_tree")), log=lambda s: None)
  trainer.restore_or_start()
  yield trainer
  trainer.close()


@pytest.fixture(scope="module")
def tree_round(trainer):
  records = trainer.collector.source.take(2)
  key = jax.random.key(KEY)
  texts, rollout, info = tree_lib.sample_tree(
    trainer.collector, trainer.state.params, records, key=key
  )
  return records, key, jax.tree.map(np.asarray, rollout), info


# ------------------------------------------------------------------------------ by hand


def _hand_tree():
  """Two (2, 2) trees, completions of T = 6 (segments of 3): in tree 0 node B ended after 2
  tokens (its leaves 2, 3 are copies of it, with one reward); in tree 1 leaf 4's reward failed."""
  rewards = np.array([[1, 0, 1, 1], [np.nan, 0, 1, 0]], np.float32)
  lengths = np.array([5, 6, 2, 2, 6, 4, 5, 6])
  starts = np.array([[0, 3]] * 8)
  starts[2:4, 1] = 2  # the copies: an empty segment 1
  mask = np.arange(6)[None] < lengths[:, None]
  probs = np.where(np.arange(6)[None] % 2 == 0, 0.5, 0.95)  # even positions are cutpoints
  host = types.SimpleNamespace(
    completion_mask=mask, sampler_logp=np.where(mask, np.log(probs), 0.0).astype(np.float32)
  )
  return rewards, host, dict(starts=starts)


def _with_leaf_rewards(rewards):
  """``complete_tree`` of the (2, 2) trees with ``rewards`` [P, 4] on its leaves."""
  tree = adv_lib.complete_tree(BRANCHING, num_trees=len(rewards))
  inner = np.full(tree.parent.shape[0] - rewards.size, np.nan, np.float32)
  return dataclasses.replace(tree, reward=jnp.asarray(np.concatenate([inner, rewards.ravel()])))


def test_tree_values_and_advantages_by_hand():
  rewards, _, _ = _hand_tree()
  tree = _with_leaf_rewards(rewards)
  # Level order: roots 0, 1; depth 1: A, B (tree 0), C, D (tree 1); then the 8 leaves.
  np.testing.assert_array_equal(tree.parent, [-1, -1, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5])
  values = np.asarray(adv_lib.tree_values(tree, max_depth=2))
  want_v = [0.75, 1 / 3, 0.5, 1.0, 0.0, 0.5, 1, 0, 1, 1, np.nan, 0, 1, 0]
  np.testing.assert_allclose(values, want_v, rtol=1e-6)
  adv = np.asarray(adv_lib.tree_advantages(tree, max_depth=2))
  want_a = [0, 0, -0.25, 0.25, -1 / 3, 1 / 6, 0.5, -0.5, 0, 0, 0, 0, 0.5, -0.5]
  np.testing.assert_allclose(adv, want_a, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("use_prob_mask", [True, False])
def test_tree_inputs_make_spo_chain_the_tree_advantages(use_prob_mask):
  """``tree_inputs`` + ``spo_tree_token_advantages`` (= SPO-chain on the ancestors' values) give
  every token its node's ``tree_advantages`` (value minus its parent's)."""
  rewards, host, info = _hand_tree()
  c = config_lib.base_config()
  c.spo.update(tree_branching=BRANCHING, prob_threshold=0.9)
  inputs = tree_lib.tree_inputs(c, host, rewards, info)
  np.testing.assert_allclose(inputs["tree_values"][:4], [[0.75, 0.5]] * 2 + [[0.75, 1.0]] * 2)
  np.testing.assert_array_equal(inputs["num_segments"], [2, 2, 1, 1, 2, 2, 2, 2])
  np.testing.assert_array_equal(inputs["segment_ids"][0], [0, 0, 0, 1, 1, -1])
  np.testing.assert_array_equal(inputs["segment_ids"][2], [0, 0, -1, -1, -1, -1])
  names = ("tree_values", "segment_ids", "num_segments", "spo_cutpoints")
  got = adv_lib.spo_tree_token_advantages(
    jnp.asarray(rewards), *(jnp.asarray(inputs[k]) for k in names),
    valid=jnp.asarray(np.isfinite(rewards)), use_prob_mask=use_prob_mask,
  )  # fmt: skip
  # The reference: each token gets the advantage of the node that sampled it.
  tree = _with_leaf_rewards(rewards)
  node_adv, parent = np.asarray(adv_lib.tree_advantages(tree, max_depth=2)), np.asarray(tree.parent)
  want = np.zeros((8, 6), np.float32)
  for b in range(8):
    leaf = 6 + b
    by_depth = {2: leaf, 1: parent[leaf]}  # segment s was sampled by the depth-(s+1) ancestor
    for t in range(int(host.completion_mask[b].sum())):
      s = int(t >= info["starts"][b, 1])
      want[b, t] = node_adv[by_depth[s + 1]]
  cut = np.asarray(host.sampler_logp) < np.log(0.9)
  want = np.where(np.isfinite(rewards.reshape(-1))[:, None], want, 0.0)
  want = np.where(cut | (not use_prob_mask), want, 0.0) * host.completion_mask
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-6)
  assert np.abs(want).sum() > 0


def test_config_errors():
  with pytest.raises(config_lib.ConfigError, match=r"spo\.tree_branching.*sampling\.num_samples=4"):
    config_lib.validate(_config("/tmp/unused", spo=dict(tree_branching=(2, 3))))
  with pytest.raises(config_lib.ConfigError, match=r"spo\.tree_branching: must be a non-empty"):
    config_lib.validate(_config("/tmp/unused", spo=dict(tree_branching=(4, 0))))
  with pytest.raises(config_lib.ConfigError, match=r"spo\.tree_segment_tokens"):
    config_lib.validate(_config("/tmp/unused", spo=dict(tree_segment_tokens=T)))
  # Another estimator: the tree settings are not tied to the group size.
  config_lib.validate(_config("/tmp/unused", rl=dict(advantage="grpo"),
                              spo=dict(tree_branching=(2, 3))))  # fmt: skip


# ------------------------------------------------------------------------------ the tree round


def test_leaves_share_prefixes_and_levels_are_the_static_samplers(trainer, tree_round):
  records, key, leaves, info = tree_round
  col, params = trainer.collector, trainer.state.params
  starts, lengths, mask = info["starts"], leaves.lengths, leaves.completion_mask
  np.testing.assert_array_equal(mask.sum(1), lengths)
  np.testing.assert_array_equal(leaves.truncated, ~leaves.finished)
  assert (starts[:, 0] == 0).all()
  # Siblings (leaves 2i, 2i + 1) share their depth-1 ancestor: its segment and log-probs.
  for b in range(0, 8, 2):
    p = starts[b, 1]
    assert starts[b + 1, 1] == p
    np.testing.assert_array_equal(leaves.tokens[b, :p], leaves.tokens[b + 1, :p])
    np.testing.assert_array_equal(leaves.sampler_logp[b, :p], leaves.sampler_logp[b + 1, :p])
  ended = leaves.finished & (lengths == starts[:, 1])  # a depth-1 node that stopped: copies
  live = ~ended[::2]
  assert ended.any() and live.any(), "KEY no longer gives a tree with copies and live nodes"
  for b in np.flatnonzero(ended[::2]) * 2:
    np.testing.assert_array_equal(leaves.tokens[b], leaves.tokens[b + 1])
  assert info["metrics"]["spo/tree_nodes_sampled"] == 2 * 2 + 2 * live.sum()
  indices = np.array([r["index"] for r in records])
  static = dict(config=col.model_config, strategy=col.strategy, stop_tokens=tuple(
    col.tokenizer.eos_ids), pad_id=col.pad_id, phase_steps=col.c.sampling.phase_steps)  # fmt: skip
  # Level 0: two children of each prompt, 3 tokens each.
  _, ids, pmask = col.prompts(records)
  ref0 = sampling.generate(
    params, ids, pmask, num_samples=2, key=tree_lib.level_key(key, 0), max_new_tokens=SEG,
    prompt_ids=tree_lib.node_ids(indices, 0, BRANCHING), buckets=(ids.shape[1],), **static,
  )  # fmt: skip
  # Level 1: two continuations of every live depth-1 node (prompt + its segment), 5 tokens.
  rows = np.flatnonzero(live) * 2  # a leaf under each live node
  fids, fmask = sampling.continuous.fork_prefixes(leaves, rows, starts[rows, 1], pad_id=col.pad_id)
  ref1 = sampling.generate(
    params, fids, fmask, num_samples=2, key=tree_lib.level_key(key, 1), max_new_tokens=T - SEG,
    prompt_ids=tree_lib.node_ids(indices, 1, BRANCHING)[np.flatnonzero(live)],
    buckets=sampling.DEFAULT_BUCKETS, **static,
  )  # fmt: skip
  segs = [(ref0, [(2 * j, 0) for j in range(4)])]
  segs.append((ref1, [(r + i, starts[r, 1]) for r in rows for i in range(2)]))
  sampled = 0
  for ref, where in segs:
    ref = jax.tree.map(np.asarray, ref)
    for j, (b, p) in enumerate(where):
      n = ref.lengths[j]
      sampled += n
      np.testing.assert_array_equal(leaves.tokens[b, p : p + n], ref.tokens[j, :n])
      np.testing.assert_allclose(leaves.sampler_logp[b, p : p + n], ref.sampler_logp[j, :n],
                                 atol=1e-6)  # fmt: skip
      assert leaves.finished[b] == ref.finished[j] or p == 0 and not ref.finished[j]
  np.testing.assert_array_equal(leaves.prompt_tokens[::4], ids)  # the prompts as sampled
  assert info["sampled_tokens"] == sampled < mask.sum()


def test_leaves_keep_logprob_parity(trainer, tree_round):
  """The leaves' sampler log-probs (the prefix's carried from the ancestors) equal one forward
  pass over prompt + completion (the trainer's recomputation) within 1e-5."""
  col = trainer.collector
  leaves = tree_round[2]
  gap = sampling.logprob_parity(trainer.state.params, leaves, config=col.model_config,
                                strategy=col.strategy)  # fmt: skip
  assert float(gap["sampler_logp_gap/max"]) <= 1e-5 and float(gap["model_logp_gap/max"]) <= 1e-5


def test_collected_batch_has_the_tree_advantages(trainer):
  """A step's batch: each token's advantage is V(node that sampled it) - V(its parent), V the
  mean leaf reward under a node, on the cutpoint tokens (use_prob_mask)."""
  batch, _ = trainer.collector.collect(trainer.state.params, key=jax.random.key(4))
  r = batch.rewards
  assert batch.advantages.shape == batch.tokens.shape and np.isfinite(r).all()
  root = np.repeat(r.mean(1), 4)
  node = np.repeat(r.reshape(2, 2, 2).mean(2).reshape(-1), 2)  # depth 1 (leaf pairs)
  leaf = r.reshape(-1)
  t = np.arange(T)[None, :]
  mask = t < batch.lengths[:, None]
  # Inner segments have SEG tokens: a token is the depth-1 node's when t < SEG (also the whole
  # completion of a node that stopped at level 0: its leaves are copies, with its value).
  want = np.where(t < SEG, (node - root)[:, None], (leaf - node)[:, None])
  cut = np.exp(batch.sampler_logp) < 0.6
  np.testing.assert_allclose(batch.advantages, np.where(mask & cut, want, 0.0), atol=1e-6)
  assert np.abs(batch.advantages).sum() > 0
  m = batch.metrics
  assert m["spo/tree_nodes_sampled"] >= 2 * 2
  assert 0 < m["rollout/sampled_tokens"] < mask.sum()
