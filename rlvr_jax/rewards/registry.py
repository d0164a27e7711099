"""Library rewards by name, and user rewards by import path: the one place names are resolved.

``REWARDS`` maps the name used in a config (``reward.name``, ``reward.components.<key>.name``) to
its class. To make a new library reward selectable from the config, add it here.

``LENGTH_DEFAULTS`` gives the keyword defaults that length rewards take from the sampling budget
``L = sampling.max_new_tokens`` (tokens) when the config does not set them: the classes' own
defaults are for 16k-32k-token reasoning contexts and would never fire on a short budget.

  overlong: max_len = L, buffer_len = max(1, round(0.2 L))   (DAPO: 4096 of 20480 tokens)
  cosine:   max_len = L, exceed_margin = 0 (exceed_value for completions that fill the budget)
  laser:    target_length = max(1, L // 2)

User rewards are named ``"package.module:attribute"`` (a function, an :class:`ItemReward`
subclass, or an instance); :func:`import_reward` imports them with errors that name the step that
failed.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from typing import Any

from rlvr_jax.rewards.code_reward import CodeReward
from rlvr_jax.rewards.format_reward import FormatReward
from rlvr_jax.rewards.humaneval_reward import HumanEvalReward
from rlvr_jax.rewards.label_free import CoReward, MajorityVoteReward
from rlvr_jax.rewards.length import CosineReward, LaserReward, OverlongReward, RepetitionReward
from rlvr_jax.rewards.math_reward import MathReward
from rlvr_jax.rewards.reasoning_gym_reward import ReasoningGymReward
from rlvr_jax.rewards.tasks import ArithmeticReward, CountdownReward

REWARDS: dict[str, type] = {
  "arithmetic": ArithmeticReward,
  "math": MathReward,
  "countdown": CountdownReward,
  "format": FormatReward,
  "overlong": OverlongReward,
  "cosine": CosineReward,
  "laser": LaserReward,
  "repetition": RepetitionReward,
  "code": CodeReward,
  "majority_vote": MajorityVoteReward,
  "co_reward": CoReward,
  "reasoning_gym": ReasoningGymReward,  # data.source="reasoning_gym" records (their score_answer)
  "humaneval": HumanEvalReward,  # data.source="humaneval" records, in the code sandbox
}

LENGTH_DEFAULTS: dict[str, Callable[[int], dict[str, int]]] = {
  "overlong": lambda L: {"max_len": L, "buffer_len": max(1, round(0.2 * L))},
  "cosine": lambda L: {"max_len": L, "exceed_margin": 0},
  "laser": lambda L: {"target_length": max(1, L // 2)},
}


def unknown_name_message(name: str) -> str:
  """'<name>' is not a library reward, the closest names, and every valid one."""
  close = difflib.get_close_matches(name, REWARDS, n=2, cutoff=0.7)
  hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else "."
  return (
    f"{name!r} is not a library reward{hint} Valid names: {', '.join(sorted(REWARDS))}, or an "
    f"import path 'package.module:attribute' for your own reward"
  )


def length_defaults(name: str, max_new_tokens: int | None) -> dict[str, int]:
  """Keyword defaults of library reward ``name`` from the sampling budget (see module doc)."""
  if max_new_tokens is None or name not in LENGTH_DEFAULTS:
    return {}
  return LENGTH_DEFAULTS[name](int(max_new_tokens))


def build_library_reward(name: str, *, max_new_tokens: int | None = None, **kwargs: Any):
  """An instance of library reward ``name``; length limits default from ``max_new_tokens``."""
  if name not in REWARDS:
    raise KeyError(unknown_name_message(name))
  return REWARDS[name](**{**length_defaults(name, max_new_tokens), **kwargs})


def import_reward(path: str) -> Any:
  """The object named by ``"package.module:attribute"`` (dots in the attribute walk into it).

  Raises ValueError for a malformed path, ImportError (with the module's own error) when the
  module cannot be imported, AttributeError naming what the module has when the attribute is
  missing.
  """
  module_name, sep, attr = str(path).partition(":")
  if not sep or not module_name or not attr:
    raise ValueError(f"{path!r} is not an import path of the form 'package.module:attribute'")
  try:
    module = importlib.import_module(module_name)
  except Exception as e:  # ImportError, or the module's own import-time error
    raise ImportError(f"cannot import module {module_name!r}: {type(e).__name__}: {e}") from e
  obj = module
  for part in attr.split("."):
    if not hasattr(obj, part):
      public = sorted(n for n in dir(obj) if not n.startswith("_"))[:30]
      close = difflib.get_close_matches(part, public, n=2)
      hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
      raise AttributeError(f"{module_name!r} has no attribute {attr!r}{hint}")
    obj = getattr(obj, part)
  return obj
