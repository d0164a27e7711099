"""RL steps of full fine-tuning against LoRA on a real model: step times and peak memory.

Table: docs/results.md, "SmolLM2 with LoRA" (the step-time and memory rows).

Runs two experiment configs (default ``experiments/smollm2_learn.py``, full fine-tuning, and
``experiments/smollm2_lora.py``, rank-16 adapters, everything else the same) through the real
launcher, ``python -m rlvr_jax.main``, each in a fresh process under ``/usr/bin/time -v`` (its
peak RSS), alternating over ``--rounds`` rounds (full, lora, full, lora, ...), each run
``--steps`` RL steps with a tiny evaluation, in a fresh work folder and with the compilation
cache off. Per run it reads the trainer's ``time/rollout``, ``time/update`` and ``time/step`` of
the steps after the first (which compiles) from ``metrics.jsonl``. Printed: per config the median
(range) over all those steps, and the peak RSS (median over runs); the ratio lora / full of the
median update time per round.

The rollouts of the two differ after the first update (different weights sample different
lengths), so their rollout times are not a like-for-like comparison; the update (fixed shapes:
B rows x (prompt + max_new_tokens)) is.

  .venv/bin/python tools/bench_lora_steps.py --rounds 2 --steps 4 --json-out /tmp/lora_steps.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

PHASES = ("time/rollout", "time/update", "time/step")


def run_once(config: str, workdir: str, steps: int) -> dict:
  """One launcher run: {phase: [seconds per step after the first], max_rss_bytes, wall_s}."""
  cmd = [
    "/usr/bin/time", "-v", sys.executable, "-m", "rlvr_jax.main", f"--config={config}",
    f"--config.workdir={workdir}", f"--config.rl.num_steps={steps}", "--config.data.num_eval=4",
    "--config.eval.num_samples=1", "--config.compilation.cache_dir=off",
  ]  # fmt: skip
  env = harness.child_env({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, cwd=harness.ROOT, env=env, capture_output=True, text=True)
  wall = time.perf_counter() - t0
  if proc.returncode:
    raise RuntimeError(f"{config} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
  rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip()]
  steps_done = [r for r in records if "time/update" in r][1:]  # the first compiles
  return {
    **{p: [r[p] for r in steps_done] for p in PHASES},
    "max_rss_bytes": int(rss.group(1)) * 1024 if rss else None,
    "wall_s": wall,
  }


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--full", default="experiments/smollm2_learn.py")
  ap.add_argument("--lora", default="experiments/smollm2_lora.py")
  ap.add_argument("--steps", type=int, default=4, help="RL steps per run (the first compiles)")
  harness.add_common_args(ap, rounds=2)
  args = ap.parse_args()
  env = harness.environment()
  print(harness.header(env), flush=True)
  configs = {"full": args.full, "lora": args.lora}
  runs = {name: [] for name in configs}
  with tempfile.TemporaryDirectory(prefix="bench_lora_steps_") as tmp:
    for r in range(args.rounds):
      for name, config in configs.items():
        out = run_once(config, os.path.join(tmp, f"{name}_{r}"), args.steps)
        runs[name].append(out)
        print(f"round {r} {name}: update {[round(x, 1) for x in out['time/update']]} s, "
              f"peak RSS {out['max_rss_bytes'] / 2**30:.2f} GiB", flush=True)  # fmt: skip
  rows = []
  for name, rs in runs.items():
    cells = [name]
    for p in PHASES:
      cells.append(harness.spread_text([x for r in rs for x in r[p]], ".1f"))
    cells.append(f"{statistics.median(r['max_rss_bytes'] for r in rs) / 2**30:.2f}")
    rows.append(cells)
  per_round = [statistics.median(r["time/update"]) for r in runs["lora"]]
  ratio = harness.ratio_summary(per_round, [statistics.median(r["time/update"])
                                            for r in runs["full"]])  # fmt: skip
  print(harness.markdown_table(
    ["run", "rollout s", "update s", "RL step s", "peak RSS GiB"], rows))  # fmt: skip
  print(f"update time lora / full: {harness.ratio_text(ratio)}")
  if args.json_out:
    harness.write_json(
      args.json_out, {"runs": runs, "update_ratio": ratio, "args": vars(args)}, env
    )


if __name__ == "__main__":
  main()
