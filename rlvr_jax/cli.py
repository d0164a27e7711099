"""The command line around ``rlvr_jax.main``: experiment names, ``--help``, one-line errors.

- ``--config`` takes an experiment name (``--config=default`` -> ``experiments/default.py``, looked
  up in ``./experiments`` and then in the repository's ``experiments/``) or a path, as with the
  ml_collections launchers (MaxText, big_vision).
- ``--help`` (``-h``, ``--helpshort``, ``--helpfull``) prints the usage, the experiments, every
  config field with this experiment's value and its one-line meaning
  (``train.config_help.FIELD_HELP``) and the machine flags, and exits 0.
- An invalid configuration (unknown field, a value of the wrong type, a value out of range,
  incompatible options) ends, before anything is loaded, with one line on stderr,
  ``error: config.<field>: <what is wrong> (got <value>); valid: <choices> / did you mean ...``,
  and exit status 2 (``EXIT_USAGE``, the argparse convention).
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import sys
from pathlib import Path

EXIT_USAGE = 2
_HELP_ARGS = ("--help", "-h", "--helpshort", "--helpfull", "-?")
_REPO_EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
USAGE = (
  "usage: python -m rlvr_jax.main --config=<experiment name or file> "
  "[--config.<field>=<value> ...] [--mesh=data,fsdp,tensor[,context]]"
)


class UsageError(ValueError):
  """A bad command line; ``str(e)`` is the whole one-line message (without ``error:``)."""


def fail(message: str) -> None:
  """Prints ``error: <message>`` to stderr and exits with status 2."""
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(EXIT_USAGE)


# ---------------------------------------------------------------------------- experiments
def experiment_dirs() -> list[Path]:
  out = [Path.cwd() / "experiments", _REPO_EXPERIMENTS]
  return [d for i, d in enumerate(out) if d.is_dir() and d.resolve() not in out[:i]]


def experiment_names() -> list[str]:
  """Names of the experiment files (those with a ``get_config()``)."""
  names = set()
  for d in experiment_dirs():
    for f in d.glob("*.py"):
      if "def get_config" in f.read_text(encoding="utf-8"):
        names.add(f.stem)
  return sorted(names)


def resolve_experiment(value: str) -> str:
  """An experiment name -> its file; a path (anything with a ``/`` or ending in ``.py``) as is."""
  path, sep, args = value.partition(":")  # ml_collections' ``file.py:arg`` form
  if "/" in path or path.endswith(".py") or os.sep in path:
    return value
  for d in experiment_dirs():
    f = d / f"{path}.py"
    if f.exists():
      return str(f) + sep + args
  names = ", ".join(experiment_names())
  raise UsageError(f"--config={value}: no experiment of that name (experiments: {names})")


def rewrite_argv(argv: list[str]) -> list[str]:
  """``--config=NAME`` / ``--config NAME`` -> ``--config=<file>``."""
  out, i = [], 0
  while i < len(argv):
    a = argv[i]
    if a.startswith("--config="):
      a = "--config=" + resolve_experiment(a.split("=", 1)[1])
    elif a == "--config" and i + 1 < len(argv):
      a, i = "--config=" + resolve_experiment(argv[i + 1]), i + 1
    out.append(a)
    i += 1
  return out


def config_arg(argv: list[str]) -> str | None:
  vals = [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
  return vals[-1] if vals else None


def load_config(spec: str):
  """``get_config()`` of an experiment file (``file.py`` or ``file.py:arg``)."""
  path, _, arg = spec.partition(":")
  if not os.path.exists(path):
    raise UsageError(f"--config={spec}: file not found")
  module_spec = importlib.util.spec_from_file_location("_rlvr_experiment", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise UsageError(f"--config={spec}: the file has no get_config()")
  return module.get_config(arg) if arg else module.get_config()


# ---------------------------------------------------------------------------- fields
def flatten(config, prefix: str = "") -> dict:
  """``{"rl.num_steps": 100, ...}`` for every leaf field of a ConfigDict."""
  out = {}
  for k, v in config.items():
    if hasattr(v, "items"):
      out.update(flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def closest_fields(name: str, fields) -> list[str]:
  """Likely intended fields for a misspelt ``name`` (full path first, then the last part)."""
  fields = list(fields)
  leaf = name.rsplit(".", 1)[-1]
  by_leaf = {}
  for f in fields:
    by_leaf.setdefault(f.rsplit(".", 1)[-1], []).append(f)
  if "." not in name and name in by_leaf:  # the block was left out: every field of that name
    return by_leaf[name]
  ratio = lambda f: difflib.SequenceMatcher(None, name, f).ratio()
  near = difflib.get_close_matches(name, fields, n=3, cutoff=0.75)
  if near:  # the best, and any as good
    return [f for f in near if ratio(f) >= ratio(near[0]) - 0.02]
  return [f for m in difflib.get_close_matches(leaf, list(by_leaf), n=2, cutoff=0.75)
          for f in by_leaf[m]][:3]  # fmt: skip


def override_fields(argv: list[str]) -> list[tuple[str, str]]:
  """(field, the argument) of every ``--config.<field>[=v]`` / ``--noconfig.<field>``."""
  out = []
  for a in argv:
    for head in ("--config.", "--noconfig."):
      if a.startswith(head):
        out.append((a[len(head) :].split("=", 1)[0], a))
  return out


def check_overrides(config, argv: list[str]) -> None:
  """Raises ``UsageError`` for the first override naming a field the config does not have."""
  fields = flatten(config)
  for name, arg in override_fields(argv):
    if name in fields:
      continue
    inside = [f for f in fields if f.startswith(name + ".")]
    if inside:
      raise UsageError(
        f"config.{name}: a block of fields, not a value ({arg}); set one of its fields, "
        f"e.g. --config.{inside[0]}=..."
      )
    near = closest_fields(name, fields)
    hint = f"; did you mean {' or '.join('config.' + n for n in near)}?" if near else ""
    raise UsageError(f"config.{name}: no such field ({arg}){hint} (--help lists the fields)")


def explain_flag_error(error: Exception, config) -> str:
  """absl's ``flag --config.a.b=x: <reason>`` -> ``config.a.b: <reason> (got x; a <type> ...)``."""
  text = str(error).strip()
  if text.startswith("flag --config."):
    head, _, reason = text[len("flag --") :].partition(": ")
    name, _, value = head.partition("=")
    field = name[len("config.") :]
    current = flatten(config).get(field) if config is not None else None
    kind = type(current).__name__ if current is not None else "value"
    if isinstance(current, bool):
      reason = "not a boolean"
    return f"{name}: {reason} (got {value!r}; expected {kind}, default {current!r})"
  return text.splitlines()[0] if text else type(error).__name__


def explain_config_error(error: Exception, config) -> str:
  """A ``ConfigError`` (``config.<field>: <msg>``) with the value and the choices added."""
  from rlvr_jax.train import config_help

  msg = str(error)
  head, _, rest = msg.partition(": ")
  field = head[len("config.") :] if head.startswith("config.") else None
  fields = flatten(config) if config is not None else {}
  if field in fields:
    value = fields[field]
    about_value = repr(value) in rest  # the message rejects this value (not a combination)
    if "got" not in rest and not about_value:
      msg += f" (got {value!r})"
    choices = config_help.CHOICES.get(field)
    if about_value and choices and not all(str(c) in rest for c in choices[:2]):
      msg += f"; valid: {', '.join(map(str, choices))}"
    if about_value and choices:
      near = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
      msg += f"; did you mean {near[0]!r}?" if near else ""
  return msg


# ---------------------------------------------------------------------------- help
def help_text(config, spec: str | None, machine_flags: list[tuple[str, str, object]]) -> str:
  from rlvr_jax.train import config_help

  lines = [USAGE, ""]
  lines.append("  --config    an experiment name or file: " + ", ".join(experiment_names()))
  lines.append("  --config.<field>=<value>   override one field (any field below)")
  lines.append("")
  src = f"of {spec}" if spec else "(base_config defaults; --config=<name> --help shows its values)"
  lines.append(f"Config fields {src}:")
  fields = flatten(config)
  width = max(len(f"{k} = {v!r}") for k, v in fields.items() if not k.startswith("objective.kw"))
  width = min(width, 46)
  block = None
  for k, v in fields.items():
    top = k.split(".", 1)[0] if "." in k else ""
    if top != block:
      lines.append("")
      block = top
    left = f"  {k} = {v!r}"
    text = config_help.help_for(k)
    choices = config_help.CHOICES.get(k)
    if choices:
      text += f" [{'|'.join(map(str, choices))}]"
    lines.append(f"{left:<{width + 2}}  {text}" if len(left) <= width + 2 else f"{left}\n"
                 f"{'':<{width + 4}}{text}")  # fmt: skip
  lines += ["", "Machine flags (not config fields, so one experiment runs anywhere):"]
  for name, text, default in machine_flags:
    lines.append(f"  --{name} (default {default!r})  {text}")
  lines += [
    "",
    "A run resumes its workdir's latest checkpoint; a finished run is left as it is. Raising",
    "rl.num_steps extends it; changing what defines the experiment is refused (README).",
  ]
  return "\n".join(lines)


def wants_help(argv: list[str]) -> bool:
  return any(a in _HELP_ARGS for a in argv[1:])
