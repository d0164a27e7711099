"""Held-out evaluation: greedy accuracy, pass@1 / pass@k from k samples per problem, and what the
samples look like (answer format, length, entropy), each with its standard error.

  accuracy  = mean over problems of correct(greedy completion)
  pass@1    = mean over problems and samples of correct(sample)         (temperature eval.temperature)
  pass@k    = mean over problems of 1 - C(n - c, k) / C(n, k) with n = k samples, i.e. any correct
  format    = mean over samples of the reward's ``formatted`` flag (answer in the asked-for form,
              e.g. ``\\boxed{}``), else of its ``has_answer`` flag; absent when the reward has neither
  length    = mean completion length of the samples (tokens), ``truncated`` = share that hit the limit;
              ``length_correct`` / ``length_incorrect`` = the same over a problem's correct / wrong
              samples, averaged over the problems that have such a sample
  entropy   = mean over sampled tokens of -log pi(token) under the model at temperature 1: the Monte
              Carlo estimate of the per-token entropy of the policy (unbiased when eval.temperature
              is 1; at another temperature it is the cross-entropy of those samples)

Each ``eval/<m>`` comes with ``eval/<m>_se``, the standard error over problems: the problems are the
independent units (a problem's k samples are correlated), so SE = std(per-problem value) / sqrt(n),
with the sample standard deviation (ddof 1). A rise is significant at z standard errors when
``after - before >= z * sqrt(se_before^2 + se_after^2)``.

Correctness is the reward's ``correct`` outcome, computed by the same ``RewardRuntime`` as in
training. Sampling keys come from a fixed evaluation key, so evaluations are comparable across steps.
"""

from __future__ import annotations

import jax
import numpy as np

from rlvr_jax import sampling


def _score(collector, params, records, *, key, strategy, num_samples) -> dict[str, np.ndarray]:
  """Per-sample arrays [n_problems, num_samples]: correct, format (NaN when the reward has no
  format flag), length, truncated, and the sum and count of the sampled tokens' -log pi."""
  cols: dict[str, list] = {k: [] for k in ("correct", "format", "length", "truncated", "nll")}
  bs = collector.c.eval.batch_size
  for start in range(0, len(records), bs):
    chunk = records[start : start + bs]
    texts, rollout = collector.sample(
      params, chunk, key=key, strategy=strategy, num_samples=num_samples
    )
    _, future = collector.submit_rewards(texts, chunk, rollout, num_samples)
    result = future.result()
    shape = (len(chunk), num_samples)
    correct = np.asarray(result.info.get("correct", result.rewards), np.float32)
    cols["correct"].append(np.nan_to_num(correct, nan=0.0).reshape(shape))
    flag = result.info.get("formatted", result.info.get("has_answer"))
    fmt = np.full(shape, np.nan) if flag is None else np.asarray(flag, np.float64).reshape(shape)
    cols["format"].append(fmt)
    mask = np.asarray(rollout.completion_mask)
    cols["length"].append(mask.sum(-1).reshape(shape).astype(np.float64))
    cols["truncated"].append(np.asarray(rollout.truncated).reshape(shape).astype(np.float64))
    nll = -np.where(mask, np.asarray(rollout.model_logp, np.float64), 0.0).sum(-1)
    cols["nll"].append(nll.reshape(shape))
  return {k: np.concatenate(v, 0) for k, v in cols.items()}


def _mean_se(per_problem: np.ndarray) -> tuple[float, float]:
  """Mean over problems and its standard error (NaN with fewer than two problems)."""
  x = np.asarray(per_problem, np.float64)
  n = x.shape[0]
  se = float(x.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
  return float(x.mean()), se


def evaluate(collector, params, records, *, seed: int = 1234) -> dict:
  """``eval/accuracy`` (greedy), ``eval/pass@1``, ``eval/pass@k``, ``eval/format``,
  ``eval/length``, ``eval/truncated``, ``eval/entropy`` on ``records``, each with ``_se``."""
  cfg = collector.c.eval
  records = [{**r, "index": i} for i, r in enumerate(records)]
  key = jax.random.key(seed)
  out: dict[str, float] = {}

  def put(name, per_problem):
    out[f"eval/{name}"], out[f"eval/{name}_se"] = _mean_se(per_problem)

  greedy = _score(collector, params, records, key=key, strategy=sampling.Greedy(), num_samples=1)
  put("accuracy", greedy["correct"][:, 0])
  k = int(cfg.num_samples)
  s = _score(
    collector,
    params,
    records,
    key=key,
    strategy=sampling.Temperature(cfg.temperature),
    num_samples=k,
  )
  put("pass@1", s["correct"].mean(1))
  put(f"pass@{k}", (s["correct"].max(axis=1) > 0).astype(np.float64))
  if not np.isnan(s["format"]).any():
    put("format", s["format"].mean(1))
  put("length", s["length"].mean(1))
  for name, rows in (
    ("length_correct", s["correct"] > 0.5),
    ("length_incorrect", s["correct"] <= 0.5),
  ):
    has = rows.any(1)  # problems with at least one sample of that outcome
    if has.any():
      put(name, (s["length"] * rows).sum(1)[has] / rows.sum(1)[has])
  put("truncated", s["truncated"].mean(1))
  # per problem: token-weighted mean -log pi over its k samples
  put("entropy", s["nll"].sum(1) / np.maximum(s["length"].sum(1), 1.0))
  return out
