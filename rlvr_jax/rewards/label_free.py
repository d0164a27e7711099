"""Label-free group rewards: majority vote (TTRL) and cross-prompt agreement (Co-Reward).

Neither reads a reference answer. Each completion's final answer is extracted and put in a
canonical form (``answer_key``); then, in ``combine`` (caller side, group aware):

* TTRL (*Test-Time Reinforcement Learning*, arXiv 2504.16084): the pseudo-label of a prompt is
  the most frequent answer among its G samples; r = 1 if a sample's answer equals it, else 0.
* Co-Reward (*Self-supervised Reinforcement Learning for Large Language Model Reasoning via
  Contrastive Agreement*, arXiv 2508.00410): each question is trained together with a rephrasing
  of it; the pseudo-label of a group is the majority answer of the OTHER version's samples
  (cross-referenced), so a group cannot reward itself for agreeing with itself.

These rewards are known to rise and then collapse (the policy agrees with itself on a wrong
answer, or stops answering differently). Both report a collapse monitor in their metrics:

  agreement_rate     mean over groups of (votes for the pseudo-label) / G (TTRL's majority ratio)
  answer_diversity   mean over groups of (distinct answers) / (answered samples)
  no_answer_rate     fraction of samples without an extractable answer
  label_accuracy     fraction of groups whose pseudo-label equals the reference (only when the
                     batch has an ``answer`` field; it is used for monitoring, never for reward)
  reward_accuracy    fraction of samples whose pseudo-reward equals the true 0/1 outcome

Ties are broken by the answer that appears first in the group (deterministic). Samples without
an answer get reward 0 and do not vote. No jax here.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from rlvr_jax.rewards import protocol
from rlvr_jax.rewards.math_extract import as_text, extract_answer
from rlvr_jax.rewards.math_reward import normalize_answer, parse_number

DEFAULT_EXTRACT = ("answer_tag", "boxed", "last_number")


def answer_key(answer: Any) -> str | None:
  """Canonical form used to compare answers: an exact number ("n:3/4") when the answer parses as
  one (so "0.75", "3/4" and "\\frac{3}{4}" vote together), else the normalised text ("s:...")."""
  if answer is None:
    return None
  text = str(answer).strip()
  if not text:
    return None
  value = parse_number(re.sub(r"(?<=\d),(?=\d{3})", "", text).rstrip("."))
  if isinstance(value, Fraction):
    return f"n:{value}"
  normal = normalize_answer(text)
  return f"s:{normal}" if normal else None


def majority(keys: Sequence[str | None]) -> tuple[str | None, int]:
  """(most frequent non-None key, its count); ties go to the key seen first; (None, 0) if none."""
  counts = Counter(k for k in keys if k is not None)
  if not counts:
    return None, 0
  best = max(counts.values())
  for k in keys:
    if k is not None and counts[k] == best:
      return k, best
  raise AssertionError("unreachable")


def _keys_and_gold(scores, fields):
  keys = [None if s is None else s.get("key") for s in scores]
  gold = fields.get("answer")
  gold_keys = None if gold is None else [answer_key(g) for g in gold]
  return keys, gold_keys


def _group_metrics(keys, labels, votes, gold_keys, rewards, group_size) -> dict[str, float]:
  """The collapse monitor over groups (see module docstring)."""
  num_groups = len(keys) // group_size
  agreement, diversity, label_hits, label_n = [], [], 0, 0
  for p in range(num_groups):
    group = keys[p * group_size : (p + 1) * group_size]
    answered = [k for k in group if k is not None]
    agreement.append(votes[p] / group_size)
    if answered:
      diversity.append(len(set(answered)) / len(answered))
    if gold_keys is not None and gold_keys[p * group_size] is not None:
      label_n += 1
      label_hits += labels[p] is not None and labels[p] == gold_keys[p * group_size]
  metrics = {
    "agreement_rate": float(np.mean(agreement)) if agreement else float("nan"),
    "answer_diversity": float(np.mean(diversity)) if diversity else float("nan"),
    "no_answer_rate": float(np.mean([k is None for k in keys])) if keys else float("nan"),
  }
  if gold_keys is not None:
    metrics["label_accuracy"] = label_hits / label_n if label_n else float("nan")
    true = np.array([k is not None and k == g for k, g in zip(keys, gold_keys, strict=True)])
    finite = np.isfinite(rewards)
    if finite.any():
      metrics["reward_accuracy"] = float(np.mean((rewards[finite] > 0.5) == true[finite]))
  return metrics


def _info(scores, keys, gold_keys, labels_per_row, report_correct):
  info = {
    "pseudo_label": np.array(labels_per_row, dtype=object),
    "extracted_answer": np.array(keys, dtype=object),
  }
  if gold_keys is not None:
    info["true_correct"] = np.array(
      [
        np.nan if s is None else float(k is not None and k == g)
        for s, k, g in zip(scores, keys, gold_keys, strict=True)
      ],
      dtype=np.float32,
    )
    if report_correct:
      info["correct"] = info["true_correct"]
  return info


@dataclasses.dataclass(frozen=True)
class MajorityVoteReward(protocol.ItemReward):
  """TTRL majority-vote reward: 1 if the sample's answer is its group's most frequent answer.

  Args:
    extract: answer extraction modes (``math_extract``; ``last_number`` allowed), in order.
    correct_value / wrong_value: the reward for agreeing / not agreeing (or having no answer).
    report_correct: when the data has reference answers, also report the TRUE outcome as info
      ``correct`` (always as ``true_correct``). The trainer reads ``correct`` for held-out
      evaluation and the ``accuracy/mean`` metric, which is the point of a label-free run's
      monitor; it also reads it for ``rl.zero_variance='mask'``/``'refill'``, which would leak
      labels into training, so label-free runs use ``rl.zero_variance='keep'`` (the
      experiments do, and ``config.validate`` refuses the combination).
  Needs ``group_size`` (the trainer passes it). The reward itself never reads ``answer``.
  """

  extract: tuple[str, ...] = DEFAULT_EXTRACT
  correct_value: float = 1.0
  wrong_value: float = 0.0
  report_correct: bool = True
  name: str = "majority_vote"

  def score_item(self, prompt: str, completion: str, **_: Any) -> dict:
    return {"key": answer_key(extract_answer(as_text(completion), self.extract))}

  def combine(self, scores, **fields: Any) -> protocol.RewardOutput:
    num_rows = len(scores)
    group_size = protocol.require_group_size(fields, num_rows, "MajorityVoteReward")
    keys, gold_keys = _keys_and_gold(scores, fields)
    rewards = np.full(num_rows, np.nan, np.float32)
    labels, votes, per_row = [], [], [None] * num_rows
    for p in range(num_rows // group_size):
      rows = range(p * group_size, (p + 1) * group_size)
      label, count = majority([keys[b] for b in rows])
      labels.append(label)
      votes.append(count)
      for b in rows:
        per_row[b] = label
        if scores[b] is not None:
          hit = label is not None and keys[b] == label
          rewards[b] = self.correct_value if hit else self.wrong_value
    metrics = _group_metrics(keys, labels, votes, gold_keys, rewards, group_size)
    info = _info(scores, keys, gold_keys, per_row, self.report_correct)
    return protocol.RewardOutput(rewards=rewards, info=info, metrics=metrics)


@dataclasses.dataclass(frozen=True)
class CoReward(protocol.ItemReward):
  """Co-Reward: agreement with the majority answer of the paired rephrased question's samples.

  Groups that share a ``pair_key`` (a per-row example field; e.g. the id of the original
  question, identical for the question and its rephrasings) are versions of one question. The
  pseudo-label of group p is the majority answer pooled over the OTHER groups with p's key; a
  sample gets ``correct_value`` if its answer equals it. A group without a partner in the batch
  fails (NaN, reported in ``failures``) unless ``unpaired="self"``, which falls back to its own
  majority vote (TTRL).

  Metrics: the collapse monitor of the module docstring plus ``cross_agreement``, the fraction
  of paired groups whose own majority equals their partner's (the two versions agree).
  ``report_correct`` as in :class:`MajorityVoteReward`.
  """

  extract: tuple[str, ...] = DEFAULT_EXTRACT
  key_field: str = "pair_key"
  correct_value: float = 1.0
  wrong_value: float = 0.0
  unpaired: str = "fail"
  report_correct: bool = True
  name: str = "co_reward"

  def __post_init__(self):
    if self.unpaired not in ("fail", "self"):
      raise ValueError(f"CoReward.unpaired must be 'fail' or 'self', got {self.unpaired!r}")

  def score_item(self, prompt: str, completion: str, **_: Any) -> dict:
    return {"key": answer_key(extract_answer(as_text(completion), self.extract))}

  def combine(self, scores, **fields: Any) -> protocol.RewardOutput:
    num_rows = len(scores)
    group_size = protocol.require_group_size(fields, num_rows, "CoReward")
    pair = fields.get(self.key_field)
    if pair is None:
      raise ValueError(
        f"CoReward needs the per-row example field {self.key_field!r} (rows of a question and "
        "of its rephrasing share a value)"
      )
    keys, gold_keys = _keys_and_gold(scores, fields)
    num_groups = num_rows // group_size
    group_keys = [keys[p * group_size : (p + 1) * group_size] for p in range(num_groups)]
    own = [majority(g) for g in group_keys]
    by_pair: dict[Any, list[int]] = {}
    for p in range(num_groups):
      by_pair.setdefault(pair[p * group_size], []).append(p)
    rewards = np.full(num_rows, np.nan, np.float32)
    failures, labels, votes, per_row = {}, [], [], [None] * num_rows
    cross_hits, cross_n = 0, 0
    for p in range(num_groups):
      partners = [q for q in by_pair[pair[p * group_size]] if q != p]
      rows = range(p * group_size, (p + 1) * group_size)
      if partners:
        label, count = majority([k for q in partners for k in group_keys[q]])
        cross_n += 1
        cross_hits += own[p][0] is not None and own[p][0] == label
      elif self.unpaired == "self":
        label, count = own[p]
      else:
        for b in rows:
          if scores[b] is not None:
            failures[b] = ("invalid", f"no rephrased partner with {self.key_field}={pair[b]!r}")
        labels.append(None)
        votes.append(0)
        continue
      labels.append(label)
      votes.append(sum(k == label for k in group_keys[p]) if label is not None else 0)
      for b in rows:
        per_row[b] = label
        if scores[b] is not None:
          hit = label is not None and keys[b] == label
          rewards[b] = self.correct_value if hit else self.wrong_value
    metrics = _group_metrics(keys, labels, votes, gold_keys, rewards, group_size)
    metrics["cross_agreement"] = cross_hits / cross_n if cross_n else float("nan")
    info = _info(scores, keys, gold_keys, per_row, self.report_correct)
    return protocol.RewardOutput(rewards=rewards, info=info, metrics=metrics, failures=failures)
