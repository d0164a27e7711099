"""A run directory's lifecycle: what launching into a workdir that already holds a run does.

The workdir keeps the resolved config of its run in ``config.json`` and, once the run has reached
``rl.num_steps`` and its final evaluation, ``summary.json`` with ``"complete": true``. Launching
again into the same workdir (``checkpoint.resume=True``, the default):

- no complete checkpoint: a new run (an interrupted start-up left nothing to resume);
- the run is complete and ``rl.num_steps`` is unchanged: nothing is run or written; the trainer
  says where the results are (``summary.json`` and ``metrics.jsonl`` stay byte-identical);
- otherwise it resumes from the latest complete checkpoint: after a kill, or to *extend* a
  finished run when ``rl.num_steps`` was raised (the steps after the old end follow the same
  data order and keys as an uninterrupted run of the new length);
- a change of any field that defines the experiment (everything but ``NON_DEFINING``) is refused
  with a ``ConfigError`` listing the fields, their saved and new values, and the two ways out:
  ``--config.workdir=<new dir>`` (a new run beside the old one) or
  ``--config.checkpoint.resume=False`` (start over in place: the old checkpoints are removed).

With a decaying learning-rate schedule (``optim.schedule`` cosine / linear) the schedule's length
is ``rl.num_steps``, so changing it changes every step's learning rate: extending is refused there
too. A field the saved config lacks (added to the code after the run started) counts as unchanged
when it has its ``base_config`` default; a field the code no longer has is ignored.
"""

from __future__ import annotations

import json
import os

from rlvr_jax.train import config as config_lib

# Fields (or blocks, ending in ".") that do not change what a run computes in training: its length,
# where and how often it saves and logs, how often it is evaluated.
NON_DEFINING = (
  "rl.num_steps",
  "max_steps_this_run",
  "workdir",
  "checkpoint.",
  "logging.",
  "compilation.",
  "sampling.engine",
  "sampling.num_slots",
  "model.decode_attention",
  "eval.every",
  "eval.batch_size",
  "reward.num_workers",
)


def flatten(tree: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def resolved(config) -> dict:
  """The flattened config as ``config.json`` stores it (JSON values: tuples become lists)."""
  return flatten(json.loads(config.to_json_best_effort()))


def _defining(field: str) -> bool:
  return not any(field == n or (n.endswith(".") and field.startswith(n)) for n in NON_DEFINING)


def differences(saved: dict, current: dict) -> list[tuple[str, object, object]]:
  """``(field, saved value, new value)`` of every experiment-defining field that differs."""
  defaults = resolved(config_lib.base_config())
  out = []
  for field in sorted(current):  # a field the code no longer has cannot change the run
    if not _defining(field):
      continue
    old, new = saved.get(field, defaults.get(field)), current[field]
    if old != new:
      out.append((field, old, new))
  return out


def write_text_atomic(path: str, text: str) -> None:
  """Writes ``path`` through a temporary file and a rename, so no reader sees it half written."""
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def read_json(path: str) -> dict | None:
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def check_resume(config, latest_step: int) -> None:
  """Raises ``ConfigError`` if resuming ``config.workdir`` at ``latest_step`` with ``config``
  would not continue the same experiment (module docstring)."""
  workdir = config.workdir
  ways_out = (
    f"to keep the old run, start a new one with --config.workdir=<new dir>; to replace it, "
    f"--config.checkpoint.resume=False (removes {workdir}/checkpoints)"
  )
  saved = read_json(os.path.join(workdir, "config.json"))
  current = resolved(config)
  if saved is not None:
    diff = differences(flatten(saved), current)
    if diff:
      listed = "; ".join(f"{f}: {old!r} -> {new!r}" for f, old, new in diff)
      raise config_lib.ConfigError(
        f"config.{diff[0][0]}: {workdir} holds a run of a different experiment ({listed}); "
        + ways_out
      )
  steps = config.rl.num_steps
  if latest_step > steps:
    raise config_lib.ConfigError(
      f"config.rl.num_steps: {workdir} already has {latest_step} steps, more than "
      f"rl.num_steps={steps}; " + ways_out
    )
  old_steps = (saved or {}).get("rl", {}).get("num_steps", steps)
  if old_steps != steps and config.optim.schedule != "constant":
    raise config_lib.ConfigError(
      f"config.rl.num_steps: {old_steps} -> {steps} changes the length of the "
      f"{config.optim.schedule!r} learning-rate schedule of {workdir}, so the run cannot be "
      "extended; " + ways_out
    )


def finished_summary(config, latest_step: int | None) -> dict | None:
  """The run's ``summary.json`` if the run in ``config.workdir`` is complete at
  ``rl.num_steps`` (nothing left to do), else None."""
  if latest_step is None or latest_step != config.rl.num_steps:
    return None
  summary = read_json(os.path.join(config.workdir, "summary.json"))
  if summary and summary.get("complete") and summary.get("steps") == config.rl.num_steps:
    return summary
  return None
