"""The trainer's AdamW as ``OptimizerSpec.fused_apply`` against the optax chain it stands for,
interleaved calls in one process.

  .venv/bin/python tools/bench_optimizer.py                   # SmolLM2 shapes, bfloat16
  .venv/bin/python tools/bench_optimizer.py --model tiny --calls 2   # a quick check

Two jitted train steps on the same model (tools/bench_hugepages.py's update: GRPO, AdamW with
global-norm clip 1.0, remat, prompts shared per group), one with each optimiser path, on two
batch sizes: 1 group of 4 rows (the model's FLOPs are small, so the optimiser's passes over the
135M parameters dominate) and the TRL comparison's 4 groups (16 rows, 2 micro-batches). Calls
alternate between the two paths; the table gives the median and range of each, and the median
of the per-pair ratio chain / fused. Run it with the huge-page tunable in the environment to
measure what ``python -m rlvr_jax.main`` runs (``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``).
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
  parser.add_argument("--calls", type=int, default=6, help="timed calls per path and batch")
  args = parser.parse_args()
  print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()[0]:.2f}, "
        f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r}")  # fmt: skip
  print("| rows | optimiser path | median s (range) | chain / fused per pair (range) |")
  print("|---|---|---|---|")
  cfg = hp._model_config(args.model, args.dtype)
  for groups in (1, hp.PROMPTS):
    calls = {name: hp._update_call(cfg, fused=name == "fused", groups=groups)
             for name in ("chain", "fused")}  # fmt: skip
    times = {name: [] for name in calls}
    for call in calls.values():
      call()  # compiles
    for _ in range(args.calls):
      for name, call in calls.items():
        t0 = time.perf_counter()
        call()
        times[name].append(time.perf_counter() - t0)
    ratios = [a / b for a, b in zip(times["chain"], times["fused"], strict=True)]
    for name, ts in times.items():
      ratio = f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
      print(f"| {groups * hp.GROUP} | {name} | {statistics.median(ts):.3f} ({min(ts):.3f}-"
            f"{max(ts):.3f}) | {ratio if name == 'fused' else ''} |", flush=True)  # fmt: skip


if __name__ == "__main__":
  main()
