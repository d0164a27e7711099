"""SPO-tree's tree round: each prompt's G rows are the leaves of a sampling tree.

SPO (Segment Policy Optimization, Guo et al., arXiv 2505.23564), tree variant: instead of G
independent rollouts, the collector (``train/rollout.py``, for estimators that read
``tree_values``) samples each prompt's G rows as the leaves of a complete tree with
k_d = ``spo.tree_branching[d]`` children per node at depth d (prod_d k_d = G):

  1. level 0: k_0 children of each prompt, each sampling ``seg`` tokens (``spo.tree_segment_tokens``;
     0 = ``sampling.max_new_tokens`` // D, D = the tree's depth);
  2. level d > 0: every node's sequence so far (prompt + completion so far) is a prefix
     (``sampling.continuous.fork_prefixes``); k_d children continue it by ``seg`` more tokens (the
     last level: the rest of ``max_new_tokens``), through ``Collector._generate`` (the run's
     engine, strategy and stop tokens), so a level's tokens and log-probs are the static
     sampler's for the same prefixes and key (``level_key``, node ids ``node_ids``);
  3. a node that ended (a stop token) is not continued: its children are copies of it;
  4. the P G leaves are one ``Rollout`` (group ordered, leaves in ``segments.complete_tree``'s
     level order), rewarded like any rollout; the prefix tokens' log-probs are the ancestors'.

After the rewards, ``tree_inputs`` gives the estimator's inputs: node n's value V(n) = the mean of
the finite leaf rewards under it (``segments.tree_values``; the root's is the group mean), each
leaf's ancestors' values ``tree_values`` [B, D] (depths 0..D-1), the depth of the segment each of
its tokens belongs to ``segment_ids`` [B, T] (token t of leaf b is in segment s when its depth-(s+1)
ancestor sampled it), ``num_segments`` [B] and SPO's ``spo_cutpoints``; the advantage of a token of
segment s is V(a_{s+1}) - V(a_s) (``advantages.spo_tree_token_advantages``).

Metrics: ``spo/tree_nodes_sampled`` (nodes whose segment was sampled, not copied) and the tokens
they sampled (``rollout/sampled_tokens``: leaves share their prefixes). One process only.
"""

from __future__ import annotations

import dataclasses
import math
import types

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax import sampling
from rlvr_jax.advantages import segments
from rlvr_jax.train import branching as branching_lib
from rlvr_jax.types import Rollout

READS = frozenset({"tree_values", "segment_ids", "num_segments", "spo_cutpoints"})


def level_budgets(branching, max_new_tokens: int, segment_tokens: int = 0) -> tuple[int, ...]:
  """Tokens each level may sample: ``seg`` (``segment_tokens``, 0 = max_new_tokens // D) for the
  D - 1 inner levels, the rest of ``max_new_tokens`` for the last."""
  D = len(branching)
  seg = segment_tokens or max_new_tokens // D
  last = max_new_tokens - seg * (D - 1)
  if seg < 1 or last < 1:
    raise ValueError(f"{D} tree levels of {seg} tokens do not fit max_new_tokens={max_new_tokens}")
  return (seg,) * (D - 1) + (last,)


def level_key(key: jax.Array, depth: int) -> jax.Array:
  """The sampling key of level ``depth`` (its nodes' children) of a round with base ``key``."""
  return jax.random.fold_in(key, depth)


def node_ids(indices, depth: int, branching) -> np.ndarray:
  """[P N_d] int32 key ids of the depth-``depth`` nodes of the trees of prompts with data
  ``indices`` [P] (N_d = prod(branching[:depth]) nodes per tree, in level order): index N_d + j
  for node j of its tree, so a node's children do not depend on the batch it is in."""
  n = math.prod(branching[:depth])
  return (np.asarray(indices, np.int64)[:, None] * n + np.arange(n)).reshape(-1).astype(np.int32)


def sample_tree(collector, params, records, *, key) -> tuple[list, Rollout, dict]:
  """The tree round of ``records`` (the module docstring).

  Args:
    collector: the ``rollout.Collector``; params: the policy in the sampling layout.
    records: the P data records (each with its global ``index``); key: the round's base key.
  Returns:
    (prompt texts, the ``Rollout`` of the P G leaves, tree info: ``starts`` [B, D] int32 the
    completion position where each leaf's depth-(s+1) ancestor's segment starts (its parent's
    length), ``sampled_tokens`` (the tokens the levels sampled) and ``metrics``).
  """
  if collector.layout.process_count > 1:
    raise NotImplementedError(
      "SPO-tree's tree round (an estimator reading tree_values) runs on one process; this run "
      "has several"
    )
  c = collector.c
  branching = tuple(int(k) for k in c.spo.tree_branching)
  T = c.sampling.max_new_tokens
  budgets = level_budgets(branching, T, c.spo.tree_segment_tokens)
  texts, ids, mask = collector.prompts(records)
  indices = np.asarray([r["index"] for r in records], np.int32)
  P, D = len(records), len(branching)
  # The current level's nodes (the roots first): their completions so far, host arrays.
  node = dict(
    tokens=np.full((P, T), collector.pad_id, np.int32),
    sampler_logp=np.zeros((P, T), np.float32),
    model_logp=np.zeros((P, T), np.float32),
    sampler_threshold=None,
    lengths=np.zeros(P, np.int32),
    finished=np.zeros(P, bool),
    starts=np.zeros((P, D), np.int32),
  )
  prompt = None  # the roots' prompts as the sampler pads them: [P, S] ids and mask
  sampled_tokens = sampled_nodes = 0
  for d, (k, budget) in enumerate(zip(branching, budgets, strict=True)):
    alive = np.flatnonzero(~node["finished"])
    parent = node
    node = {n: None if v is None else np.repeat(v, k, axis=0) for n, v in parent.items()}
    node["starts"][:, d] = node["lengths"]  # copies of an ended node: an empty segment
    if not alive.size:
      continue
    if d == 0:  # the prompts, as the plain sampler gets them
      forks, prefix_ids, prefix_mask, buckets = alive, ids, mask, None
    else:  # each live node's prompt and completion so far
      # Padded to a power of two with repeats of the first (dropped after): few shapes.
      forks = branching_lib.padded_rows(alive)
      per_tree = len(parent["lengths"]) // P
      parents = types.SimpleNamespace(
        prompt_tokens=np.repeat(prompt[0], per_tree, axis=0),
        prompt_mask=np.repeat(prompt[1], per_tree, axis=0),
        tokens=parent["tokens"], lengths=parent["lengths"],
      )  # fmt: skip
      prefix_ids, prefix_mask = sampling.continuous.fork_prefixes(
        parents, forks, parent["lengths"][forks], pad_id=collector.pad_id
      )
      buckets = sampling.DEFAULT_BUCKETS
    cont = collector._generate(
      params, prefix_ids, prefix_mask, node_ids(indices, d, branching)[forks], level_key(key, d),
      None, k, max_new_tokens=budget, buckets=buckets,
    )  # fmt: skip
    cont = jax.tree.map(lambda x, n=alive.size * k: np.asarray(x)[:n], jax.device_get(cont))
    if d == 0:
      prompt = (np.asarray(cont.prompt_tokens)[::k], np.asarray(cont.prompt_mask)[::k])
    if cont.sampler_threshold is not None and parent["sampler_threshold"] is None:
      # A truncating strategy: thresholds from here on (0 on the still empty completions).
      parent["sampler_threshold"] = np.zeros_like(parent["sampler_logp"])
      node["sampler_threshold"] = np.zeros_like(node["sampler_logp"])
    # Child j of live node a: a's completion so far, then continuation j.
    spliced = branching_lib.splice_continuations(
      types.SimpleNamespace(**parent), alive, parent["lengths"][alive], cont, k,
      pad_id=collector.pad_id,
    )  # fmt: skip
    children = (alive[:, None] * k + np.arange(k)).reshape(-1)
    for name in (
      "tokens",
      "sampler_logp",
      "model_logp",
      "sampler_threshold",
      "lengths",
      "finished",
    ):
      if spliced[name] is not None:
        node[name][children] = spliced[name]
    sampled_tokens += int(np.asarray(cont.completion_mask).sum())
    sampled_nodes += alive.size * k
  G = math.prod(branching)
  lengths = node["lengths"]
  rollout = Rollout(
    prompt_tokens=np.repeat(prompt[0], G, axis=0),
    prompt_mask=np.repeat(prompt[1], G, axis=0),
    tokens=node["tokens"],
    sampler_logp=node["sampler_logp"],
    model_logp=node["model_logp"],
    completion_mask=np.arange(T)[None, :] < lengths[:, None],
    lengths=lengths,
    finished=node["finished"],
    truncated=~node["finished"],
    prompt_ids=np.repeat(indices, G),
    sample_ids=np.tile(np.arange(G, dtype=np.int32), P),
    sampler_threshold=node["sampler_threshold"],
  )
  info = dict(
    starts=node["starts"],
    sampled_tokens=sampled_tokens,
    metrics={"spo/tree_nodes_sampled": float(sampled_nodes)},
  )
  return texts, jax.tree.map(jnp.asarray, rollout), info


def tree_inputs(c, host, rewards: np.ndarray, info: dict) -> dict:
  """The estimator inputs of a tree round (the module docstring) from its leaves' rewards.

  Args:
    c: the run config (``spo.tree_branching``, ``spo.prob_threshold``).
    host: the leaves' rollout as host arrays (``completion_mask``, ``sampler_logp``).
    rewards: [P, G] the leaves' rewards (NaN = failed); info: ``sample_tree``'s tree info.
  Returns:
    {tree_values [B, D] float32, segment_ids [B, T] int32, num_segments [B] int32,
     spo_cutpoints [B, T] bool}.
  """
  branching = tuple(int(k) for k in c.spo.tree_branching)
  P, G = rewards.shape
  D, B = len(branching), P * G
  tree = segments.complete_tree(branching, num_trees=P)
  R = tree.parent.shape[0]
  reward = np.full(R, np.nan, np.float32)
  reward[R - B :] = rewards.reshape(-1)  # the last level: the leaves, group ordered
  tree = dataclasses.replace(tree, reward=jnp.asarray(reward))
  value = np.asarray(segments.tree_values(tree, max_depth=D))
  parent = np.asarray(tree.parent)
  values = np.zeros((B, D), np.float32)
  node = np.arange(R - B, R)
  for d in range(D - 1, -1, -1):  # up from the leaves: the ancestor at depth d
    node = parent[node]
    values[:, d] = value[node]
  mask = np.asarray(host.completion_mask, bool)
  lengths = mask.sum(1)
  starts = np.asarray(info["starts"])[:, 1:]  # where segments 1..D-1 start
  t = np.arange(mask.shape[1])
  depth = (t[None, :, None] >= starts[:, None, :]).sum(-1)
  cut = segments.spo_cutpoints(
    jnp.asarray(host.sampler_logp), jnp.asarray(mask), prob_threshold=c.spo.prob_threshold
  )
  return {
    "tree_values": values,
    "segment_ids": np.where(mask, depth, -1).astype(np.int32),
    "num_segments": (1 + (starts < lengths[:, None]).sum(1)).astype(np.int32),
    "spo_cutpoints": np.asarray(cut),
  }
