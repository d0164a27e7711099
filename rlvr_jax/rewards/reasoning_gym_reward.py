"""reasoning-gym's own verifiers as a reward (the records of ``data.source="reasoning_gym"``).

Per-row field ``reasoning_gym``: ``{"task": name, "config": task config kwargs, "entry": the
dataset entry}`` (what ``rlvr_jax.data.reasoning_gym_source`` puts in every record). The worker
rebuilds the task's dataset from (task, config) once per process and returns

  reward  = score_answer(extract(completion), entry)   in [0, 1] (some tasks give partial credit)
  correct = 1[reward == 1]

``extract`` is reasoning-gym's convention, the last ``<answer>...</answer>`` tag (None, scored 0,
when there is none), or, with ``answer_format="raw"``, the whole completion stripped.

Imports no jax; reasoning_gym itself is imported lazily, in the worker.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from rlvr_jax.rewards import protocol
from rlvr_jax.rewards.math_reward import _as_text

_TAG_RE = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)
_DATASETS: dict[str, Any] = {}  # per worker process: (task, config) -> dataset


def extract(completion: str, answer_format: str) -> str | None:
  """The answer to score: the last ``<answer>`` tag's content, or the whole completion."""
  if answer_format == "raw":
    return completion.strip()
  matches = _TAG_RE.findall(completion)
  return matches[-1].strip() if matches else None


def _dataset(task: str, config: dict):
  key = json.dumps([task, config], sort_keys=True, default=repr)
  if key not in _DATASETS:
    from reasoning_gym.factory import DATASETS

    if task not in DATASETS:
      raise ValueError(f"reasoning_gym field names task {task!r}, which reasoning-gym lacks")
    dataset_cls, config_cls = DATASETS[task]
    _DATASETS[key] = dataset_cls(config=config_cls(**config, seed=0, size=1))
  return _DATASETS[key]


@dataclasses.dataclass(frozen=True)
class ReasoningGymReward(protocol.ItemReward):
  """reasoning-gym's ``score_answer`` per row (module docstring).

  Attributes:
    answer_format: "answer_tag" or "raw" (as ``data.reasoning_gym.answer_format``).
  """

  answer_format: str = "answer_tag"
  name: str = "reasoning_gym"

  def __post_init__(self):
    if self.answer_format not in ("answer_tag", "raw"):
      raise ValueError(f"answer_format must be 'answer_tag' or 'raw', got {self.answer_format!r}")

  def score_item(self, prompt: str, completion: str, *, reasoning_gym=None, **_: Any) -> dict:
    if reasoning_gym is None:
      raise ValueError(
        "ReasoningGymReward needs the example field reasoning_gym= ({'task', 'config', 'entry'} "
        "per row, as rlvr_jax.data.reasoning_gym_source builds it)"
      )
    dataset = _dataset(reasoning_gym["task"], dict(reasoning_gym.get("config") or {}))
    answer = extract(_as_text(completion), self.answer_format)
    score = float(dataset.score_answer(answer, reasoning_gym["entry"]))
    return {"reward": score, "correct": float(score >= 1.0), "has_answer": float(bool(answer))}
