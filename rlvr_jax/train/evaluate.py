"""Held-out evaluation: greedy accuracy, and pass@1 / pass@k from k samples per problem.

  accuracy  = mean over problems of correct(greedy completion)
  pass@1    = mean over problems and samples of correct(sample)         (temperature eval.temperature)
  pass@k    = mean over problems of 1 - C(n - c, k) / C(n, k) with n = k samples, i.e. any correct

Correctness is the reward's ``correct`` outcome, computed by the same ``RewardRuntime`` as in
training. Sampling keys come from a fixed evaluation key, so evaluations are comparable across steps.
"""

from __future__ import annotations

import jax
import numpy as np

from rlvr_jax import sampling


def _correct(collector, params, records, *, key, strategy, num_samples):
  out = []
  bs = collector.c.eval.batch_size
  for start in range(0, len(records), bs):
    chunk = records[start : start + bs]
    texts, rollout = collector.sample(
      params, chunk, key=key, strategy=strategy, num_samples=num_samples
    )
    _, future = collector.submit_rewards(texts, chunk, rollout, num_samples)
    result = future.result()
    correct = np.asarray(result.info.get("correct", result.rewards), np.float32)
    out.append(np.nan_to_num(correct, nan=0.0).reshape(len(chunk), num_samples))
  return np.concatenate(out, 0)


def evaluate(collector, params, records, *, seed: int = 1234) -> dict:
  """Metrics ``eval/accuracy`` (greedy), ``eval/pass@1`` and ``eval/pass@k`` on ``records``."""
  cfg = collector.c.eval
  records = [{**r, "index": i} for i, r in enumerate(records)]
  key = jax.random.key(seed)
  greedy = _correct(collector, params, records, key=key, strategy=sampling.Greedy(), num_samples=1)
  out = {"eval/accuracy": float(greedy.mean())}
  k = int(cfg.num_samples)
  sampled = _correct(
    collector,
    params,
    records,
    key=key,
    strategy=sampling.Temperature(cfg.temperature),
    num_samples=k,
  )
  out["eval/pass@1"] = float(sampled.mean())
  out[f"eval/pass@{k}"] = float((sampled.max(axis=1) > 0).mean())
  return out
