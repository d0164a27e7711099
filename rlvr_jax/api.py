"""Python entry point for notebooks and other programs: one call runs a config.

  from rlvr_jax import api
  result = api.run("experiments/default.py", rl=dict(num_steps=20), workdir="runs/short")
  result.summary["eval_after"]["eval/accuracy"]
  steps, rewards = result.curve("reward/mean")
  result.checkpoint_dir       # orbax checkpoints of the run (resume: run the same config again)

``run`` is the command line (``python -m rlvr_jax.main``) without absl: the same config, the same
trainer (``train.sharded.train``: one device, or a mesh with ``mesh=(data, fsdp, tensor)``), the
same files in the workdir; the progress bar is ``tqdm.auto`` (a widget in Jupyter, text in a
terminal). Overrides are nested dicts per config block (``objective=dict(name="dapo")``) or dotted
names (``**{"objective.kwargs.clip_high": 0.28}``); an unknown field raises ``ConfigError`` naming
it, and the whole config is validated before anything is built.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ml_collections import ConfigDict

from rlvr_jax import cli
from rlvr_jax import metrics as metrics_lib
from rlvr_jax.train import config as config_lib


@dataclasses.dataclass
class RunResult:
  """What a run left behind.

  Attributes:
    metrics: every record of ``<workdir>/metrics.jsonl`` in order (train steps and ``eval/``
      records, each with ``step``).
    summary: the trainer's summary (``summary.json``): ``eval_before`` / ``eval_after`` (when the
      run reached ``rl.num_steps``), ``last`` (the last step's metrics), ``steps``, ``rl_time_s``.
    workdir: the run directory.
    checkpoint_dir: where its checkpoints are (``<workdir>/checkpoints``).
    config: the config that ran (a resolved copy).
  """

  metrics: list[dict]
  summary: dict
  workdir: str
  checkpoint_dir: str
  config: ConfigDict

  def curve(self, name: str) -> tuple[list[int], list[float]]:
    """(steps, values) of metric ``name`` over the run, skipping records without it (and NaN,
    written as null)."""
    rows = [(r["step"], r[name]) for r in self.metrics if r.get(name) is not None]
    return [s for s, _ in rows], [float(v) for _, v in rows]


def load_config(path: str) -> ConfigDict:
  """``get_config()`` of an experiment file (``experiments/<name>.py``): ``cli.load_config``, with
  its errors as ``ConfigError`` (the type a Python caller catches)."""
  if not os.path.isfile(path):
    raise config_lib.ConfigError(f"config file {path!r}: no such file")
  try:
    return cli.load_config(path)
  except cli.UsageError as e:
    raise config_lib.ConfigError(str(e)) from None


def _nest(overrides: dict[str, Any]) -> dict:
  """``{"a.b": 1, "c": {"d": 2}}`` -> ``{"a": {"b": 1}, "c": {"d": 2}}``."""
  out: dict = {}
  for key, value in overrides.items():
    *parents, leaf = key.split(".")
    node = out
    for p in parents:
      node = node.setdefault(p, {})
      if not isinstance(node, dict):
        raise config_lib.ConfigError(f"config.{key}: overridden both as a value and a block")
    if isinstance(value, dict) and isinstance(node.get(leaf), dict):
      node[leaf].update(value)
    else:
      node[leaf] = value
  return out


def make_config(config_or_path: ConfigDict | str, **overrides: Any) -> ConfigDict:
  """A validated copy of the config (a ``ConfigDict`` or an experiment file) with ``overrides``
  applied (see the module docstring)."""
  if isinstance(config_or_path, str | os.PathLike):
    config = load_config(os.fspath(config_or_path))
  elif isinstance(config_or_path, ConfigDict):
    config = config_or_path.copy_and_resolve_references()
  else:
    raise TypeError(f"config_or_path must be a ConfigDict or a path, got {type(config_or_path)}")
  config.unlock()
  config_lib.apply_overrides(config, _nest(overrides))
  config_lib.validate(config)
  return config


def run(
  config_or_path: ConfigDict | str,
  *,
  mesh: tuple[int, int, int] | None = None,
  log=print,
  **overrides: Any,
) -> RunResult:
  """Runs a config end to end (or resumes it, when its workdir has checkpoints) and returns its
  ``RunResult``. ``mesh``: (data, fsdp, tensor) sizes, as ``--mesh`` on the command line."""
  config = make_config(config_or_path, **overrides)
  from rlvr_jax.train import sharded

  summary = sharded.train(config, mesh_sizes=mesh, log=log)
  workdir = os.path.abspath(config.workdir)
  return RunResult(
    metrics=metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl")),
    summary=summary,
    workdir=workdir,
    checkpoint_dir=os.path.join(workdir, "checkpoints"),
    config=config,
  )
