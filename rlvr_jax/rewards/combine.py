"""Weighted combination of several rewards, each reported as its own metric.

    R = (prod_{g in gates} R_g) * sum_k w_k R_k

Covers the combination modes of METHODS.md §5.2: additive (weights 1 and w_f), convex (weights
1 - c and c), gate (a component listed in ``gates``, e.g. a 0/1 format reward multiplying the rest).
Every component is scored inside the same worker call (one timeout for the item), then each
component's own ``combine`` runs (so group-aware components keep working), then the weighted sum.
A NaN in any component (a failed item) makes the total NaN. A component that raises, returns a
non-dict score, a wrong-length or non-finite reward fails only the rows concerned: they are
reported in ``RewardOutput.failures`` (the runtime lists and counts them) and in the metric
``reward/<name>/failures``; the batch goes on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlvr_jax.rewards import protocol


@dataclasses.dataclass(frozen=True)
class CombinedReward(protocol.ItemReward):
  """Args:
  rewards: mapping name -> reward (an ItemReward or a plain per-item reward function).
  weights: mapping name -> weight for the summed components (default 1 each; gates excluded).
  gates: names of components that multiply the weighted sum instead of being added.
  Metrics: ``reward/<name>/mean`` (over its finite rows) and ``reward/<name>/failures`` (rows
  that component failed on while the item was scored) per component; info: each component's
  rewards as ``<name>/reward``, its info as ``<name>/<key>``, and ``correct`` from the first
  component that reports it.
  """

  rewards: Mapping[str, Any]
  weights: Mapping[str, float] | None = None
  gates: tuple[str, ...] = ()
  name: str = "combined"

  def __post_init__(self):
    if not self.rewards:
      raise ValueError("CombinedReward needs at least one component")
    items = {k: protocol.as_item_reward(v, name=k) for k, v in self.rewards.items()}
    object.__setattr__(self, "rewards", items)
    unknown = set(self.weights or {}) - set(items) | set(self.gates) - set(items)
    if unknown:
      raise ValueError(
        f"weights/gates name unknown components {sorted(unknown)}; have {list(items)}"
      )
    if set(self.gates) & set(self.weights or {}):
      raise ValueError("a component cannot be both weighted and a gate")

  def score_item(self, prompt: str, completion: str, **row: Any) -> dict:
    """Scores every component; a component that raises or returns something other than a dict
    fails on its own (its marker goes to ``combine``) and the others are still scored. Timeouts
    and MemoryError are not caught: they fail the whole item."""
    out = {}
    for name, reward in self.rewards.items():
      try:
        score = reward.score_item(prompt, completion, **row)
      except (protocol.ItemTimeout, MemoryError):
        raise
      except Exception as e:  # noqa: BLE001  (reward code: recorded as this component's failure)
        out[name] = {_ERROR: ("exception", _describe(e))}
        continue
      if not isinstance(score, dict):
        out[name] = {_ERROR: ("invalid", f"score_item returned {type(score).__name__}, not dict")}
      else:
        out[name] = score
    return out

  def combine(self, scores, **fields: Any) -> protocol.RewardOutput:
    num_rows = len(scores)
    total = np.zeros(num_rows, dtype=np.float64)
    gate = np.ones(num_rows, dtype=np.float64)
    info: dict[str, np.ndarray] = {}
    metrics: dict[str, float] = {}
    failures: dict[int, tuple[str, str]] = {}
    token_rewards = None
    for name, reward in self.rewards.items():
      values, out, failed = _component(name, reward, scores, fields)
      for row, (cause, message) in failed.items():
        failures.setdefault(row, (cause, f"reward component {name!r}: {message}"))
      finite = values[np.isfinite(values)]
      metrics[f"reward/{name}/mean"] = float(finite.mean()) if finite.size else float("nan")
      metrics[f"reward/{name}/failures"] = float(len(failed))
      info[f"{name}/reward"] = values.astype(np.float32)
      if out is None:
        continue
      metrics.update({f"{name}/{k}": v for k, v in out.metrics.items()})
      for key, column in out.info.items():
        info[f"{name}/{key}"] = column
        if key == "correct" and "correct" not in info:
          info["correct"] = column
      if name not in self.gates and out.token_rewards is not None:
        scaled = self._weight(name) * np.asarray(out.token_rewards, dtype=np.float32)
        token_rewards = scaled if token_rewards is None else _add_ragged(token_rewards, scaled)
    for name in self.rewards:
      values = info[f"{name}/reward"].astype(np.float64)
      if name in self.gates:
        gate = gate * values
      else:
        total = total + self._weight(name) * values
    rewards = (gate * total).astype(np.float32)
    return protocol.RewardOutput(
      rewards, info=info, token_rewards=token_rewards, metrics=metrics, failures=failures
    )

  def _weight(self, name: str) -> float:
    return 1.0 if self.weights is None else float(self.weights.get(name, 1.0))


_ERROR = "__component_error__"


def _describe(exc: BaseException) -> str:
  try:
    return f"{type(exc).__name__}: {exc}"[:1000]
  except Exception:  # noqa: BLE001  (str() of exotic objects can itself fail)
    return type(exc).__name__


def _component(name, reward, scores, fields):
  """One component's ([B] float64 rewards, its RewardOutput or None, {row: (cause, message)}).

  Rows fail (NaN) where the component's ``score_item`` failed, where its ``combine`` raised or
  returned the wrong shape (every row of the batch), or where it returned NaN / inf for an item
  that was scored. Items that failed as a whole (``None``: timeout, crash) are not counted here:
  the runtime records them."""
  num_rows = len(scores)
  failed: dict[int, tuple[str, str]] = {}
  sub = []
  for row, s in enumerate(scores):
    score = None if s is None else s.get(name)
    if isinstance(score, dict) and _ERROR in score:
      failed[row] = tuple(score[_ERROR])
      score = None
    sub.append(score)
  scored = [row for row, s in enumerate(scores) if s is not None]
  try:
    out = reward.combine(sub, **fields)
    values = np.asarray(out.rewards, dtype=np.float64)
    if values.shape != (num_rows,):
      raise ValueError(f"combine returned rewards of shape {values.shape}, expected ({num_rows},)")
  except Exception as e:  # noqa: BLE001  (a broken component fails its rows, not the run)
    message = f"combine raised {_describe(e)}"
    failed.update({row: ("exception", message) for row in scored if row not in failed})
    return np.full(num_rows, np.nan), None, failed
  for row in scored:
    if row not in failed and not np.isfinite(values[row]):
      failed[row] = ("invalid", f"returned {values[row]} (rewards must be finite numbers)")
  values = values.copy()
  values[list(failed)] = np.nan
  return values, out, failed


def _add_ragged(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  width = max(a.shape[1], b.shape[1])
  return protocol.pad_token_rewards(a, width) + protocol.pad_token_rewards(b, width)
