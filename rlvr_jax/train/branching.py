"""The branch round of SPO-chain: Monte Carlo values of prefixes, for estimators reading them.

SPO (Segment Policy Optimization, Guo et al., arXiv 2505.23564) credits a completion segment by
segment (``advantages.segments``). After a rollout batch is sampled and rewarded, the collector
(``train/rollout.py``) calls ``segment_values`` when the estimator reads ``segment_values``:

  1. cutpoints: completion tokens the sampler found unlikely, exp(sampler_logp) <
     ``spo.prob_threshold``; a segment starts at every ``spo.cutpoint_interval``-th cutpoint, at
     most ``spo.max_segments`` per row (``spo_segments``);
  2. forks: every start s > 0 of every row is a prefix (prompt + completion[:start]); the sampler
     draws ``spo.num_branches`` continuations of each (``sampling.continuous.fork_prefixes``, then
     the configured engine with the row's remaining budget as its length limit), the same
     strategy and stop tokens as the rollout;
  3. rewards: each continuation is rewarded as prefix + continuation by the run's reward function
     (the same workers, fields and timeouts); V_{b,s} = the mean of its valid rewards;
  4. V_{b,0}, the prompt's value, is the mean valid reward of the row's group: the G rollouts are
     G Monte Carlo samples from the prompt, so no extra round is needed for it.

A prefix whose continuations all failed their reward takes the previous boundary's value (its
segment then gets no credit). Metrics: ``spo/forks`` (prefixes continued), ``spo/branch_tokens``
(tokens the round sampled), ``spo/segments_mean``, ``time/branch``.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax import sampling
from rlvr_jax.advantages import segments
from rlvr_jax.train import reward_results

READS = frozenset({"segment_values", "segment_ids", "num_segments", "spo_cutpoints"})


def segment_values(collector, params, host, rewards, records, prompts, *, key) -> tuple[dict, dict]:
  """The SPO inputs of one rollout batch (see the module docstring).

  Args:
    collector: the ``rollout.Collector`` (its config, tokenizer, reward function and runtime).
    params: the policy in the sampling layout.
    host: the rollout as host arrays (P * G rows, group ordered).
    rewards: [P, G] the rows' rewards (NaN = failed).
    records: the P data records; prompts: their P prompt texts (for the reward function).
    key: the base key of this round's continuations.
  Returns:
    ({segment_values [B, M], segment_ids [B, T], num_segments [B], spo_cutpoints [B, T]},
     metrics).
  """
  t0 = time.perf_counter()
  c = collector.c
  o = c.spo
  P, G = rewards.shape
  mask = jnp.asarray(host.completion_mask)
  cut = segments.spo_cutpoints(
    jnp.asarray(host.sampler_logp), mask, prob_threshold=o.prob_threshold
  )
  seg_ids, starts, nseg = segments.spo_segments(
    cut, mask, cutpoint_interval=o.cutpoint_interval, max_segments=o.max_segments
  )
  starts, nseg = np.asarray(starts), np.asarray(nseg)
  B, M = starts.shape
  T = host.tokens.shape[1]
  values = np.full((B, M), np.nan, np.float32)
  values[:, 0] = np.repeat(_mean_of_finite(rewards), G)
  forks = [(b, s) for b in range(B) for s in range(1, int(nseg[b]))]
  branch_tokens = 0
  if forks:
    rows = np.array([b for b, _ in forks])
    positions = np.array([starts[b, s] for b, s in forks])
    ids, fmask = sampling.continuous.fork_prefixes(host, rows, positions, pad_id=collector.pad_id)
    K = o.num_branches
    rollout = jax.device_get(collector._generate(
      params, ids, fmask, np.arange(len(ids), dtype=np.int32), key, None, K, max_new_tokens=T,
      max_lengths=np.repeat(T - positions, K), buckets=sampling.DEFAULT_BUCKETS,
    ))  # fmt: skip
    cont = np.asarray(rollout.tokens)
    cont_mask = np.asarray(rollout.completion_mask)
    branch_tokens = int(cont_mask.sum())
    # Each continuation's completion, as the reward sees it: the prefix, then the continuation.
    full = np.full((len(forks) * K, T), collector.pad_id, np.int32)
    full_mask = np.zeros(full.shape, bool)
    for i, (b, p) in enumerate(zip(rows, positions, strict=True)):
      for j in range(i * K, (i + 1) * K):
        n = int(cont_mask[j].sum())
        full[j, :p], full[j, p : p + n] = host.tokens[b, :p], cont[j, :n]
        full_mask[j, : p + n] = True
    texts = collector.tokenizer.decode_batch(full, full_mask)
    fork_records = [records[b // G] for b in rows]
    fields = reward_results.reward_fields(fork_records, K, c.reward.example_fields)
    result = collector.runtime.submit(
      collector.reward_fn, [prompts[b // G] for b in rows for _ in range(K)], texts,
      completion_lengths=full_mask.sum(-1).tolist(), group_size=K, **fields,
    ).result()  # fmt: skip
    reward_results.log_reward_failures(result)
    means = _mean_of_finite(np.asarray(result.rewards, np.float32).reshape(len(forks), K))
    for (b, s), v in zip(forks, means, strict=True):
      values[b, s] = v
  for s in range(1, M):  # a prefix without a valid continuation: the previous boundary's value
    values[:, s] = np.where(np.isnan(values[:, s]), values[:, s - 1], values[:, s])
  inputs = {
    "segment_values": values,
    "segment_ids": np.asarray(seg_ids),
    "num_segments": nseg,
    "spo_cutpoints": np.asarray(cut),
  }
  metrics = {
    "spo/forks": float(len(forks)),
    "spo/branch_tokens": float(branch_tokens),
    "spo/segments_mean": float(nseg.mean()),
    "time/branch": time.perf_counter() - t0,
  }
  return inputs, metrics


def _mean_of_finite(x: np.ndarray) -> np.ndarray:
  """Row means of the finite entries of ``x`` [R, n]; NaN for a row with none (no warning)."""
  ok = np.isfinite(x)
  return np.where(ok.any(1), np.where(ok, x, 0).sum(1) / np.maximum(ok.sum(1), 1), np.nan)
