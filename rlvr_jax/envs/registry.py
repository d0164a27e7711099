"""Environment ids -> environment instances (one explicit map, no string magic beyond it).

An :class:`EnvSpec` names an environment by id and is what crosses into worker processes (the
environment itself is built in the worker, by :func:`make_env`). Ids:

  * ``gem:<GEM id>``, e.g. ``gem:game:GuessTheNumber-v0-easy``, ``gem:rg:leg_counting``: built by
    ``gem.make(<GEM id>, **kwargs)``; ``gem_wrappers`` names entries of GEM's ``WRAPPER_FACTORY``
    (e.g. ``("python_tool",)``), applied in order, exactly as GEM's own trainers do;
  * ``package.module:Name``: a class (or factory function) called with ``**kwargs``;
  * one of :data:`BUILTINS` (``scripted``, ``guess_number``, ``tool_question``).

``tools`` (e.g. ``("python", "calculator")``) wraps the result in :class:`rlvr_jax.envs.tools.ToolEnv`.
An unknown id raises :class:`EnvConfigError` naming the closest choices.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Mapping
from typing import Any

from rlvr_jax.envs import builtin


class EnvConfigError(ValueError):
  """A configuration error: unknown environment id, unimportable class, unknown wrapper/tool."""


BUILTINS: Mapping[str, Any] = {
  "scripted": builtin.ScriptedEnv,
  "guess_number": builtin.GuessNumberEnv,
  "tool_question": builtin.QuestionEnv,
}


@dataclasses.dataclass(frozen=True)
class EnvSpec:
  """What to build for an episode: an id, constructor kwargs, and optional wrappers.

  Attributes:
    env_id: ``gem:<id>``, ``package.module:Name`` or a key of ``BUILTINS``.
    kwargs: constructor keyword arguments (must be picklable: they travel to workers).
    gem_wrappers: names in GEM's ``WRAPPER_FACTORY``, applied in order (GEM ids only).
    tools: tool names for :class:`rlvr_jax.envs.tools.ToolEnv` (empty: no wrapper).
    tool_kwargs: keyword arguments of the ToolEnv wrapper.
  """

  env_id: str
  kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  gem_wrappers: tuple[str, ...] = ()
  tools: tuple[str, ...] = ()
  tool_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def name(self) -> str:
    return self.env_id


def as_spec(spec: EnvSpec | str) -> EnvSpec:
  return spec if isinstance(spec, EnvSpec) else EnvSpec(str(spec))


def _close(word: str, choices, n: int = 5) -> list[str]:
  return difflib.get_close_matches(word, list(choices), n=n, cutoff=0.4)


def _gem_registry() -> dict:
  try:
    from gem.envs.registration import ENV_REGISTRY
  except ImportError as e:  # pragma: no cover - gem-llm is a dependency
    raise EnvConfigError(f"gem: ids need the gem-llm package ({e})") from e
  return ENV_REGISTRY


def _gem_wrapper_factory() -> dict:
  from gem.wrappers.wrapper_factory import WRAPPER_FACTORY

  return WRAPPER_FACTORY


def _resolve(env_id: str):
  """The constructor of an id (raises EnvConfigError)."""
  if env_id.startswith("gem:"):
    gem_id = env_id[len("gem:") :]
    registry = _gem_registry()
    if gem_id not in registry:
      close = _close(gem_id, registry)
      raise EnvConfigError(
        f"unknown GEM environment {gem_id!r} (env id {env_id!r}); closest: "
        f"{', '.join('gem:' + c for c in close) or 'none'}; {len(registry)} GEM ids exist "
        "(gem.print_envs() lists them)"
      )
    import gem

    return lambda **kw: gem.make(gem_id, **kw)
  if env_id in BUILTINS:
    return BUILTINS[env_id]
  if ":" in env_id:
    module_name, _, attr = env_id.partition(":")
    try:
      module = importlib.import_module(module_name)
    except ImportError as e:
      raise EnvConfigError(f"environment {env_id!r}: cannot import {module_name!r} ({e})") from e
    if not hasattr(module, attr):
      close = _close(attr, [a for a in dir(module) if not a.startswith("_")])
      raise EnvConfigError(
        f"environment {env_id!r}: module {module_name!r} has no {attr!r}; closest: "
        f"{', '.join(close) or 'none'}"
      )
    return getattr(module, attr)
  close = _close(env_id, BUILTINS)
  raise EnvConfigError(
    f"unknown environment id {env_id!r}; closest: {', '.join(close) or 'none'}. Choices: the "
    f"built-ins {sorted(BUILTINS)}, 'gem:<GEM id>' (e.g. gem:game:GuessTheNumber-v0-easy) or "
    "'package.module:Class'"
  )


def check_spec(spec: EnvSpec | str) -> EnvSpec:
  """Validates a spec in the caller (so a typo is a config error before any worker starts)."""
  spec = as_spec(spec)
  _resolve(spec.env_id)
  if spec.gem_wrappers:
    if not spec.env_id.startswith("gem:"):
      raise EnvConfigError(f"gem_wrappers apply to gem: ids only, got env id {spec.env_id!r}")
    factory = _gem_wrapper_factory()
    for name in spec.gem_wrappers:
      if name not in factory:
        raise EnvConfigError(
          f"unknown GEM wrapper {name!r}; closest: {', '.join(_close(name, factory)) or 'none'}; "
          f"choices: {sorted(factory)}"
        )
  if spec.tools:
    from rlvr_jax.envs import tools

    tools.check_tool_names(spec.tools)
  return spec


def make_env(spec: EnvSpec | str):
  """Builds the environment of a spec (in a worker process)."""
  spec = as_spec(spec)
  env = _resolve(spec.env_id)(**dict(spec.kwargs))
  if spec.gem_wrappers:
    factory = _gem_wrapper_factory()
    for name in spec.gem_wrappers:
      env = factory[name](env)
  if spec.tools:
    from rlvr_jax.envs import tools

    env = tools.ToolEnv(env, tools=spec.tools, **dict(spec.tool_kwargs))
  return env
