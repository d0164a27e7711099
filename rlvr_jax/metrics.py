"""Metric writers: JSONL (always), TensorBoard (when tensorboardX is installed), a tqdm bar.

One record per step: ``{"step": int, "time": unix seconds, "<name>": float, ...}``, one JSON
object per line in ``<workdir>/metrics.jsonl``. Evaluation records use the same file with names
under ``eval/``. ``read_jsonl`` reads a run back (the plot tool and the tests use it).
"""

from __future__ import annotations

import json
import math
import os
import time

import numpy as np

try:  # optional
  import tensorboardX
except ImportError:  # pragma: no cover
  tensorboardX = None

try:  # tqdm.auto: a widget bar in Jupyter (ipywidgets), a text bar in a terminal
  from tqdm import auto as tqdm
except ImportError:  # pragma: no cover
  tqdm = None

# Progress-bar columns: (short label, metric name, format).
BAR_FIELDS = (
  ("rew", "reward/mean", "{:.3f}"),
  ("acc", "accuracy/mean", "{:.3f}"),
  ("len", "length/mean", "{:.1f}"),
  ("ent", "entropy/mean", "{:.3f}"),
  ("turns", "episode/turns_mean", "{:.2f}"),
  ("succ", "episode/success", "{:.2f}"),
  ("envfail", "env/fail_frac", "{:.2f}"),
  ("env", "env/step_time_s", "{:.2f}s"),
  ("t", "time/step", "{:.2f}s"),
  ("smp", "time/sample", "{:.2f}"),
  ("rwd", "time/reward", "{:.2f}"),
  ("upd", "time/update", "{:.2f}"),
)


def to_python(metrics: dict) -> dict:
  """Scalars (numpy / jax / python) -> python floats; non-finite values become None in JSON."""
  out = {}
  for k, v in metrics.items():
    v = float(np.asarray(v))
    out[k] = v if math.isfinite(v) else None
  return out


class MetricsWriter:
  """Appends step records to ``metrics.jsonl`` and mirrors them to TensorBoard.

  Args:
    workdir: run directory.
    tensorboard: also write TensorBoard event files (if tensorboardX is importable).
    resume_step: when resuming, records with ``step > resume_step`` left by the killed run are
      dropped so the file matches an uninterrupted run.
    drop_eval_at: also drop the evaluation records (``eval/*`` keys) at this step (a final
      evaluation that ran after the last checkpoint and will be redone).
  """

  def __init__(
    self,
    workdir: str,
    *,
    tensorboard: bool = True,
    resume_step: int | None = None,
    drop_eval_at: int | None = None,
  ):
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, "metrics.jsonl")
    if resume_step is not None and os.path.exists(self.path):
      is_eval = lambda r: any(k.startswith("eval/") for k in r)
      kept = [
        r
        for r in read_jsonl(self.path)
        if r["step"] <= resume_step and not (r["step"] == drop_eval_at and is_eval(r))
      ]
      with open(self.path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
    elif resume_step is None and os.path.exists(self.path):
      os.remove(self.path)
    self._tb = None
    if tensorboard and tensorboardX is not None:
      self._tb = tensorboardX.SummaryWriter(os.path.join(workdir, "tb"))

  def write(self, step: int, metrics: dict) -> None:
    record = {"step": int(step), "time": time.time(), **to_python(metrics)}
    with open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")
    if self._tb is not None:
      for k, v in record.items():
        if k not in ("step", "time") and v is not None:
          self._tb.add_scalar(k, v, int(step))

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def read_jsonl(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def reward_component_fields(metrics: dict) -> list[str]:
  """Progress-bar fields of a combined reward: ``<name>=mean`` per component
  (``reward/<name>/mean``), and ``<name>!=count`` when it failed on some rows this step."""
  parts = []
  for key, value in metrics.items():
    head, _, tail = key.partition("/")
    name, _, stat = tail.rpartition("/")
    if head != "reward" or not name or "/" in name or value is None:
      continue
    if stat == "mean":
      parts.append(f"{name}={float(value):.3f}")
    elif stat == "failures" and float(value) > 0:
      parts.append(f"{name}!={int(value)}")
  return parts


class ProgressBar:
  """A tqdm bar over RL steps whose postfix shows reward, accuracy, length, entropy, times.

  The rate (and so the ETA) is the plain average over the steps since ``restart_clock`` (the
  trainer calls it after the first, compiling step; no exponential smoothing, which would keep
  the compile time in the estimate for many steps)."""

  def __init__(self, total: int, initial: int = 0, *, enabled: bool = True, file=None):
    self._bar = None
    if enabled and tqdm is not None:
      self._bar = tqdm.tqdm(
        total=total, initial=initial, dynamic_ncols=True, desc="rl", smoothing=0, file=file
      )

  def restart_clock(self) -> None:
    """Rate and ETA from now on count only the steps after this call."""
    if self._bar is None:
      return
    self._bar.start_t = self._bar.last_print_t = self._bar._time()
    self._bar.initial = self._bar.n

  def rate(self) -> float | None:
    """Steps per second since the start (or ``restart_clock``); None before any step."""
    if self._bar is None:
      return None
    d = self._bar.format_dict
    done = d["n"] - d["initial"]
    return done / d["elapsed"] if done > 0 and d["elapsed"] > 0 else None

  def update(self, metrics: dict) -> None:
    if self._bar is None:
      return
    parts = []
    for label, name, fmt in BAR_FIELDS:
      if name in metrics and metrics[name] is not None:
        parts.append(f"{label}={fmt.format(float(metrics[name]))}")
    parts += reward_component_fields(metrics)
    self._bar.set_postfix_str(" ".join(parts), refresh=False)
    self._bar.update(1)

  def write(self, text: str) -> None:
    if self._bar is not None:
      self._bar.write(text)
    else:
      print(text, flush=True)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()
