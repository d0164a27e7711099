"""The trainer's AdamW as ``OptimizerSpec.fused_apply`` against the optax chain it stands for,
separate processes alternated.

  .venv/bin/python tools/bench_optimizer.py                   # SmolLM2 shapes, bfloat16
  .venv/bin/python tools/bench_optimizer.py --model tiny --rounds 1 --calls 2   # a quick check

Each round starts one child process per optimiser path, alternately (chain, fused, chain, ...).
A child times ``--calls`` calls, after a compiling one, of one jitted train step
(tools/bench_hugepages.py's update: GRPO, AdamW with global-norm clip 1.0, remat, prompts shared
per group) on a randomly initialised model, with malloc huge pages on as ``python -m
rlvr_jax.main`` runs. Two batch sizes: 1 group of 4 rows (the model's FLOPs are small, so the
optimiser's passes over the 135M parameters dominate) and the TRL comparison's 4 groups (16 rows,
2 micro-batches). The table gives per path the median and range of all its calls, and per round
the ratio of the children's medians, chain / fused.

Why processes, not one process alternating two compiled steps: with two SmolLM2 train states
and two executables in one process the timings disagreed with separate processes (session 11:
1.00x and 1.46x in one process where separate processes gave 1.03-1.08x), the allocator's state
of one path leaking into the other's calls.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_hugepages as hp  # noqa: E402


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", default="smollm2", choices=("smollm2", "tiny"))
  parser.add_argument("--dtype", default="bfloat16")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--calls", type=int, default=4, help="timed calls per child process")
  args = parser.parse_args()
  print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()[0]:.2f}")
  print("| rows | optimiser path | median s (range) | chain / fused per round |")
  print("|---|---|---|---|")
  for groups in (1, hp.PROMPTS):
    child_args = argparse.Namespace(**vars(args), groups=groups)
    res = {"update_chain": [], "update": []}
    for _ in range(args.rounds):
      for what in res:
        res[what].append(hp.run_child(what, "on", child_args)["times"])
    ratios = [
      statistics.median(a) / statistics.median(b)
      for a, b in zip(res["update_chain"], res["update"], strict=True)
    ]
    for what, runs in res.items():
      times = [t for run in runs for t in run]
      name = "fused" if what == "update" else "chain"
      ratio = " ".join(f"{r:.3f}" for r in ratios) if name == "fused" else ""
      print(f"| {groups * hp.GROUP} | {name} | {statistics.median(times):.3f} ({min(times):.3f}-"
            f"{max(times):.3f}) | {ratio} |", flush=True)  # fmt: skip


if __name__ == "__main__":
  main()
