"""Host-side record of a multi-turn episode and the arrays the trainer needs (AGENTS.md §1).

The stream after the prompt is a_1, o_1, a_2, o_2, ..., a_K: action tokens (sampled by the policy,
trained) and observation tokens (rendered by ``render``, context only). ``o_K`` is absent when the
episode ends on its action. :func:`collate` gives, for B episodes (group ordered):

  * ``tokens`` [B, T] int32: the stream after the prompt, right-padded with ``pad_id``;
  * ``policy_mask`` [B, T] bool: True on action tokens only. This is the ``completion_mask`` of the
    loss: observation tokens are never trained and never counted in the normalisers;
  * ``token_mask`` [B, T] bool: True on every real token (actions and observations), for
    attention and positions;
  * ``turn_index`` [B, T] int32: k (1-based) on the action tokens of turn k, 0 elsewhere;
  * ``sampler_logp`` [B, T] float32: the sampler's log-probs on action tokens, 0 elsewhere;
  * ``turn_rewards`` [B, K] float32: the reward of each turn's env step, NaN where missing
    (turn not reached, its action cut by the context limit, or the episode failed);
  * ``num_turns``, ``terminated``, ``truncated``, ``failed`` [B].

Truncation: an action that does not fit in ``max_tokens`` (prompt excluded) is cut, and the episode
ends truncated without stepping the env on the partial action; an observation that does not leave
room for one more action token ends the episode truncated (``truncation`` says "context"); so does
reaching ``max_turns`` ("turns"). The return then uses what the episode received.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from rlvr_jax.envs.protocol import EnvFailure, StepResult


@dataclasses.dataclass
class Turn:
  action_ids: list[int]
  action_logp: list[float] | None = None
  observation_ids: list[int] = dataclasses.field(default_factory=list)
  reward: float = math.nan
  info: dict = dataclasses.field(default_factory=dict)


class Episode:
  """A growing episode: ``add_action`` then ``add_step`` per turn, until ``done``.

  Args:
    prompt_ids: the first prompt's ids (the rendered reset observation).
    max_tokens: limit of the stream after the prompt (actions + observations).
    max_turns: most turns (None: no limit).
  """

  def __init__(self, prompt_ids: Sequence[int], *, max_tokens: int, max_turns: int | None = None):
    if max_tokens < 1:
      raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    self.prompt_ids = list(prompt_ids)
    self.max_tokens, self.max_turns = int(max_tokens), max_turns
    self.turns: list[Turn] = []
    self.terminated = self.truncated = False
    self.truncation: str | None = None  # "context" | "turns" | "env"
    self.failure: EnvFailure | None = None
    self._length = 0
    self._awaiting_step = False

  @property
  def done(self) -> bool:
    return self.terminated or self.truncated or self.failure is not None

  @property
  def length(self) -> int:
    """Tokens after the prompt so far."""
    return self._length

  @property
  def remaining_tokens(self) -> int:
    """Room left for the next action (the sampler's max new tokens for this row)."""
    return self.max_tokens - self._length

  def _check_open(self, what: str) -> None:
    if self.done:
      raise ValueError(f"{what} on an episode that is done")

  def add_action(
    self, action_ids: Sequence[int], action_logp: Sequence[float] | None = None
  ) -> bool:
    """Starts turn k with the policy's action. Returns whether the env should be stepped: False
    when the action was cut by the context limit (the episode is then truncated)."""
    self._check_open("add_action")
    if self._awaiting_step:
      raise ValueError("add_action before add_step of the previous turn")
    ids = list(action_ids)
    logp = None if action_logp is None else list(action_logp)
    if logp is not None and len(logp) != len(ids):
      raise ValueError(f"action_logp has {len(logp)} entries for {len(ids)} action tokens")
    cut = len(ids) > self.remaining_tokens
    if cut:
      ids = ids[: self.remaining_tokens]
      logp = None if logp is None else logp[: len(ids)]
    self.turns.append(Turn(ids, logp))
    self._length += len(ids)
    self._awaiting_step = not cut
    if cut:
      self.truncated, self.truncation = True, "context"
    return not cut

  def add_step(self, result: StepResult, observation_ids: Sequence[int] = ()) -> None:
    """Records the env step of the current turn and appends its rendered observation (dropped
    when the step ends the episode)."""
    self._check_open("add_step")
    if not self._awaiting_step:
      raise ValueError("add_step before add_action")
    self._awaiting_step = False
    turn = self.turns[-1]
    if result.failed:
      self.failure = result.failure
      return
    turn.reward, turn.info = float(result.reward), dict(result.info)
    self.terminated, self.truncated = bool(result.terminated), bool(result.truncated)
    if self.truncated:
      self.truncation = "env"
    if self.done:
      return
    if self.max_turns is not None and len(self.turns) >= self.max_turns:
      self.truncated, self.truncation = True, "turns"
      return
    obs = list(observation_ids)
    if self._length + len(obs) >= self.max_tokens:  # no room left for a next action token
      self.truncated, self.truncation = True, "context"
      return
    turn.observation_ids = obs
    self._length += len(obs)

  def fail(self, failure: EnvFailure) -> None:
    """Marks the episode failed (e.g. its reset failed): excluded from the update and counted."""
    self.failure = failure

  def turn_rewards(self) -> list[float]:
    """Reward per turn so far (NaN for a turn without a completed env step; all NaN if failed)."""
    if self.failure is not None:
      return [math.nan] * len(self.turns)
    return [t.reward for t in self.turns]

  def stream(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(ids, policy_mask, turn_index, sampler_logp) of the stream after the prompt, each [L]."""
    ids, mask, index, logp = [], [], [], []
    for k, turn in enumerate(self.turns, start=1):
      n, m = len(turn.action_ids), len(turn.observation_ids)
      ids += turn.action_ids + turn.observation_ids
      mask += [True] * n + [False] * m
      index += [k] * n + [0] * m
      logp += (turn.action_logp or [0.0] * n) + [0.0] * m
    return (
      np.asarray(ids, np.int32),
      np.asarray(mask, bool),
      np.asarray(index, np.int32),
      np.asarray(logp, np.float32),
    )


def collate(
  episodes: Sequence[Episode],
  *,
  pad_id: int,
  num_tokens: int | None = None,
  num_turns: int | None = None,
) -> dict[str, np.ndarray]:
  """Arrays of B episodes (see the module docstring); T = ``num_tokens`` or the longest stream,
  K = ``num_turns`` or the most turns. Failed episodes keep their tokens but have every reward
  NaN and ``failed`` set, so the estimators exclude them."""
  streams = [e.stream() for e in episodes]
  T = max((len(s[0]) for s in streams), default=0) if num_tokens is None else num_tokens
  K = max((len(e.turns) for e in episodes), default=0) if num_turns is None else num_turns
  B = len(episodes)
  out = {
    "tokens": np.full((B, T), pad_id, np.int32),
    "policy_mask": np.zeros((B, T), bool),
    "token_mask": np.zeros((B, T), bool),
    "turn_index": np.zeros((B, T), np.int32),
    "sampler_logp": np.zeros((B, T), np.float32),
    "turn_rewards": np.full((B, K), np.nan, np.float32),
  }
  for b, (episode, (ids, mask, index, logp)) in enumerate(zip(episodes, streams, strict=True)):
    L = len(ids)
    if L > T or len(episode.turns) > K:
      raise ValueError(
        f"episode {b} has {L} tokens and {len(episode.turns)} turns; collate got T={T}, K={K}"
      )
    out["tokens"][b, :L], out["policy_mask"][b, :L] = ids, mask
    out["token_mask"][b, :L], out["turn_index"][b, :L], out["sampler_logp"][b, :L] = (
      True,
      index,
      logp,
    )
    rewards = episode.turn_rewards()
    out["turn_rewards"][b, : len(rewards)] = rewards
  out["num_turns"] = np.array([len(e.turns) for e in episodes], np.int32)
  out["terminated"] = np.array([e.terminated for e in episodes], bool)
  out["truncated"] = np.array([e.truncated for e in episodes], bool)
  out["failed"] = np.array([e.failure is not None for e in episodes], bool)
  return out
