"""Curves of one or several runs (``<workdir>/metrics.jsonl``) to a PNG.

Panels: train reward, train accuracy, held-out accuracy (greedy) and pass@1, entropy, completion
length, step time. Several runs are overlaid, one colour each, labelled by their directory name
(or the given labels); runs whose label ends in ``_s<seed>`` share a colour per method.
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from rlvr_jax import metrics as metrics_lib  # noqa: E402

PANELS = (
  ("train reward", ("reward/mean",)),
  ("train accuracy", ("accuracy/mean",)),
  ("held-out accuracy", ("eval/accuracy", "eval/pass@1")),
  ("entropy", ("entropy/mean",)),
  ("completion length", ("length/mean",)),
  ("step time (s)", ("time/step",)),
)
# Multi-turn runs (config.env.id set): episodes instead of completions.
MULTITURN_PANELS = (
  ("train success / return", ("episode/success", "reward/mean")),
  ("train mean turns", ("episode/turns_mean",)),
  ("held-out success", ("eval/greedy_success", "eval/sampled_success")),
  ("held-out mean turns", ("eval/greedy_turns", "eval/sampled_turns")),
  ("entropy", ("entropy/mean",)),
  ("step time (s)", ("time/step",)),
)


def _series(records, name, smooth: int):
  pts = [(r["step"], r[name]) for r in records if r.get(name) is not None]
  if not pts:
    return [], []
  xs, ys = zip(*pts, strict=True)
  if smooth > 1 and not name.startswith("eval/"):
    ys = [sum(ys[max(0, i - smooth + 1) : i + 1]) / len(ys[max(0, i - smooth + 1) : i + 1])
          for i in range(len(ys))]  # fmt: skip
  return list(xs), list(ys)


def plot_runs(
  run_dirs, out_path: str, *, labels=None, smooth: int = 5, title: str = "", panels=PANELS
) -> str:
  """Write the curves of ``run_dirs`` to ``out_path`` (PNG); returns the path."""
  labels = labels or [os.path.basename(os.path.normpath(d)) for d in run_dirs]
  runs = [metrics_lib.read_jsonl(os.path.join(d, "metrics.jsonl")) for d in run_dirs]
  methods = sorted({lab.rsplit("_s", 1)[0] for lab in labels})
  colours = {m: plt.cm.tab10(i % 10) for i, m in enumerate(methods)}
  fig, axes = plt.subplots(2, 3, figsize=(15, 8))
  for ax, (panel, names) in zip(axes.flat, panels, strict=True):
    for label, records in zip(labels, runs, strict=True):
      colour = colours[label.rsplit("_s", 1)[0]]
      for j, name in enumerate(names):
        xs, ys = _series(records, name, smooth)
        if xs:
          style = "-o" if name.startswith("eval/") else "-"
          ax.plot(xs, ys, style, color=colour, alpha=1.0 if j == 0 else 0.5, markersize=3,
                  label=f"{label} {name}" if len(names) > 1 else label)  # fmt: skip
    ax.set_title(panel)
    ax.set_xlabel("RL step")
    ax.grid(alpha=0.3)
  handles, legend_labels = axes.flat[2].get_legend_handles_labels()
  if handles:
    axes.flat[2].legend(fontsize=7)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  fig.savefig(out_path, dpi=100)
  plt.close(fig)
  return out_path
