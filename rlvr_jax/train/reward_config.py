"""The ``config.reward`` section: rewards built from the config, validated before any compile.

Fields::

  reward.name            one reward: a library name (rewards.REWARDS) or 'package.module:attr';
                         the shorthand for a single component, used when ``components`` is empty
  reward.components      ConfigDict keyed by component name (the name in the metrics), each
                           name='' | fn=''   a library reward by name, or a user reward by import
                                             path 'package.module:function_or_class' (one of the two)
                           kwargs            keyword arguments of the class / function
                           weight=1.0        w_k in R = (prod_gates R_g) * sum_k w_k R_k
                           gate=False        a gate multiplies the weighted sum (weight must stay 1)
  reward.example_fields  extra record fields passed to the reward per row (``answer``,
                         ``numbers``, ``target``, ``tests``, ``test_weights`` are passed when the
                         records have them)
  reward.num_workers, reward.timeout_s   the worker pool

A dict keyed by component name, not a list, so every field is overridable from the command line:
``--config.reward.components.overlong.weight=0.5``, ``...components.overlong.kwargs.buffer_len=2``.
Components are added in experiment files (``c.reward.components.fmt = reward_component(...)``);
``reward.name`` must then be '' (one source of truth). With components, the reward is a
:class:`rewards.CombinedReward` (per-component metrics ``reward/<key>/mean`` and
``reward/<key>/failures``; a component that fails fails only its rows). The shorthand builds the
library class itself, or a one-component CombinedReward for an import path.

Length rewards (overlong, cosine, laser) get their limits from ``sampling.max_new_tokens`` unless
their kwargs set them (``rewards.registry.LENGTH_DEFAULTS``); token lengths come from the sampler.
Everything is checked by :func:`validate_reward` (called by ``config.validate``): unknown names
(with the closest valid ones), import errors, missing or unknown keyword arguments, constructor
errors, all as ``ConfigError`` naming the field.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from typing import Any

from ml_collections import ConfigDict

from rlvr_jax import rewards
from rlvr_jax.rewards import registry

# Per-row fields the trainer passes to every reward when the records have them (plus
# completion_lengths, always). group_size is passed too, but not to per-item plain functions.
PASSED_FIELDS = (
  "answer",
  "numbers",
  "target",
  "tests",
  "test_weights",
  "reasoning_gym",
  "code_prefix",
  "entry_point",
)
# Data sources whose records carry their own verifier: the library reward that scores them. A run
# on such a source must use it (by name, or as a component) or a user reward by import path.
SOURCE_REWARDS = {"reasoning_gym": "reasoning_gym", "humaneval": "humaneval"}
_RESERVED_KEYS = ("name", "fn", "kwargs", "weight", "gate")


def reward_component(
  name: str = "", *, fn: str = "", weight: float = 1.0, gate: bool = False, **kwargs: Any
) -> ConfigDict:
  """One entry of ``config.reward.components``: ``reward_component("overlong", buffer_len=2)``,
  ``reward_component(fn="my_pkg.rewards:brevity", weight=0.1)``."""
  return ConfigDict(
    dict(name=name, fn=fn, kwargs=ConfigDict(kwargs), weight=float(weight), gate=gate)
  )


def reward_section() -> ConfigDict:
  """The default ``config.reward``: the exact-match arithmetic reward, one worker."""
  return ConfigDict(
    dict(
      name="arithmetic",
      components=ConfigDict(),
      example_fields=(),
      num_workers=1,
      timeout_s=10.0,
    )
  )


def _error(field: str, message: str) -> Exception:
  from rlvr_jax.train.config import ConfigError  # noqa: PLC0415  (config imports this module)

  return ConfigError(f"config.{field}: {message}")


def _plain(value: Any) -> Any:
  """ConfigDict / list values -> plain dicts and tuples (frozen dataclasses hold tuples)."""
  if isinstance(value, ConfigDict):
    value = value.to_dict()
  if isinstance(value, dict):
    return {k: _plain(v) for k, v in value.items()}
  if isinstance(value, list | tuple):
    return tuple(_plain(v) for v in value)
  return value


def _coerce_dataclass_fields(cls: type, kwargs: dict) -> dict:
  """A dict given for a dataclass field whose default is itself a dataclass (e.g. CodeReward's
  ``limits``) becomes an instance of that type."""
  if not dataclasses.is_dataclass(cls):
    return kwargs
  out = dict(kwargs)
  for f in dataclasses.fields(cls):
    default = f.default
    if f.name in out and isinstance(out[f.name], dict) and dataclasses.is_dataclass(default):
      out[f.name] = type(default)(**out[f.name])
  return out


def _signature(obj: Any) -> inspect.Signature | None:
  try:
    return inspect.signature(obj)
  except (TypeError, ValueError):
    return None


def _instantiate(cls: type, kwargs: dict, field: str):
  sig = _signature(cls)
  if sig is not None:
    try:
      sig.bind(**kwargs)
    except TypeError as e:
      accepted = [p for p in sig.parameters if p != "name"]
      raise _error(
        f"{field}.kwargs", f"{e} ({cls.__name__} accepts: {', '.join(accepted) or 'nothing'})"
      ) from None
  try:
    return cls(**_coerce_dataclass_fields(cls, kwargs))
  except Exception as e:  # noqa: BLE001  (any constructor error, e.g. re.error, is a config error)
    raise _error(f"{field}.kwargs", f"{cls.__name__}({kwargs}): {type(e).__name__}: {e}") from None


def _wrap_function(fn: Any, kwargs: dict, field: str, key: str, known_fields: set[str]):
  """A plain per-item reward function with its kwargs bound; missing required arguments (not in
  kwargs and not an example field the trainer passes) and unknown kwargs are config errors."""
  sig = _signature(fn)
  fname = getattr(fn, "__name__", type(fn).__name__)
  if sig is not None:
    params = list(sig.parameters.values())
    takes_var_kw = any(p.kind == p.VAR_KEYWORD for p in params)
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    unknown = sorted(set(kwargs) - named) if not takes_var_kw else []
    if unknown:
      raise _error(
        f"{field}.kwargs",
        f"{fname}() takes no argument(s) {unknown}; it takes {sorted(named)}",
      )
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2 and not any(p.kind == p.VAR_POSITIONAL for p in params):
      raise _error(
        f"{field}.fn", f"{fname} must take (prompts, completions, **fields) positionally"
      )
    missing = [
      p.name
      for p in params[2:]
      if p.default is p.empty
      and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
      and p.name not in kwargs
      and p.name not in known_fields
    ]
    if missing:
      raise _error(
        f"{field}.kwargs",
        f"{fname}() needs {missing}: give them in kwargs (the trainer passes only the "
        f"example fields {sorted(known_fields)})",
      )
  bound = functools.partial(fn, **kwargs) if kwargs else fn
  return rewards.FunctionReward(bound, name=key)


def _build_one(
  spec, *, key: str, field: str, max_new_tokens: int, known_fields: set[str], defaults=None
):
  """The ItemReward of one component (library name or import path) with its kwargs.

  ``defaults``: library name -> keyword defaults taken from other config sections (e.g. the
  reasoning-gym reward's ``answer_format`` from ``data.reasoning_gym``); kwargs override them."""
  name, fn_path = str(spec.get("name", "") or ""), str(spec.get("fn", "") or "")
  kwargs = _plain(spec.get("kwargs", ConfigDict())) or {}
  if bool(name) == bool(fn_path):
    raise _error(field, "set exactly one of name (a library reward) or fn ('package.module:attr')")
  for arg in ("correctness",):  # nested rewards of cosine / laser, by name or import path
    if isinstance(kwargs.get(arg), str):
      sub = ConfigDict(dict(fn=kwargs[arg]) if ":" in kwargs[arg] else dict(name=kwargs[arg]))
      kwargs[arg] = _build_one(
        sub,
        key=arg,
        field=f"{field}.kwargs.{arg}",
        max_new_tokens=max_new_tokens,
        known_fields=known_fields,
        defaults=defaults,
      )
  if name:
    if name not in registry.REWARDS:
      raise _error(f"{field}.name", registry.unknown_name_message(name))
    if name == "cosine" and kwargs.get("repetition_ngram", 0):
      raise _error(
        f"{field}.kwargs.repetition_ngram",
        "per-token rewards are not consumed by the trainer; use the sequence-level "
        "sequence_repetition_penalty or the 'repetition' reward",
      )
    kwargs = {
      **registry.length_defaults(name, max_new_tokens),
      **(defaults or {}).get(name, {}),
      **kwargs,
    }
    return _instantiate(registry.REWARDS[name], kwargs, field)
  try:
    target = registry.import_reward(fn_path)
  except (ValueError, ImportError, AttributeError) as e:
    raise _error(f"{field}.fn", str(e)) from None
  if isinstance(target, rewards.ItemReward):
    if kwargs:
      raise _error(f"{field}.kwargs", f"{fn_path} is a reward instance: it takes no kwargs")
    return target
  if isinstance(target, type):
    reward = _instantiate(target, kwargs, field)
    if isinstance(reward, rewards.ItemReward):
      return reward
    if not callable(reward):
      raise _error(f"{field}.fn", f"{fn_path}() is neither an ItemReward nor callable")
    return rewards.FunctionReward(reward, name=key)
  if not callable(target):
    raise _error(f"{field}.fn", f"{fn_path} is a {type(target).__name__}, not a reward")
  return _wrap_function(target, kwargs, field, key, known_fields)


def _known_fields(c) -> set[str]:
  return set(PASSED_FIELDS) | set(c.reward.example_fields) | {"completion_lengths"}


def build_reward(c):
  """The reward of a validated config (see the module docstring)."""
  r = c.reward
  max_new_tokens = int(c.sampling.max_new_tokens)
  known = _known_fields(c)
  defaults = {"reasoning_gym": {"answer_format": c.data.reasoning_gym.answer_format}}
  if not r.components:
    spec = ConfigDict(dict(fn=r.name) if ":" in r.name else dict(name=r.name))
    reward = _build_one(
      spec,
      key="reward",
      field="reward",
      max_new_tokens=max_new_tokens,
      known_fields=known,
      defaults=defaults,
    )
    if ":" not in r.name:
      return reward
    return rewards.CombinedReward({r.name.rpartition(":")[2].rpartition(".")[2]: reward})
  items, weights, gates = {}, {}, []
  for key, spec in r.components.items():
    field = f"reward.components.{key}"
    if not isinstance(spec, ConfigDict):
      raise _error(field, "must be a block of fields (use train.reward_config.reward_component)")
    extra = sorted(set(spec.keys()) - set(_RESERVED_KEYS))
    if extra:
      raise _error(field, f"unknown field(s) {extra}; a component has {list(_RESERVED_KEYS)}")
    items[key] = _build_one(
      spec,
      key=key,
      field=field,
      max_new_tokens=max_new_tokens,
      known_fields=known,
      defaults=defaults,
    )
    weight = spec.get("weight", 1.0)
    if not isinstance(weight, int | float) or not math.isfinite(weight):
      raise _error(f"{field}.weight", f"must be a finite number, got {weight!r}")
    if spec.get("gate", False):
      if weight != 1.0:
        raise _error(f"{field}.weight", "a gate multiplies the sum; its weight must stay 1.0")
      gates.append(key)
    else:
      weights[key] = float(weight)
  if not weights:
    raise _error("reward.components", "every component is a gate: nothing to multiply")
  return rewards.CombinedReward(items, weights=weights, gates=tuple(gates))


def _check_label_free(c, reward) -> None:
  """A label-free reward (majority vote, Co-Reward) reports the TRUE outcome as ``correct`` for
  evaluation; the zero-variance mask would then read labels during training."""
  parts = reward.rewards.items() if isinstance(reward, rewards.CombinedReward) else [("", reward)]
  for key, part in parts:
    label_free = isinstance(part, rewards.MajorityVoteReward | rewards.CoReward)
    if label_free and part.report_correct and c.rl.zero_variance in ("mask", "refill"):
      where = f"reward.components.{key}" if key else "reward.name"
      raise _error(
        "rl.zero_variance",
        f"{c.rl.zero_variance!r} reads the outcome 'correct', which the label-free reward at "
        f"{where} reports from the reference answers (for evaluation only): that would leak "
        "labels into training. Use rl.zero_variance='keep' (or report_correct=False).",
      )


def _check_source_reward(c) -> None:
  """The verifier of a data source goes with that source (SOURCE_REWARDS), both ways."""
  r = c.reward
  specs = list(r.components.values()) if r.components else [ConfigDict(dict(name=r.name))]
  names = {str(s.get("name", "") or "") for s in specs}
  by_path = any(":" in str(s.get("name", "") or "") or s.get("fn", "") for s in specs)
  for source, name in SOURCE_REWARDS.items():
    if name in names and c.data.source != source:
      raise _error(
        "reward.name" if not r.components else "reward.components",
        f"{name!r} scores the records of data.source={source!r}, not {c.data.source!r}",
      )
  own = SOURCE_REWARDS.get(c.data.source)
  if own and own not in names and not by_path:
    raise _error(
      "reward.name",
      f"data.source={c.data.source!r} records are scored by their own verifier: set "
      f"reward.name={own!r} (or a component with it, or your reward by import path); got "
      f"{sorted(n for n in names if n)}",
    )


def validate_reward(c) -> None:
  """ConfigError naming the field for any reward setting the trainer cannot run with."""
  r = c.reward
  if r.components and r.name:
    raise _error(
      "reward.name",
      f"set either reward.name (one reward) or reward.components, not both: got name="
      f"{r.name!r} and components {list(r.components)} (set reward.name='')",
    )
  if not r.components and not r.name:
    raise _error("reward.name", "empty and reward.components is empty: no reward")
  if not all(isinstance(f, str) for f in r.example_fields):
    raise _error("reward.example_fields", f"must be field names, got {r.example_fields!r}")
  if r.num_workers < 1:
    raise _error("reward.num_workers", "must be >= 1")
  if not r.timeout_s > 0:
    raise _error("reward.timeout_s", "must be > 0")
  _check_source_reward(c)
  reward = build_reward(c)
  _check_label_free(c, reward)
  try:
    rewards.runtime.dumps_reward(reward)
  except TypeError as e:
    raise _error("reward", str(e)) from None
