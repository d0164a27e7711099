"""The environment protocol (the gym form of GEM / gymnasium) and validation of what envs return.

An environment is any object with

  * ``reset(seed=...) -> (observation: str, info: dict)``
  * ``step(action_text: str) -> (observation: str, reward: float, terminated: bool,
    truncated: bool, info: dict)``

and optionally ``close()``. GEM (``gem-llm``) environments satisfy it unchanged; so does a plain
class with these two methods. Environments run in worker processes (``pool.EnvPool``); what they
return is checked here, in the worker, and a malformed value becomes a failed episode whose cause
names the environment and the field, never a crash of the run.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import pickle
from typing import Any, Protocol, runtime_checkable

import numpy as np

# Why an episode failed. "timeout": a reset / step ran past its limit (worker killed); "crash": the
# worker died (segfault, os._exit, OOM kill); "exception": reset / step raised; "malformed": it
# returned something that is not the gym tuple; "memory": MemoryError; "lost": the worker hosting
# it was replaced because of another episode and its state could not be rebuilt by replay.
CAUSES = ("timeout", "crash", "exception", "malformed", "memory", "lost")


@runtime_checkable
class Env(Protocol):
  """What an environment must provide (structural: no subclassing needed)."""

  def reset(self, seed: int | None = None) -> tuple[str, dict]: ...

  def step(self, action: str) -> tuple[str, float, bool, bool, dict]: ...


class MalformedStepError(ValueError):
  """An environment returned something other than the gym tuple (names the env and the field)."""


@dataclasses.dataclass(frozen=True)
class EnvFailure:
  """Why an episode failed: one of ``CAUSES``, a message, and the seconds the call had run."""

  cause: str
  message: str
  elapsed_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class ResetResult:
  """The first observation of an episode (``failure`` set when reset failed)."""

  observation: str
  info: dict
  failure: EnvFailure | None = None

  @property
  def failed(self) -> bool:
    return self.failure is not None


@dataclasses.dataclass(frozen=True)
class StepResult:
  """One environment step. A failed step has ``failure`` set, reward NaN and ``terminated``."""

  observation: str
  reward: float
  terminated: bool
  truncated: bool
  info: dict
  failure: EnvFailure | None = None

  @property
  def failed(self) -> bool:
    return self.failure is not None

  @property
  def done(self) -> bool:
    return self.terminated or self.truncated or self.failed


def failed_reset(failure: EnvFailure) -> ResetResult:
  return ResetResult("", {}, failure)


def failed_step(failure: EnvFailure) -> StepResult:
  return StepResult("", math.nan, True, False, {}, failure)


def _is_bool(x: Any) -> bool:
  return isinstance(x, bool | np.bool_)


def _plain_info(env_name: str, info: Any, call: str) -> dict:
  """The info dict with values that cannot be pickled (sent to the trainer) replaced by repr."""
  if info is None:
    return {}
  if not isinstance(info, dict):
    raise MalformedStepError(
      f"environment {env_name}: {call} returned info of type {type(info).__name__}, expected dict"
    )
  out = {}
  for key, value in info.items():
    try:
      pickle.dumps(value)
      out[str(key)] = value
    except Exception:  # noqa: BLE001  (any unpicklable object: keep its description)
      out[str(key)] = repr(value)[:500]
  return out


def _check_observation(env_name: str, obs: Any, call: str) -> str:
  if isinstance(obs, np.str_):
    obs = str(obs)
  if not isinstance(obs, str):
    raise MalformedStepError(
      f"environment {env_name}: {call} returned observation of type {type(obs).__name__}, "
      "expected str"
    )
  return obs


def check_reset(env_name: str, value: Any) -> ResetResult:
  """Validates ``reset``'s ``(observation, info)``; raises MalformedStepError naming the field."""
  if not isinstance(value, tuple | list) or len(value) != 2:
    raise MalformedStepError(
      f"environment {env_name}: reset returned {_shape(value)}, expected (observation, info)"
    )
  obs, info = value
  return ResetResult(
    _check_observation(env_name, obs, "reset"), _plain_info(env_name, info, "reset")
  )


def check_step(env_name: str, value: Any) -> StepResult:
  """Validates ``step``'s 5-tuple; raises MalformedStepError naming the env and the field."""
  if not isinstance(value, tuple | list) or len(value) != 5:
    raise MalformedStepError(
      f"environment {env_name}: step returned {_shape(value)}, expected "
      "(observation, reward, terminated, truncated, info)"
    )
  obs, reward, terminated, truncated, info = value
  obs = _check_observation(env_name, obs, "step")
  if _is_bool(reward) or not isinstance(reward, numbers.Real):
    raise MalformedStepError(
      f"environment {env_name}: step returned reward of type {type(reward).__name__}, "
      "expected a real number"
    )
  if not math.isfinite(float(reward)):
    raise MalformedStepError(f"environment {env_name}: step returned reward {reward}")
  for field, flag in (("terminated", terminated), ("truncated", truncated)):
    if not _is_bool(flag):
      raise MalformedStepError(
        f"environment {env_name}: step returned {field} of type {type(flag).__name__}, "
        "expected bool"
      )
  return StepResult(
    obs, float(reward), bool(terminated), bool(truncated), _plain_info(env_name, info, "step")
  )


def _shape(value: Any) -> str:
  if isinstance(value, tuple | list):
    return f"a {type(value).__name__} of length {len(value)}"
  return f"a {type(value).__name__}"
