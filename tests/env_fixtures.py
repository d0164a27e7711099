"""Plain environment classes for tests/test_envs.py, importable in env workers as
``env_fixtures:<Name>`` (pytest puts tests/ on sys.path, which the workers inherit)."""

import os
import random
import time


class FaultyEnv:
  """Counts turns; the action text picks a fault: hang, crash, raise, malformed, badreward."""

  def __init__(self, fail_reset: bool = False):
    if fail_reset:
      raise RuntimeError("cannot build this env")
    self.turn = 0

  def reset(self, seed=None):
    self.turn = 0
    return f"ready {seed}", {}

  def step(self, action):
    self.turn += 1
    if action == "sleep":
      time.sleep(0.5)
    if action == "hang":
      time.sleep(3600)
    if action == "crash":
      os._exit(7)
    if action == "raise":
      raise RuntimeError("boom in step")
    if action == "malformed":
      return "only two", 1.0
    if action == "badreward":
      return "obs", "high", False, False, {}
    return f"turn {self.turn}", 0.5, False, False, {"unpicklable": lambda: None}


class RandomEnv:
  """Draws from Python's global ``random`` in step, as GEM's games do."""

  def reset(self, seed=None):
    return "go", {}

  def step(self, action):
    return f"{random.random():.12f}", 0.0, False, False, {}


class FailAtTurnEnv:
  """Answers "ok {turn}" until turn ``turn``, where it fails by ``mode`` (raise, malformed,
  hang) whatever the action, in the episodes whose seed is a multiple of ``every``: the multi-turn
  sampler's and trainer's failure tests use it."""

  def __init__(self, turn: int = 2, mode: str = "raise", num_turns: int = 4, every: int = 1):
    self.fail_turn, self.mode, self.num_turns, self.turn = turn, mode, num_turns, 0
    self.every, self.seed = every, 0

  def reset(self, seed=None):
    self.turn, self.seed = 0, seed or 0
    return f"go {seed}", {}

  def step(self, action):
    self.turn += 1
    if self.turn == self.fail_turn and self.seed % self.every == 0:
      if self.mode == "raise":
        raise RuntimeError("env broke")
      if self.mode == "malformed":
        return "two", 1.0
      if self.mode == "hang":
        time.sleep(3600)
    return f"ok {self.turn}", 0.25, self.turn >= self.num_turns, False, {}


class ActionRewardEnv:
  """Per-turn rewards that depend on the action text, so episodes of one group (same seed) differ
  in rewards and length: reward (sum of the action's code points mod 3) / 2; the episode ends
  when that sum is a multiple of 4 or at turn ``num_turns``; episodes whose seed is a multiple of
  ``fail_every`` raise at turn 2 (0 = never). The turn-credit trainer tests use it."""

  def __init__(self, num_turns: int = 4, fail_every: int = 0):
    self.num_turns, self.fail_every, self.turn, self.seed = num_turns, fail_every, 0, 0

  def reset(self, seed=None):
    self.turn, self.seed = 0, seed or 0
    return f"go {seed}", {}

  def step(self, action):
    self.turn += 1
    if self.fail_every and self.turn == 2 and self.seed % self.fail_every == 0:
      raise RuntimeError("env broke")
    code = sum(map(ord, action))
    done = code % 4 == 0 or self.turn >= self.num_turns
    return f"ok {self.turn}", (code % 3) / 2, done, False, {}
