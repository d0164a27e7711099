"""The retry round of Reflect-then-Retry RL: failed rollouts retried from their failure point.

Reflect-then-Retry RL (Shi et al., arXiv 2601.03715; for estimators that read ``retry_prefix``)
restarts a failed trajectory from the
point where it went wrong instead of sampling a new one from scratch, trains only the suffix
where the two trajectories differ (pivotal credit) and lifts the successes (positive
amplification, ``advantages.segments.r3l_token_advantages``). After a rollout round is rewarded
(``rollout.Collector._round``), for each group:

  1. pairs: the group's failed rows (``correct`` <= 0.5, finite reward) in row order, taken two
     by two, at most ``retries.max_pairs`` pairs: the first row of a pair is retried, the second
     gives up its place to the retry (the group keeps its G rows: static shapes);
  2. failure point: the completion token the sampler found least likely in the retried row,
     k = argmin_t log pi_old(y_t) (the first on ties). The paper asks the model to reflect in
     language and name the failing step; the least likely token is the cheap, model-free stand-in
     used here: the place where the trajectory took its most surprising turn;
  3. retry: the prefix prompt + completion[:k] continued once by the sampler (the configured
     engine and strategy, the row's remaining budget; ``sampling.continuous.fork_prefixes``),
     so token k is sampled afresh; the retry is rewarded as prefix + continuation by the run's
     reward function and scored by the same no-grad passes as the rollout;
  4. pivotal credit: both rows of a pair carry ``retry_prefix`` = k; the estimator gives their
     first k completion tokens no advantage and the collector drops them from the loss's mask.

A pair's two rows then start from the same k tokens and differ after them: the contrast the loss
sees is the one between the failed suffix and the retried one. The retry is an on-policy sample
given its prefix (no reflection text enters its context), so its importance ratios stay honest.
Metrics: ``retry/pairs`` (pairs retried), ``retry/rescued`` (retries that succeeded),
``retry/tokens`` (tokens the round sampled), ``retry/failure_point_mean``, ``time/retry``.
One process only: the failed rows differ between processes.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from rlvr_jax.train import branching

READS = frozenset({"retry_prefix"})


def retry_pairs(correct: np.ndarray, rewards: np.ndarray, max_pairs: int) -> list[tuple]:
  """(group p, retried row j, replaced row j') of each retry (step 1 of the module docstring):
  the failed rows of group p (``correct`` <= 0.5 with a finite reward), two by two in row
  order, at most ``max_pairs`` pairs per group. ``correct``, ``rewards``: [P, G]."""
  out = []
  for p in range(correct.shape[0]):
    failed = np.flatnonzero((correct[p] <= 0.5) & np.isfinite(rewards[p]))
    for k in range(min(max_pairs, len(failed) // 2)):
      out.append((p, int(failed[2 * k]), int(failed[2 * k + 1])))
  return out


def failure_points(sampler_logp: np.ndarray, completion_mask: np.ndarray) -> np.ndarray:
  """[R] int: the completion position with the lowest sampler log-prob of each row (step 2):
  the token a retry samples afresh. Rows [R, T]; a row without completion tokens gives 0."""
  masked = np.where(np.asarray(completion_mask, bool), np.asarray(sampler_logp), np.inf)
  return np.argmin(masked, axis=1).astype(np.int32)


def retry_failures(
  collector, params, host, rewards, correct, completions, scores, records, prompts, *, key,
  rows_per_prompt: int, ref_params, need_old: bool, prm_params,
):  # fmt: skip
  """The retry round on one rewarded batch (see the module docstring).

  Args:
    collector: the ``rollout.Collector``; params: the policy in the sampling layout.
    host: the rollout as host arrays (P * G_gen rows, group ordered; G_gen = ``rows_per_prompt``).
    rewards, correct: [P, G] of the sampled rows; completions: every row's text; scores: the
      no-grad passes' [B_gen, T] arrays; records, prompts: the P records and prompt texts.
    key: the base key of the retries; ref_params, need_old, prm_params: as for the rollout's
      scores.
  Returns:
    (host, rewards, correct, completions, scores) with the replaced rows rewritten,
    ``retry_prefix`` [B_gen] int32, and the round's metrics.
  """
  t0 = time.perf_counter()
  if collector.layout.process_count > 1:
    raise NotImplementedError(
      "the retry round (an estimator reading retry_prefix) runs on one process; this run has "
      "several"
    )
  G_gen = rows_per_prompt
  prefix = np.zeros(host.tokens.shape[0], np.int32)
  pairs = retry_pairs(correct, rewards, collector.c.retries.max_pairs)
  metrics = {"retry/pairs": float(len(pairs)), "retry/rescued": 0.0, "retry/tokens": 0.0}
  if not pairs:
    metrics["time/retry"] = time.perf_counter() - t0
    return host, rewards, correct, completions, scores, prefix, metrics
  retried = np.array([p * G_gen + j for p, j, _ in pairs])
  replaced = np.array([p * G_gen + j for p, _, j in pairs])
  points = failure_points(host.sampler_logp[retried], host.completion_mask[retried])
  cont = branching.continue_prefixes(collector, params, host, retried, points, 1, key=key)
  spliced = branching.splice_continuations(host, retried, points, cont, 1, pad_id=collector.pad_id)
  result, texts = branching.reward_rows(
    collector, spliced, [records[p] for p, _, _ in pairs], [prompts[p] for p, _, _ in pairs],
    group_size=1,
  )  # fmt: skip
  # The replaced rows take the retries' completions (same prompt: same group).
  fields = {}
  for f in dataclasses.fields(host):
    value = getattr(host, f.name)
    if f.name in spliced and spliced[f.name] is not None and value is not None:
      value = np.array(value)
      value[replaced] = spliced[f.name]
    fields[f.name] = value
  host = dataclasses.replace(host, **fields)
  new_rewards = np.asarray(result.rewards, np.float32)
  new_correct = np.asarray(result.info.get("correct", result.rewards), np.float32)
  rewards, correct, completions = np.array(rewards), np.array(correct), list(completions)
  for i, (p, _, j) in enumerate(pairs):
    rewards[p, j], correct[p, j] = new_rewards[i], new_correct[i]
    completions[p * G_gen + j] = texts[i]
  if scores:  # the replaced rows' no-grad passes, on their new completions
    # Padded (repeats of the first) to a power of two and whole micro-batches of the passes.
    rows = branching.padded_rows(replaced, collector.c.rl.num_microbatches)
    again = collector._scores(
      params, ref_params, jax.tree.map(lambda x: x[rows], host), need_old=need_old,
      prm_params=prm_params, rows_per_prompt=1,
    )  # fmt: skip
    scores = {k: np.array(v) for k, v in scores.items()}
    for k, v in again.items():
      scores[k][replaced] = np.asarray(v)[: len(replaced)]
  prefix[retried] = points
  prefix[replaced] = points
  metrics.update({
    "retry/rescued": float(np.sum(new_correct > 0.5)),
    "retry/tokens": float(np.asarray(cont.completion_mask).sum()),
    "retry/failure_point_mean": float(points.mean()),
    "time/retry": time.perf_counter() - t0,
  })  # fmt: skip
  return host, rewards, correct, completions, scores, prefix, metrics
