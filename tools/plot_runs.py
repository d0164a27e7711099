"""Plot one or several runs' curves to a PNG.

.venv/bin/python tools/plot_runs.py runs/default --out docs/img/default.png
.venv/bin/python tools/plot_runs.py runs/abl_grpo_s0 runs/abl_dapo_s0 --out runs/ablation.png
"""

from __future__ import annotations

import argparse

from rlvr_jax.train.plotting import plot_runs


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("runs", nargs="+", help="run directories (each with metrics.jsonl)")
  parser.add_argument("--out", required=True, help="output PNG path")
  parser.add_argument("--labels", nargs="*", default=None, help="one label per run")
  parser.add_argument("--smooth", type=int, default=5, help="moving-average window (train curves)")
  parser.add_argument("--title", default="")
  args = parser.parse_args()
  print(plot_runs(args.runs, args.out, labels=args.labels, smooth=args.smooth, title=args.title))


if __name__ == "__main__":
  main()
