"""Weighted combination of several rewards, each reported as its own metric.

    R = (prod_{g in gates} R_g) * sum_k w_k R_k

Covers the combination modes of METHODS.md §5.2: additive (weights 1 and w_f), convex (weights
1 - c and c), gate (a component listed in ``gates``, e.g. a 0/1 format reward multiplying the rest).
Every component is scored inside the same worker call (one timeout for the item), then each
component's own ``combine`` runs (so group-aware components keep working), then the weighted sum.
A NaN in any component (a failed item) makes the total NaN.
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
  Metrics: ``reward/<name>/mean`` per component; info: each component's info as ``<name>/<key>``,
  and ``correct`` from the first component that reports it.
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
    return {name: r.score_item(prompt, completion, **row) for name, r in self.rewards.items()}

  def combine(self, scores, **fields: Any) -> protocol.RewardOutput:
    num_rows = len(scores)
    total = np.zeros(num_rows, dtype=np.float64)
    gate = np.ones(num_rows, dtype=np.float64)
    info: dict[str, np.ndarray] = {}
    metrics: dict[str, float] = {}
    token_rewards = None
    for name, reward in self.rewards.items():
      sub = [None if s is None else s[name] for s in scores]
      out = reward.combine(sub, **fields)
      values = np.asarray(out.rewards, dtype=np.float64)
      finite = values[np.isfinite(values)]
      metrics[f"reward/{name}/mean"] = float(finite.mean()) if finite.size else float("nan")
      metrics.update({f"{name}/{k}": v for k, v in out.metrics.items()})
      for key, column in out.info.items():
        info[f"{name}/{key}"] = column
        if key == "correct" and "correct" not in info:
          info["correct"] = column
      if name in self.gates:
        gate = gate * values
      else:
        weight = 1.0 if self.weights is None else float(self.weights.get(name, 1.0))
        total = total + weight * values
        if out.token_rewards is not None:
          scaled = weight * np.asarray(out.token_rewards, dtype=np.float32)
          token_rewards = scaled if token_rewards is None else _add_ragged(token_rewards, scaled)
    rewards = (gate * total).astype(np.float32)
    return protocol.RewardOutput(rewards, info=info, token_rewards=token_rewards, metrics=metrics)


def _add_ragged(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  width = max(a.shape[1], b.shape[1])
  return protocol.pad_token_rewards(a, width) + protocol.pad_token_rewards(b, width)
