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
