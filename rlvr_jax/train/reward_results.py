"""What the rollout collector does with the reward side: the per-row example fields it passes to
the reward, the reward metrics of one step merged over its generation rounds, and one warning per
batch with failed reward items."""

from __future__ import annotations

import collections
import logging

import numpy as np

from rlvr_jax.train import reward_config

_log = logging.getLogger(__name__)


def reward_fields(records, num_samples: int, example_fields=()) -> dict:
  """Per-row example fields for the reward: ``answer``, and the other
  ``reward_config.PASSED_FIELDS`` when the records have them (countdown's numbers / target,
  code tests, reasoning-gym's {task, config, entry}, HumanEval's code_prefix / entry_point), plus
  ``reward.example_fields`` (which every record must have)."""
  fields = {"answer": [r["answer"] for r in records for _ in range(num_samples)]}
  for extra in (*reward_config.PASSED_FIELDS[1:], *example_fields):
    if records and (extra in records[0] or extra in example_fields):
      missing = [i for i, r in enumerate(records) if extra not in r]
      if missing:
        raise ValueError(
          f"reward field {extra!r} is missing from {len(missing)} record(s) (first: batch row "
          f"{missing[0]}, fields {sorted(records[missing[0]])}); see config.reward.example_fields"
        )
      fields[extra] = [r[extra] for r in records for _ in range(num_samples)]
  return fields


# Counts are summed over the generation rounds of a step; everything else is averaged.
_SUMMED = ("/failures", "/fail/", "worker_restarts")
# Order statistics of one runtime call: neither an average over generation rounds nor one over
# processes is the batch's value (the collector logs its own mean over the whole batch).
_PER_CALL = ("reward/std", "reward/min", "reward/max")


def merge_reward_metrics(reward_metrics: list[dict], *, exclude=()) -> dict:
  """The ``reward/...`` metrics of the runtime and the reward (per-component
  ``reward/<name>/mean`` and ``reward/<name>/failures``, ``reward/fail/<cause>``, times) over
  the generation rounds of one step: counts summed, the rest averaged over the rounds (all
  generated rows, so with ``zero_variance='refill'`` also the dropped groups). Keys in
  ``exclude`` (the collector's own ``reward/mean`` over the kept groups, ...) are left out.
  A reward's own metrics without the ``reward/`` prefix (a component's ``<name>/<key>``, the
  label-free collapse monitor) are logged under ``reward/``."""
  out = {}
  named = [
    {(k if k.startswith("reward/") else f"reward/{k}"): v for k, v in m.items()}
    for m in reward_metrics
  ]
  reward_metrics = named
  keys = {k for m in reward_metrics for k in m if k not in exclude and k not in _PER_CALL}
  for key in sorted(keys):
    vals = np.array([m[key] for m in reward_metrics if key in m], np.float64)
    if any(tag in key for tag in _SUMMED):
      out[key] = float(vals.sum())
    else:
      finite = vals[np.isfinite(vals)]
      out[key] = float(finite.mean()) if finite.size else float("nan")
  return out


def log_reward_failures(result, limit: int = 3) -> None:
  """One warning per batch with failed reward items: counts by cause and the first messages
  (the rows stay NaN and are excluded from advantages; the counts are also in the metrics)."""
  if not result.failures:
    return
  causes = collections.Counter(f.cause for f in result.failures)
  first = "; ".join(f"row {f.index}: {f.cause}: {f.message}" for f in result.failures[:limit])
  _log.warning(
    "%d of %d reward items failed (%s); %s",
    len(result.failures),
    result.rewards.shape[0],
    ", ".join(f"{k}={v}" for k, v in sorted(causes.items())),
    first,
  )
