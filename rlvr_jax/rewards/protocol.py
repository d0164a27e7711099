"""The reward protocol: plain Python over a group-ordered batch.

A reward function is any picklable callable

    reward_fn(prompts: list[str], completions: list[str], **example_fields) -> np.ndarray  # [B] f32

over B = P * G rows in group order (row ``b`` is sample ``b % G`` of prompt ``b // G``). Example
fields are per-row sequences of length B (``answer=[...]``, ``tests=[...]``), plus two reserved
keywords that the trainer always passes:

  completion_lengths: [B] int, completion lengths in *tokens* from the sampler (never characters).
  group_size: int, G.

Rewards whose expensive part is per item (math checking, code execution) subclass
:class:`ItemReward`: ``score_item`` runs once per row, inside a worker process of the runtime with a
per-item timeout, and ``combine`` runs once per batch in the caller's process and does the cheap,
group-aware shaping (length penalties, LASER-D buckets, VeRPO test weights). Failed items reach
``combine`` as ``None`` and must come out as NaN, so group statistics exclude them.

No jax is imported anywhere in ``rlvr_jax.rewards``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

RESERVED_FIELDS = ("completion_lengths", "group_size")


class ItemTimeout(BaseException):  # noqa: N818
  """Raised by reward code whose own (in-worker) timeout fired; recorded with cause "timeout".

  A BaseException so that libraries' blanket ``except Exception`` (math-verify has them) cannot
  turn a timeout into a silent "wrong answer".
  """


class RewardFn(Protocol):
  """Structural type of a reward function (see module docstring)."""

  def __call__(self, prompts: list[str], completions: list[str], **example_fields: Any) -> Any: ...


@dataclasses.dataclass
class RewardOutput:
  """What ``ItemReward.combine`` returns.

  Attributes:
    rewards: [B] float32 scalar rewards; NaN for failed items.
    info: per-row arrays, e.g. ``correct`` [B] float32 in {0, 1, NaN} (the outcome, always reported
      separately from the shaped reward so pass-rate filters use it), ``format_ok``.
    token_rewards: optional [B, T] float32 per-token rewards, T = max completion length, zero
      after each row's length (use :func:`pad_token_rewards` to reach the trainer's T).
    metrics: scalar metrics with slash-separated names.
    failures: rows that ``combine`` itself found failed (a component that raised or returned a
      wrong type, length or NaN), as row -> (cause, message); the runtime lists and counts them
      like worker failures.
  """

  rewards: np.ndarray
  info: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
  token_rewards: np.ndarray | None = None
  metrics: dict[str, float] = dataclasses.field(default_factory=dict)
  failures: dict[int, tuple[str, str]] = dataclasses.field(default_factory=dict)


def check_batch(
  prompts: Sequence[str], completions: Sequence[str], fields: dict[str, Any]
) -> tuple[int, int | None]:
  """Validates a batch; returns (B, group_size or None). Raises ValueError naming the problem."""
  num_rows = len(completions)
  if len(prompts) != num_rows:
    raise ValueError(f"len(prompts)={len(prompts)} != len(completions)={num_rows}")
  group_size = fields.get("group_size")
  if group_size is not None:
    if int(group_size) < 1 or num_rows % int(group_size):
      raise ValueError(f"batch of {num_rows} rows is not a whole number of groups of {group_size}")
    group_size = int(group_size)
  for name, value in fields.items():
    if name == "group_size":
      continue
    if isinstance(value, str | bytes) or not hasattr(value, "__len__"):
      raise ValueError(f"example field {name!r} must be a per-row sequence, got {type(value)}")
    if len(value) != num_rows:
      raise ValueError(f"example field {name!r} has {len(value)} rows, expected B={num_rows}")
  return num_rows, group_size


def row_fields(fields: dict[str, Any], row: int) -> dict[str, Any]:
  """The per-row values of the example fields (``group_size`` dropped)."""
  return {k: v[row] for k, v in fields.items() if k != "group_size"}


def token_lengths(fields: dict[str, Any], num_rows: int, who: str) -> np.ndarray:
  """[B] int64 completion lengths in tokens; a clear error when the caller did not pass them."""
  lengths = fields.get("completion_lengths")
  if lengths is None:
    raise ValueError(
      f"{who} needs completion_lengths= (token counts from the sampler, [B]); character counts "
      "are not a substitute"
    )
  lengths = np.asarray(lengths, dtype=np.int64)
  if lengths.shape != (num_rows,):
    raise ValueError(f"completion_lengths has shape {lengths.shape}, expected ({num_rows},)")
  return lengths


def require_group_size(fields: dict[str, Any], num_rows: int, who: str) -> int:
  group_size = fields.get("group_size")
  if group_size is None:
    raise ValueError(f"{who} is group-aware and needs group_size= (G)")
  check_batch([""] * num_rows, [""] * num_rows, {"group_size": group_size})
  return int(group_size)


def scores_column(scores: Sequence[dict | None], key: str, default: float = np.nan) -> np.ndarray:
  """[B] float32 column ``key`` of per-item score dicts; NaN where the item failed (None) or the
  value is not a number (the runtime then counts the row as an "invalid" failure)."""
  out = np.full(len(scores), np.nan, dtype=np.float32)
  for i, s in enumerate(scores):
    if s is not None:
      value = s.get(key, default)
      try:
        out[i] = np.nan if value is None else float(value)
      except (TypeError, ValueError, OverflowError):
        out[i] = np.nan
  return out


class ItemReward:
  """Base class for rewards scored item by item, then combined over the batch.

  Subclasses implement ``score_item`` (worker side; returns a small dict of plain Python values and
  must contain ``"reward"`` unless ``combine`` is overridden) and optionally ``combine``
  (caller side; group-aware shaping). Instances must be picklable (plain dataclasses are).
  """

  name: str = "reward"

  def score_item(self, prompt: str, completion: str, **row: Any) -> dict[str, Any]:
    raise NotImplementedError

  def combine(self, scores: Sequence[dict | None], **fields: Any) -> RewardOutput:
    """Rewards from ``"reward"``; every other numeric key of the items (``correct``,
    ``has_answer``, ``formatted``, ...) becomes an ``info`` column (NaN on failed items)."""
    keys: dict[str, None] = {}
    for s in scores:
      for k, v in (s or {}).items():
        if k != "reward" and isinstance(v, (bool, int, float)):
          keys.setdefault(k)
    info = {k: scores_column(scores, k) for k in keys}
    return RewardOutput(rewards=scores_column(scores, "reward"), info=info)

  def evaluate(self, prompts: Sequence[str], completions: Sequence[str], **fields: Any):
    """In-process evaluation, without process isolation: returns a :class:`RewardOutput`.

    Only the reward's own timeouts apply (an item whose ``ItemTimeout`` fires gets NaN); exceptions
    propagate. Use :class:`~rlvr_jax.rewards.runtime.RewardRuntime` for untrusted inputs.
    """
    num_rows, _ = check_batch(prompts, completions, fields)
    scores = []
    for b in range(num_rows):
      try:
        scores.append(self.score_item(prompts[b], completions[b], **row_fields(fields, b)))
      except ItemTimeout:
        scores.append(None)
    return self.combine(scores, **fields)

  def __call__(self, prompts: Sequence[str], completions: Sequence[str], **fields: Any):
    return self.evaluate(prompts, completions, **fields).rewards


@dataclasses.dataclass(frozen=True)
class FunctionReward(ItemReward):
  """Adapts a plain per-item ``reward_fn(prompts, completions, **fields)`` to :class:`ItemReward`.

  ``score_item`` calls it on a one-row batch (per-row fields sliced, ``group_size`` not passed).
  """

  fn: Callable[..., Any]
  name: str = "fn"

  def score_item(self, prompt: str, completion: str, **row: Any) -> dict[str, Any]:
    value = np.asarray(self.fn([prompt], [completion], **{k: [v] for k, v in row.items()}))
    if value.size != 1:
      raise ValueError(f"reward function returned {value.size} values for a one-row batch")
    return {"reward": float(value.reshape(()))}


def as_item_reward(reward_fn: Any, name: str | None = None) -> ItemReward:
  if isinstance(reward_fn, ItemReward):
    return reward_fn
  if not callable(reward_fn):
    raise TypeError(f"reward_fn must be callable, got {type(reward_fn)}")
  return FunctionReward(reward_fn, name=name or getattr(reward_fn, "__name__", "fn"))


def pad_token_rewards(token_rewards: np.ndarray, num_tokens: int) -> np.ndarray:
  """Pads or checks [B, T'] per-token rewards to [B, num_tokens] float32 (zeros appended)."""
  token_rewards = np.asarray(token_rewards, dtype=np.float32)
  if token_rewards.ndim != 2:
    raise ValueError(f"token_rewards must be [B, T], got shape {token_rewards.shape}")
  extra = num_tokens - token_rewards.shape[1]
  if extra < 0:
    if np.any(token_rewards[:, num_tokens:] != 0):
      raise ValueError(f"token_rewards {token_rewards.shape} has non-zeros beyond T={num_tokens}")
    return token_rewards[:, :num_tokens]
  return np.pad(token_rewards, ((0, 0), (0, extra)))
