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
  values = np.full((B, M), np.nan, np.float32)
  values[:, 0] = np.repeat(_mean_of_finite(rewards), G)
  forks = [(b, s) for b in range(B) for s in range(1, int(nseg[b]))]
  branch_tokens = 0
  if forks:
    rows = np.array([b for b, _ in forks])
    positions = np.array([starts[b, s] for b, s in forks])
    K = o.num_branches
    rollout = continue_prefixes(collector, params, host, rows, positions, K, key=key)
    spliced = splice_continuations(host, rows, positions, rollout, K, pad_id=collector.pad_id)
    branch_tokens = int(np.asarray(rollout.completion_mask).sum())
    result, _ = reward_rows(
      collector, spliced, [records[b // G] for b in rows for _ in range(K)],
      [prompts[b // G] for b in rows for _ in range(K)], group_size=K,
    )  # fmt: skip
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


def continue_prefixes(collector, params, host, rows, positions, K: int, *, key):
  """K continuations of each prefix (row ``rows[i]`` of ``host`` cut at ``positions[i]``), each
  within the row's remaining budget T - position: ``fork_prefixes``, then the collector's engine
  and strategy (``Collector._generate``). Returns the host ``Rollout`` of the R K continuations
  (fork i's at rows i K .. i K + K - 1).

  The fork count R varies from batch to batch; it is padded to the next power of two (repeats
  of fork 0, dropped after), so the sampler compiles for a few shapes, not for every R. A row's
  draws depend on its key and index only, not on the rows after it."""
  rows, positions = np.asarray(rows), np.asarray(positions)
  R = len(rows)
  rows_p, positions_p = padded_rows(rows), padded_rows(positions)
  padded = len(rows_p)
  ids, mask = sampling.continuous.fork_prefixes(host, rows_p, positions_p, pad_id=collector.pad_id)
  T = np.asarray(host.tokens).shape[1]
  rollout = collector._generate(
    params, ids, mask, np.arange(padded, dtype=np.int32), key, None, K, max_new_tokens=T,
    max_lengths=np.repeat(T - positions_p, K), buckets=sampling.DEFAULT_BUCKETS,
  )  # fmt: skip
  return jax.tree.map(lambda x: np.asarray(x)[: R * K], jax.device_get(rollout))


def padded_rows(x: np.ndarray, multiple: int = 1) -> np.ndarray:
  """``x`` [R, ...] padded with repeats of ``x[0]`` to the next power of two rows, rounded up to a
  multiple of ``multiple`` (e.g. the micro-batch count of a scoring pass): a call over a varying
  number of forks then compiles for a few shapes only."""
  x = np.asarray(x)
  padded = 1 << max(len(x) - 1, 0).bit_length()
  padded = -(-padded // multiple) * multiple
  return np.concatenate([x, np.repeat(x[:1], padded - len(x), axis=0)])


def splice_continuations(host, rows, positions, cont, K: int, *, pad_id: int) -> dict:
  """Rows made of a prefix and a continuation: for fork i (row ``rows[i]`` of ``host`` cut at
  ``positions[i]``) and its K continuations j in ``cont`` (rows i K .. i K + K - 1, e.g.
  ``_generate`` on ``fork_prefixes`` with ``num_samples=K``), the completion
  host.tokens[row, :position] + cont.tokens[j, :n_j], with the per-token arrays (``sampler_logp``,
  ``model_logp``, ``sampler_threshold``) spliced the same way. Returns host arrays of every
  per-row ``Rollout`` field a completion defines: tokens, completion_mask, sampler_logp,
  model_logp, sampler_threshold (None unless both have it), lengths, finished, truncated."""
  T = np.asarray(host.tokens).shape[1]
  R = len(rows) * K
  per_token = {"tokens": pad_id, "sampler_logp": 0.0, "model_logp": 0.0}
  if host.sampler_threshold is not None and cont.sampler_threshold is not None:
    per_token["sampler_threshold"] = 0.0
  out = {
    k: np.full((R, T), fill, np.asarray(getattr(host, k)).dtype) for k, fill in per_token.items()
  }
  out["completion_mask"] = np.zeros((R, T), bool)
  cmask = np.asarray(cont.completion_mask)
  lengths = np.zeros(R, np.int32)
  for i, (b, p) in enumerate(zip(rows, positions, strict=True)):
    for j in range(i * K, (i + 1) * K):
      n = min(int(cmask[j].sum()), T - p)
      for k in per_token:
        out[k][j, :p] = np.asarray(getattr(host, k))[b, :p]
        out[k][j, p : p + n] = np.asarray(getattr(cont, k))[j, :n]
      out["completion_mask"][j, : p + n] = True
      lengths[j] = p + n
  out["lengths"] = lengths
  out["finished"] = np.asarray(cont.finished).astype(bool)
  out["truncated"] = ~out["finished"] & (lengths >= T)
  out.setdefault("sampler_threshold", None)
  return out


def reward_rows(collector, spliced: dict, records, prompts, *, group_size: int):
  """The run's reward function on spliced rows (``splice_continuations``), one record and
  prompt text per row (groups of ``group_size``); the same workers, fields and timeouts as the
  rollout. Failures are logged; returns (the ``RewardResult``, the rows' decoded texts)."""
  texts = collector.tokenizer.decode_batch(spliced["tokens"], spliced["completion_mask"])
  fields = reward_results.reward_fields(records, 1, collector.c.reward.example_fields)
  result = collector.runtime.submit(
    collector.reward_fn, list(prompts), texts,
    completion_lengths=spliced["completion_mask"].sum(-1).tolist(), group_size=group_size,
    **fields,
  ).result()  # fmt: skip
  reward_results.log_reward_failures(result)
  return result, texts


def _mean_of_finite(x: np.ndarray) -> np.ndarray:
  """Row means of the finite entries of ``x`` [R, n]; NaN for a row with none (no warning)."""
  ok = np.isfinite(x)
  return np.where(ok.any(1), np.where(ok, x, 0).sum(1) / np.maximum(ok.sum(1), 1), np.nan)
