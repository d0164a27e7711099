"""Length-aware shaping, counted in tokens (METHODS.md §5.3-5.5).

Array functions (numpy, [B] in, [B] out) plus :class:`ItemReward` wrappers that take their
correctness from an inner reward (default :class:`MathReward`) and the token counts from the
reserved field ``completion_lengths``, and :class:`RepetitionReward`, a stand-alone sequence-level
repetition penalty.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlvr_jax.rewards import protocol
from rlvr_jax.rewards.math_reward import MathReward


def overlong_penalty(
  lengths: np.ndarray, *, max_len: int = 20480, buffer_len: int = 4096, penalty_factor: float = 1.0
) -> np.ndarray:
  """DAPO soft overlong punishment (arXiv 2503.14476), n in tokens:

    R_len(n) = min(0, -(n - (L_max - L_buf)) / L_buf * kappa)

  0 up to L_max - L_buf, linear down to -kappa at L_max (and below beyond it).
  Args: lengths [B] token counts; max_len L_max; buffer_len L_buf; penalty_factor kappa.
  Returns: [B] float32.
  """
  if buffer_len <= 0 or buffer_len > max_len:
    raise ValueError(f"need 0 < buffer_len <= max_len, got buffer_len={buffer_len}, {max_len=}")
  n = np.asarray(lengths, dtype=np.float64)
  expected = max_len - buffer_len
  return np.minimum(0.0, -(n - expected) / buffer_len * penalty_factor).astype(np.float32)


def cosine_length_reward(
  correct: np.ndarray,
  lengths: np.ndarray,
  *,
  max_len: int = 14336,
  correct_short: float = 2.0,
  correct_long: float = 1.0,
  wrong_short: float = -10.0,
  wrong_long: float = 0.0,
  exceed_value: float = -10.0,
  exceed_margin: int = 16,
) -> np.ndarray:
  """Cosine length-scaled reward (Demystifying Long CoT, arXiv 2502.03373).

    x = n / L_max,  C(x) = (1 + cos(pi x)) / 2
    R = r^L + (r^0 - r^L) C(x)  with (r^0, r^L) = (r_c^0, r_c^L) if correct else (r_w^0, r_w^L)
    R = exceed_value  if n + exceed_margin >= L_max

  Args: correct [B] in {0, 1} (NaN passes through); lengths [B] tokens. Returns [B] float32.
  """
  correct = np.asarray(correct, dtype=np.float64)
  n = np.asarray(lengths, dtype=np.float64)
  if correct.shape != n.shape:
    raise ValueError(f"correct {correct.shape} and lengths {n.shape} must have the same shape")
  cos = 0.5 * (1.0 + np.cos(np.pi * np.clip(n / max_len, 0.0, 1.0)))
  good = correct_long + (correct_short - correct_long) * cos
  bad = wrong_long + (wrong_short - wrong_long) * cos
  out = np.where(correct > 0.5, good, bad)
  out = np.where(n + exceed_margin >= max_len, exceed_value, out)
  return np.where(np.isnan(correct), np.nan, out).astype(np.float32)


def repeated_ngram_token_penalty(
  token_ids: Sequence[int], *, ngram: int = 40, penalty: float = -0.05
) -> np.ndarray:
  """Dense repetition penalty (arXiv 2502.03373): ``penalty`` on every token that lies inside an
  n-gram of token ids already seen earlier in the sequence. Returns [T] float32."""
  ids = list(token_ids)
  out = np.zeros(len(ids), dtype=np.float32)
  seen: set[tuple[int, ...]] = set()
  for start in range(len(ids) - ngram + 1):
    gram = tuple(ids[start : start + ngram])
    if gram in seen:
      out[start : start + ngram] = penalty
    seen.add(gram)
  return out


def word_ngram_repetition(text: str, *, ngram: int = 3) -> float:
  """1 - #unique / #total over the word n-grams of the lower-cased text (0 if there are none)."""
  words = text.lower().split()
  grams = [tuple(words[i : i + ngram]) for i in range(len(words) - ngram + 1)]
  return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def laser_reward(
  correct: np.ndarray,
  has_answer: np.ndarray,
  lengths: np.ndarray,
  target_length: np.ndarray | float,
  *,
  alpha: float = 0.5,
  mode: str = "reward",
) -> np.ndarray:
  """LASER (arXiv 2505.15612): base +1 correct / -0.5 wrong but boxed / -1 nothing boxed, plus

    reward:  +alpha * 1[correct and n <= L_T]
    penalty: -alpha * 1[correct and n > L_T]
    hybrid:  both.

  Args: correct, has_answer [B] in {0, 1}; lengths [B] tokens; target_length L_T, scalar or [B].
  Returns [B] float32 (NaN where ``correct`` is NaN).
  """
  if mode not in ("reward", "penalty", "hybrid"):
    raise ValueError(f"mode must be 'reward', 'penalty' or 'hybrid', got {mode!r}")
  correct = np.asarray(correct, dtype=np.float64)
  ok = correct > 0.5
  short = np.asarray(lengths, dtype=np.float64) <= np.asarray(target_length, dtype=np.float64)
  base = np.where(ok, 1.0, np.where(np.asarray(has_answer, dtype=np.float64) > 0.5, -0.5, -1.0))
  bonus = np.zeros_like(base)
  if mode in ("reward", "hybrid"):
    bonus += alpha * (ok & short)
  if mode in ("penalty", "hybrid"):
    bonus -= alpha * (ok & ~short)
  return np.where(np.isnan(correct), np.nan, base + bonus).astype(np.float32)


BUCKETS = ("easy", "medium", "hard")


def laser_d_buckets(correct: np.ndarray, *, group_size: int) -> np.ndarray:
  """[B] int bucket per row (0 easy: a >= 2/3, 1 medium: 1/3 <= a < 2/3, 2 hard) from the group
  accuracy a over the group's non-NaN rows (a group with no valid row counts as hard)."""
  correct = np.asarray(correct, dtype=np.float64).reshape(-1, group_size)
  valid = ~np.isnan(correct)
  count = valid.sum(-1)
  acc = np.where(count > 0, np.where(valid, correct, 0).sum(-1) / np.maximum(count, 1), 0.0)
  bucket = np.where(acc >= 2 / 3, 0, np.where(acc >= 1 / 3, 1, 2))
  return np.repeat(bucket, group_size)


def laser_d_choose_targets(
  correct: np.ndarray,
  lengths: np.ndarray,
  *,
  group_size: int,
  candidates: Sequence[int] = tuple(range(4096, 16385, 1024)),
  max_len: int = 16384,
) -> tuple[int, int, int]:
  """LASER-D target lengths (easy, medium, hard) from a monitor batch.

  For bucket b: c_b(l) = fraction of the bucket's responses that are correct with length <= l;
  n_b = floor(2G/3), floor(G/3), 1; L_T = min{l in candidates : floor(c_b(l) * n_b) >= 1}, else
  ``max_len``. Call it periodically (e.g. every few steps) and pass the result to
  :class:`LaserReward` as ``bucket_targets``; keep it in the trainer state for exact resume.
  """
  correct = np.asarray(correct, dtype=np.float64)
  lengths = np.asarray(lengths, dtype=np.float64)
  buckets = laser_d_buckets(correct, group_size=group_size)
  need = (2 * group_size // 3, group_size // 3, 1)
  targets = []
  for b in range(3):
    rows = (buckets == b) & ~np.isnan(correct)
    target = max_len
    if rows.any():
      for ell in candidates:
        frac = np.mean((correct[rows] > 0.5) & (lengths[rows] <= ell))
        if np.floor(frac * need[b] + 1e-9) >= 1:
          target = int(ell)
          break
    targets.append(target)
  return tuple(targets)


@dataclasses.dataclass(frozen=True)
class OverlongReward(protocol.ItemReward):
  """DAPO overlong shaping as its own reward term (add it to the answer reward with
  :class:`CombinedReward`). Needs ``completion_lengths`` (tokens)."""

  max_len: int = 20480
  buffer_len: int = 4096
  penalty_factor: float = 1.0
  name: str = "overlong"

  def score_item(self, prompt: str, completion: str, **_: Any) -> dict:
    return {}

  def combine(self, scores, **fields: Any) -> protocol.RewardOutput:
    lengths = protocol.token_lengths(fields, len(scores), "OverlongReward")
    rewards = overlong_penalty(
      lengths,
      max_len=self.max_len,
      buffer_len=self.buffer_len,
      penalty_factor=self.penalty_factor,
    )
    failed = np.array([s is None for s in scores])
    return protocol.RewardOutput(rewards=np.where(failed, np.nan, rewards).astype(np.float32))


@dataclasses.dataclass(frozen=True)
class CosineReward(protocol.ItemReward):
  """Cosine length-scaled correctness reward, with two optional repetition penalties:
  dense (per-token rewards, -0.05 on tokens inside a repeated ``repetition_ngram``-gram of token
  ids; needs the per-row field ``completion_token_ids``) and sequence-level
  (``sequence_repetition_penalty`` P <= 0 times the repeated fraction of word n-grams, wrong
  answers only)."""

  correctness: protocol.ItemReward = dataclasses.field(default_factory=MathReward)
  max_len: int = 14336
  correct_short: float = 2.0
  correct_long: float = 1.0
  wrong_short: float = -10.0
  wrong_long: float = 0.0
  exceed_value: float = -10.0
  exceed_margin: int = 16
  repetition_ngram: int = 0
  repetition_penalty: float = -0.05
  sequence_repetition_penalty: float = 0.0
  sequence_repetition_ngram: int = 3
  name: str = "cosine"

  def __post_init__(self):
    if self.sequence_repetition_penalty > 0 or self.repetition_penalty > 0:
      raise ValueError("repetition penalties must be <= 0")

  def score_item(self, prompt: str, completion: str, **row: Any) -> dict:
    score = dict(self.correctness.score_item(prompt, completion, **row))
    if self.sequence_repetition_penalty:
      text = completion.decode("utf-8", "replace") if isinstance(completion, bytes) else completion
      score["repetition"] = word_ngram_repetition(text, ngram=self.sequence_repetition_ngram)
    return score

  def combine(self, scores, **fields: Any) -> protocol.RewardOutput:
    lengths = protocol.token_lengths(fields, len(scores), "CosineReward")
    correct = protocol.scores_column(scores, "correct")
    rewards = cosine_length_reward(
      correct,
      lengths,
      max_len=self.max_len,
      correct_short=self.correct_short,
      correct_long=self.correct_long,
      wrong_short=self.wrong_short,
      wrong_long=self.wrong_long,
      exceed_value=self.exceed_value,
      exceed_margin=self.exceed_margin,
    )
    if self.sequence_repetition_penalty:
      # Sequence version: R += P * (1 - #unique / #total word n-grams), wrong answers only.
      repetition = protocol.scores_column(scores, "repetition", default=0.0)
      wrong = correct < 0.5
      rewards = np.where(wrong, rewards + self.sequence_repetition_penalty * repetition, rewards)
      rewards = rewards.astype(np.float32)
    token_rewards = None
    token_ids = fields.get("completion_token_ids")
    if self.repetition_ngram > 0 and token_ids is not None:
      token_rewards = np.zeros((len(scores), max(int(lengths.max(initial=0)), 1)), np.float32)
      for b, ids in enumerate(token_ids):
        ids = list(ids)[: lengths[b]]
        token_rewards[b, : len(ids)] = repeated_ngram_token_penalty(
          ids, ngram=self.repetition_ngram, penalty=self.repetition_penalty
        )
    return protocol.RewardOutput(rewards, info={"correct": correct}, token_rewards=token_rewards)


@dataclasses.dataclass(frozen=True)
class LaserReward(protocol.ItemReward):
  """LASER with a fixed ``target_length``, or LASER-D when ``bucket_targets`` = (easy, medium,
  hard) target lengths is given (then ``group_size`` is needed). Correctness and "boxed" come
  from ``correctness`` (default: boxed-only math extraction)."""

  correctness: protocol.ItemReward = dataclasses.field(
    default_factory=lambda: MathReward(extract=("boxed",))
  )
  target_length: int = 4096
  bucket_targets: tuple[int, int, int] | None = None
  alpha: float = 0.5
  mode: str = "reward"
  name: str = "laser"

  def score_item(self, prompt: str, completion: str, **row: Any) -> dict:
    return self.correctness.score_item(prompt, completion, **row)

  def combine(self, scores, **fields: Any) -> protocol.RewardOutput:
    num_rows = len(scores)
    lengths = protocol.token_lengths(fields, num_rows, "LaserReward")
    correct = protocol.scores_column(scores, "correct")
    has_answer = protocol.scores_column(scores, "has_answer")
    metrics = {}
    target = np.full(num_rows, float(self.target_length))
    if self.bucket_targets is not None:
      group_size = protocol.require_group_size(fields, num_rows, "LaserReward (LASER-D)")
      buckets = laser_d_buckets(correct, group_size=group_size)
      target = np.asarray(self.bucket_targets, dtype=np.float64)[buckets]
      for b, name in enumerate(BUCKETS):
        metrics[f"laser/bucket_frac/{name}"] = float(np.mean(buckets == b))
    rewards = laser_reward(correct, has_answer, lengths, target, alpha=self.alpha, mode=self.mode)
    return protocol.RewardOutput(rewards, info={"correct": correct}, metrics=metrics)


@dataclasses.dataclass(frozen=True)
class RepetitionReward(protocol.ItemReward):
  """Sequence-level repetition penalty as its own reward term (add it to an answer reward with
  :class:`CombinedReward`):

    R = penalty * (1 - #unique / #total word n-grams of the completion)

  0 for a completion without repeated n-grams, ``penalty`` (<= 0) in the limit of one n-gram
  repeated throughout. Unlike :class:`CosineReward`'s variant it applies to every answer."""

  ngram: int = 3
  penalty: float = -1.0
  name: str = "repetition"

  def __post_init__(self):
    if self.penalty > 0 or self.ngram < 1:
      raise ValueError(f"need penalty <= 0 and ngram >= 1, got {self.penalty=}, {self.ngram=}")

  def score_item(self, prompt: str, completion: str, **_: Any) -> dict:
    text = completion.decode("utf-8", "replace") if isinstance(completion, bytes) else completion
    fraction = word_ngram_repetition(str(text), ngram=self.ngram)
    return {"reward": self.penalty * fraction, "repetition": fraction}
