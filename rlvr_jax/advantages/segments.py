"""Segment and tree credit for branching rollouts: SPO's segment advantages (chain and tree).

Part of :mod:`rlvr_jax.advantages` (import from there). These estimators read values that come
from continuations of prefixes (``sampling.continuous.fork_prefixes``): the value of a prefix is
the mean reward of the rollouts that continue it. Everything here is a pure function of arrays.

SPO (Segment Policy Optimization, Guo et al., arXiv 2505.23564) credits a trajectory by segments:

* **Cutpoints** are the tokens the old policy found unlikely, pi_old(y_t) < p_c (``prob_threshold``,
  0.9): the places where a different continuation was plausible.
* **Segment boundaries** (SPO-chain): a new segment starts at every K-th cutpoint (K =
  ``cutpoint_interval``), at most M segments per row. Segment s of row b is the token range
  [start_{b,s}, start_{b,s+1}); start_{b,0} = 0 and the last segment ends with the completion.
* **Values**: V_{b,s} = the Monte Carlo value of the prefix that ends just before segment s
  (the prompt for s = 0; for s > 0, the prompt and tokens [0, start_{b,s}) continued N times),
  V_{b,n_b} = the trajectory's own reward (n_b = its number of segments).
* **Segment advantage** A_{b,s} = V_{b,s+1} - V_{b,s}, given to the tokens of segment s; with
  ``use_prob_mask`` only to its cutpoint tokens (the others get 0): the choices that could have
  gone otherwise carry the credit.
* **SPO-tree** replaces the chains by a tree of fixed branching (e.g. 6-6-6 = 6 children per node
  over 3 depths): every node is a segment, the leaves are whole trajectories; a node's value is
  the mean reward of the leaves under it, and its advantage is its value minus its parent's.

The tree type ``SegmentTree`` (parent index, depth, where the node's segment starts) is what the
tree estimators read, so other tree methods (TreeRL, LATR) can share it.

R3L (Reflect-then-Retry RL, Shi et al., arXiv 2601.03715) retries a failed trajectory from the
point where it went wrong, so a retry shares a prefix with its original:

* **Pivotal credit** (``pivotal_mask``): the tokens of the shared prefix leave the loss; only the
  diverging suffix, where the two trajectories differ, is trained.
* **Positive amplification** (``r3l_advantages``): with the group baseline b (the mean of the
  group's valid rewards, or the soft maximum tau (logsumexp(R / tau) - log n)), a score
  A = R - b, then A = 1 for a trajectory with the maximal reward (R >= ``max_reward``), A x alpha
  for the other non-negative scores (alpha = 3), negative scores unchanged: in groups where
  failures dominate the few successes still steer the update (as in the authors' code).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlvr_jax.advantages import common
from rlvr_jax.types import pytree_dataclass


def pivotal_mask(completion_mask: jax.Array, shared_prefix: jax.Array) -> jax.Array:
  """R3L's pivotal credit: ``completion_mask`` [B, T] without the first ``shared_prefix[b]``
  completion tokens of each row (the prefix a retry shares with the trajectory it retries; 0
  for a row that is no retry)."""
  common.check_rank("completion_mask", completion_mask, 2, "B, T")
  if shared_prefix.shape != completion_mask.shape[:1]:
    raise ValueError(
      f"shared_prefix {shared_prefix.shape} must be [B] for completion_mask {completion_mask.shape}"
    )
  t = jnp.arange(completion_mask.shape[1])
  return completion_mask.astype(bool) & (t[None, :] >= shared_prefix[:, None])


def r3l_advantages(
  rewards: jax.Array,
  *,
  valid: jax.Array | None = None,
  alpha: float = 3.0,
  max_reward: float = 1.0,
  baseline: str = "mean",
  tau: float = 1.0,
) -> jax.Array:
  """R3L's positive amplification (module docstring). [P, G] -> [P, G] float32.

  A = R - b with b the group's mean (``baseline="mean"``) or soft maximum
  tau (logsumexp(R / tau) - log n) (``"soft"``) over its n valid samples; then 1 where R >=
  ``max_reward``, alpha A where A >= 0, A where A < 0. Invalid (NaN) samples and groups with
  fewer than 2 valid samples get 0 (this package's rule; the authors' code uses b = 0 for a
  group of one).
  """
  common.check_choice("baseline", baseline, ("mean", "soft"))
  rewards, mask = common.prepare(rewards, valid)
  mean, _, count = common.group_mean_std(rewards, mask, ddof=0)
  if baseline == "mean":
    b = mean
  else:
    z = jnp.where(mask, rewards / tau, -jnp.inf)
    lse = jax.nn.logsumexp(z, axis=1, keepdims=True)
    b = tau * (lse - jnp.log(jnp.maximum(count, 1.0)))
  score = rewards - b
  score = jnp.where(rewards >= max_reward, 1.0, jnp.where(score >= 0, alpha * score, score))
  return jnp.where(mask & (count > 1), score, 0.0)


def r3l_token_advantages(
  rewards: jax.Array,
  completion_mask: jax.Array,
  retry_prefix: jax.Array,
  *,
  valid: jax.Array | None = None,
  alpha: float = 3.0,
  max_reward: float = 1.0,
  baseline: str = "mean",
  tau: float = 1.0,
) -> jax.Array:
  """R3L as a registered estimator (``rl.advantage='r3l'``, Shi et al., arXiv 2601.03715):
  positive amplification on the diverging suffixes of the collector's retry round.

  A_{b,t} = a_b [t >= k_b] m_{b,t}, with a = ``r3l_advantages`` (A = R - b; 1 for a maximal
  reward, alpha A for other non-negative scores, A below 0), k_b = ``retry_prefix[b]`` (the
  completion tokens row b shares with the trajectory it retries or was retried from; 0 for
  rows outside a retry pair) and m the completion mask: pivotal credit leaves the shared prefix
  out (``pivotal_mask``).

  Args:
    rewards: [P, G] (NaN = failed); valid: [P, G] bool.
    completion_mask: [B, T]; retry_prefix: [B] int32 (``train/retries.py``).
  Returns:
    [B, T] float32.
  """
  common.check_rank("rewards", rewards, 2, "P, G")
  seq = r3l_advantages(
    rewards, valid=valid, alpha=alpha, max_reward=max_reward, baseline=baseline, tau=tau
  )
  keep = pivotal_mask(completion_mask, retry_prefix)
  return jnp.where(keep, seq.reshape(-1, 1), 0.0).astype(jnp.float32)


def spo_cutpoints(
  old_logp: jax.Array, completion_mask: jax.Array, *, prob_threshold: float = 0.9
) -> jax.Array:
  """[B, T] bool: completion tokens with pi_old(y_t) = exp(old_logp) < ``prob_threshold``."""
  common.check_rank("old_logp", old_logp, 2, "B, T")
  common.check_same_shape(("old_logp", "completion_mask"), (old_logp, completion_mask))
  return completion_mask.astype(bool) & (old_logp < jnp.log(prob_threshold))


def spo_segments(
  cutpoints: jax.Array, completion_mask: jax.Array, *, cutpoint_interval: int, max_segments: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """SPO-chain segments: a new segment starts at every ``cutpoint_interval``-th cutpoint.

  Args:
    cutpoints: [B, T] bool (``spo_cutpoints``); completion_mask: [B, T] bool.
    cutpoint_interval: K >= 1. max_segments: M >= 1, the most segments per row (boundaries past
      the M-th are dropped: the last segment runs to the end).
  Returns:
    (segment_ids [B, T] int32 in [0, M), -1 off the mask; starts [B, M] int32, the first token of
    each segment (T for segments the row does not have); num_segments [B] int32).
  """
  if cutpoint_interval < 1 or max_segments < 1:
    raise ValueError(
      f"cutpoint_interval ({cutpoint_interval}) and max_segments ({max_segments}) must be >= 1"
    )
  common.check_rank("cutpoints", cutpoints, 2, "B, T")
  common.check_same_shape(("cutpoints", "completion_mask"), (cutpoints, completion_mask))
  mask = completion_mask.astype(bool)
  T = mask.shape[1]
  count = jnp.cumsum((cutpoints & mask).astype(jnp.int32), axis=1)  # cutpoints up to t, inclusive
  # Token t opens a segment when it is the k K-th cutpoint (k >= 1) and that segment is < M.
  opens = cutpoints & mask & (count % cutpoint_interval == 0)
  ids = jnp.minimum(jnp.cumsum(opens.astype(jnp.int32), axis=1), max_segments - 1)
  segment_ids = jnp.where(mask, ids, -1)
  s = jnp.arange(max_segments, dtype=jnp.int32)
  starts_of = jnp.where(segment_ids[:, None, :] == s[None, :, None], jnp.arange(T), T)
  starts = jnp.min(starts_of, axis=2).astype(jnp.int32)  # [B, M]
  num_segments = jnp.sum(starts < T, axis=1, dtype=jnp.int32)
  return segment_ids, starts, num_segments


def spo_chain_advantages(
  values: jax.Array,
  rewards: jax.Array,
  segment_ids: jax.Array,
  num_segments: jax.Array,
  *,
  cutpoints: jax.Array | None = None,
) -> jax.Array:
  """Token advantages of SPO-chain: A_{b,s} = V_{b,s+1} - V_{b,s} on segment s's tokens.

  Args:
    values: [B, M] the Monte Carlo value V_{b,s} of the prefix before segment s (s < n_b; NaN or
      anything for s >= n_b: unused); V_{b,0} is the prompt's value.
    rewards: [B] the trajectories' own rewards, V_{b,n_b}. NaN (a failed reward): the row gets 0.
    segment_ids: [B, T] from ``spo_segments`` (-1 off the mask); num_segments: [B].
    cutpoints: [B, T] bool; given (``use_prob_mask``), only cutpoint tokens get their segment's
      advantage.
  Returns:
    [B, T] float32, 0 off the mask.
  """
  common.check_rank("values", values, 2, "B, M")
  B, M = values.shape
  if rewards.shape != (B,) or num_segments.shape != (B,) or segment_ids.shape[0] != B:
    raise ValueError(
      f"values {values.shape} [B, M], rewards {rewards.shape} [B], num_segments "
      f"{num_segments.shape} [B] and segment_ids {segment_ids.shape} [B, T] must share B"
    )
  values = values.astype(jnp.float32)
  s = jnp.arange(M + 1)
  # V_{b, 0..M}: the prefix values, then the reward at n_b (and beyond: unused).
  extended = jnp.concatenate([values, jnp.zeros((B, 1), jnp.float32)], axis=1)
  extended = jnp.where(s[None, :] >= num_segments[:, None], rewards[:, None], extended)
  seg_adv = extended[:, 1:] - extended[:, :-1]  # [B, M]
  valid = segment_ids >= 0
  adv = jnp.take_along_axis(seg_adv, jnp.maximum(segment_ids, 0), axis=1)
  keep = valid & jnp.isfinite(rewards)[:, None]
  if cutpoints is not None:
    common.check_same_shape(("cutpoints", "segment_ids"), (cutpoints, segment_ids))
    keep = keep & cutpoints.astype(bool)
  return jnp.where(keep, adv, 0.0)


def spo_chain_token_advantages(
  rewards: jax.Array,
  segment_values: jax.Array,
  segment_ids: jax.Array,
  num_segments: jax.Array,
  spo_cutpoints: jax.Array,
  *,
  valid: jax.Array | None = None,
  use_prob_mask: bool = True,
) -> jax.Array:
  """SPO-chain as a registered estimator (``rl.advantage='spo_chain'``, Guo et al., arXiv
  2505.23564): ``spo_chain_advantages`` on the collector's branch round.

  A_{b,t} = V_{b,s+1} - V_{b,s} for token t of segment s (V_{b,n_b} = R_b), on the cutpoint
  tokens only with ``use_prob_mask`` (the paper's probability mask), 0 elsewhere and on rows
  whose reward failed.

  Args:
    rewards: [P, G] (NaN = failed); valid: [P, G] bool (False rows get 0).
    segment_values: [B, M] V_{b,s}, the prompt's value for s = 0 and the Monte Carlo value of the
      prefix before segment s for 0 < s < n_b (``train/branching.py``).
    segment_ids, num_segments, spo_cutpoints: ``spo_segments``' [B, T] and [B], and the [B, T]
      cutpoints (``spo_cutpoints``) they were cut at.
  Returns:
    [B, T] float32.
  """
  common.check_rank("rewards", rewards, 2, "P, G")
  flat = rewards.reshape(-1).astype(jnp.float32)
  if valid is not None:
    flat = jnp.where(valid.reshape(-1), flat, jnp.nan)
  return spo_chain_advantages(
    segment_values, flat, segment_ids, num_segments,
    cutpoints=spo_cutpoints if use_prob_mask else None,
  )  # fmt: skip


def spo_tree_token_advantages(
  rewards: jax.Array,
  tree_values: jax.Array,
  segment_ids: jax.Array,
  num_segments: jax.Array,
  spo_cutpoints: jax.Array,
  *,
  valid: jax.Array | None = None,
  use_prob_mask: bool = True,
) -> jax.Array:
  """SPO-tree as a registered estimator (``rl.advantage='spo_tree'``, Guo et al., arXiv
  2505.23564): each row is a leaf of its prompt's sampling tree (``train/tree_round.py``).

  Node n's value V(n) = the mean of the finite leaf rewards under it (``tree_values``; the root's
  is the group mean). Token t of segment s of leaf b (the tokens its depth-(s+1) ancestor a_{s+1}
  sampled) gets A_{b,t} = V(a_{s+1}) - V(a_s), a node's value minus its parent's
  (``tree_advantages``); on the cutpoint tokens only with ``use_prob_mask``; 0 on rows whose
  reward failed. This is ``spo_chain_advantages`` with V_{b,s} = V(a_s): the last segment s =
  n_b - 1 gets R_b - V(a_s), which is V(a_{s+1}) for a whole leaf and for a node that ended early
  (its leaves are copies of it, with its reward).

  Args:
    rewards: [P, G] (NaN = failed); valid: [P, G] bool (False rows get 0).
    tree_values: [B, M] V(a_s), the values of leaf b's ancestors at depths s = 0..M-1 (M the
      tree's depth; s = 0 the root).
    segment_ids: [B, T] depth s of the node each completion token was sampled by (-1 off the
      mask); num_segments: [B] segments with tokens (fewer than M where a node ended early).
    spo_cutpoints: [B, T] bool, pi_old(y_t) < ``spo.prob_threshold`` (``spo_cutpoints``).
  Returns:
    [B, T] float32.
  """
  return spo_chain_token_advantages(
    rewards, tree_values, segment_ids, num_segments, spo_cutpoints, valid=valid,
    use_prob_mask=use_prob_mask,
  )  # fmt: skip


@pytree_dataclass
class SegmentTree:
  """Nodes of rollout trees, each a segment of one sequence (R nodes, a forest: one tree per
  prompt). Node i continues its parent's sequence from token ``start[i]`` of the completion.

  Attributes:
    parent: [R] int32 index of the parent node, -1 for a root (the prompt's own node: its
      segment is empty, its value the mean over all its leaves).
    depth: [R] int32, 0 for roots.
    start: [R] int32 completion position where the node's segment begins (its parent's prefix
      is the completion before it).
    reward: [R] float32 reward of a leaf (a whole trajectory); NaN for inner nodes (and for a leaf
      whose reward failed: it then counts in no mean).
  """

  parent: jax.Array
  depth: jax.Array
  start: jax.Array
  reward: jax.Array


def complete_tree(branching: tuple[int, ...], *, num_trees: int = 1) -> SegmentTree:
  """The nodes of ``num_trees`` complete trees with ``branching[d]`` children per node at depth d
  (e.g. (6, 6, 6)), level by level: roots first, then depth 1 in parent order, ...; ``start``
  0 and ``reward`` NaN everywhere (fill them from the sampled tree)."""
  if not branching or min(branching) < 1:
    raise ValueError(f"branching {branching} must be a non-empty tuple of positive ints")
  parents, depths = [-1] * num_trees, [0] * num_trees
  level = list(range(num_trees))
  for d, k in enumerate(branching):
    first = len(parents)
    parents += [p for p in level for _ in range(k)]
    depths += [d + 1] * (len(level) * k)
    level = list(range(first, len(parents)))
  R = len(parents)
  return SegmentTree(
    parent=jnp.asarray(parents, jnp.int32),
    depth=jnp.asarray(depths, jnp.int32),
    start=jnp.zeros((R,), jnp.int32),
    reward=jnp.full((R,), jnp.nan, jnp.float32),
  )


def tree_values(tree: SegmentTree, *, max_depth: int) -> jax.Array:
  """[R] float32: each node's value, the mean reward of the leaves (finite rewards) under it; NaN
  for a node with none. ``max_depth`` (static) bounds the depth of the deepest node."""
  R = tree.parent.shape[0]
  reward = tree.reward.astype(jnp.float32)
  ok = jnp.isfinite(reward)
  total = jnp.where(ok, reward, 0.0)
  count = ok.astype(jnp.float32)
  parent = jnp.where(tree.parent >= 0, tree.parent, R)  # roots add into a dropped row
  # Deepest level first: each node's subtree sums are complete when it passes them up.
  for d in range(max_depth, 0, -1):
    at = tree.depth == d
    total = total + jax.ops.segment_sum(jnp.where(at, total, 0.0), parent, R + 1)[:R]
    count = count + jax.ops.segment_sum(jnp.where(at, count, 0.0), parent, R + 1)[:R]
  return jnp.where(count > 0, total / jnp.maximum(count, 1.0), jnp.nan)


def tree_advantages(tree: SegmentTree, *, max_depth: int) -> jax.Array:
  """[R] float32 SPO-tree advantage of each node: its value minus its parent's (0 for roots and
  for nodes without a finite value)."""
  v = tree_values(tree, max_depth=max_depth)
  parent_v = jnp.take(v, jnp.maximum(tree.parent, 0))
  adv = v - parent_v
  return jnp.where((tree.parent >= 0) & jnp.isfinite(adv), adv, 0.0)
