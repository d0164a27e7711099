"""Rollouts that branch against GRPO at equal sampled tokens, on the default task.

Table: docs/results.md, "Rollouts that branch against GRPO at equal sampled tokens".

Every method samples more (or fewer) tokens per step than GRPO's G rows per prompt: SPO-chain
continues prefixes, SPO-tree shares them, LATR runs lookahead windows, the retry round of
Reflect-then-Retry continues failed rows, GHPO samples hinted groups again. So a method is
compared with GRPO at the same number of *sampled tokens* (the trainer's
``rollout/sampled_tokens``, summed over the run), not at the same number of steps:

  1. each method runs ``--steps`` RL steps of ``--config`` (default ``experiments/default.py``;
     its overrides in ``METHODS``, ``--set`` ones for every run), one launcher process each
     (``python -m rlvr_jax.main``), one after another;
  2. GRPO runs ``--grpo-factor`` times as many steps with an evaluation every ``--eval-every``
     steps: its held-out accuracy as a curve over its cumulative sampled tokens;
  3. per method: its final held-out greedy accuracy and pass@1, against GRPO's curve read (linear
     interpolation between evaluations) at the method's total sampled tokens; its wall time of RL
     and the share of it spent sampling (``time/sample`` + the extra rounds' ``time/branch``,
     ``time/retry``; medians over the steps after the first), with tokens per step against
     GRPO's.

GHPO needs a reference solution the bare task lacks (its whole solution is the answer): it runs
on the worked style (``data.task.style="worked"``, the hint = the first quarter/half/three
quarters of the column working's tokens) against its own GRPO curve on that style
(``grpo_worked``).

  .venv/bin/python tools/bench_branching.py --steps 100 --json-out /tmp/branching.json
  .venv/bin/python tools/bench_branching.py --config experiments/smollm2_learn.py \
      --methods latr,r3l --steps 20 --grpo-factor 1.5 --eval-every 10 --set data.num_eval=100
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

WORKED = {
  "tokenizer.alphabet": "0123456789+-*=>",
  "data.task.style": "worked",
  "sampling.max_new_tokens": 10,
}
# name -> (launcher overrides, the GRPO run it is compared with)
METHODS = {
  "grpo": ({}, None),
  "spo_chain": ({"rl.advantage": "spo_chain", "spo.cutpoint_interval": 1}, "grpo"),
  "spo_tree": (
    {"rl.advantage": "spo_tree", "spo.tree_branching": "(2,2,2)", "spo.tree_segment_tokens": 2},
    "grpo",
  ),
  "latr": ({"latr.enabled": True}, "grpo"),
  "r3l": ({"rl.advantage": "r3l"}, "grpo"),
  "grpo_worked": (WORKED, None),
  "ghpo": (
    {
      **WORKED,
      "hints.enabled": True,
      "hints.field": "demonstration",
      "hints.unit": "tokens",
      "hints.marker": "",
    },  # fmt: skip
    "grpo_worked",
  ),
}
SAMPLING_TIMES = ("time/sample", "time/branch", "time/retry")


def load(workdir: str) -> dict:
  """A finished run's metrics rows and summary."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  with open(os.path.join(workdir, "summary.json")) as f:
    return {"rows": rows, "summary": json.load(f)}


def run_once(
  name: str, workdir: str, steps: int, eval_every: int, seed: int, config: str, extra: list
) -> dict:
  """One launcher run; returns its metrics rows and summary."""
  overrides, _ = METHODS[name]
  cmd = [
    sys.executable, "-m", "rlvr_jax.main", f"--config={config}", *(f"--config.{x}" for x in extra),
    f"--config.workdir={workdir}", f"--config.rl.num_steps={steps}", f"--config.seed={seed}",
    f"--config.eval.every={eval_every}", "--config.checkpoint.every=0",
    "--config.logging.plot=False", "--config.logging.progress=False",
    *(f"--config.{k}={v}" for k, v in overrides.items()),
  ]  # fmt: skip
  env = harness.child_env({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
  shutil.rmtree(workdir, ignore_errors=True)  # a finished run in it would be read, not redone
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, cwd=harness.ROOT, env=env, capture_output=True, text=True)
  if proc.returncode:
    raise RuntimeError(f"{name} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
  return {**load(workdir), "wall_s": time.perf_counter() - t0}


def curve(run: dict) -> dict:
  """Cumulative sampled tokens at each evaluation, with its greedy accuracy and pass@1."""
  tokens, total, out = {}, 0.0, {"tokens": [], "accuracy": [], "pass@1": [], "se": []}
  for r in run["rows"]:
    if "rollout/sampled_tokens" in r:
      total += r["rollout/sampled_tokens"]
      tokens[r["step"]] = total
  for r in run["rows"]:
    if "eval/accuracy" in r:
      out["tokens"].append(tokens.get(r["step"], 0.0))
      out["accuracy"].append(r["eval/accuracy"])
      out["pass@1"].append(r["eval/pass@1"])
      out["se"].append(r["eval/accuracy_se"])
  return out


def costs(run: dict) -> dict:
  steps = [r for r in run["rows"] if "time/step" in r][1:]  # the first compiles
  # Medians: a new fork count or prompt width compiles the sampler once, within a few steps;
  # means over the steps after the 10th (rare extra rounds, e.g. GHPO's, count in full).
  per = lambda k: float(np.median([r.get(k, 0.0) for r in steps]))  # noqa: E731
  late = lambda k: float(np.mean([r.get(k, 0.0) for r in steps[9:]]))  # noqa: E731
  return {
    "rl_time_s": run["summary"]["rl_time_s"],
    "step_s": per("time/step"),
    "sampling_s": sum(per(k) for k in SAMPLING_TIMES),
    "step_s_mean": late("time/step"),
    "sampling_s_mean": sum(late(k) for k in SAMPLING_TIMES),
    "tokens_per_step": float(
      np.mean([r["rollout/sampled_tokens"] for r in run["rows"] if "rollout/sampled_tokens" in r])
    ),  # fmt: skip
  }


def plot(table: dict, path: str, *, title: str) -> None:
  """Held-out greedy accuracy over cumulative sampled tokens, one line per run."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 4))
  for n, r in table.items():
    c = r["curve"]
    style = "--" if METHODS[n][1] is None else "-"
    ax.plot(np.asarray(c["tokens"]) / 1e3, c["accuracy"], style, marker=".", label=n)
  ax.set_xlabel("sampled tokens (thousands)")
  ax.set_ylabel("held-out greedy accuracy")
  ax.set_title(title)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--config", default="experiments/default.py")
  ap.add_argument("--set", action="append", default=[], help="field=value for every run")
  ap.add_argument("--steps", type=int, default=100)
  ap.add_argument("--grpo-factor", type=float, default=2.5)
  ap.add_argument("--eval-every", type=int, default=10)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--methods", default=",".join(METHODS))
  ap.add_argument("--workdir", default="runs/bench_branching")
  ap.add_argument("--json-out", default="")
  ap.add_argument("--plot", default="", help="a PNG of held-out greedy accuracy over tokens")
  ap.add_argument("--report-only", action="store_true", help="read the runs in --workdir again")
  ap.add_argument("--reuse", default="", help="comma-separated runs to read from --workdir")
  a = ap.parse_args()
  names = a.methods.split(",")
  for n in names:  # the GRPO runs first: every method is read against one
    base = METHODS[n][1]
    if base and base not in names:
      names.insert(0, base)
  order = [n for n in names if METHODS[n][1] is None] + [n for n in names if METHODS[n][1]]
  runs = {}
  for n in order:
    steps = int(round(a.steps * a.grpo_factor)) if METHODS[n][1] is None else a.steps
    workdir = os.path.join(a.workdir, f"{n}_s{a.seed}")
    if a.report_only or n in a.reuse.split(","):
      runs[n] = load(workdir)
      continue
    print(f"{n}: {steps} steps ...", flush=True)
    runs[n] = run_once(n, workdir, steps, a.eval_every, a.seed, a.config, a.set)
  table = {}
  for n in order:
    c, k = curve(runs[n]), costs(runs[n])
    row = {"accuracy": c["accuracy"][-1], "accuracy_se": c["se"][-1], "pass@1": c["pass@1"][-1],
           "tokens": c["tokens"][-1], **k}  # fmt: skip
    base = METHODS[n][1]
    if base:
      b = curve(runs[base])
      row["grpo_accuracy_at_tokens"] = float(np.interp(row["tokens"], b["tokens"], b["accuracy"]))
      row["grpo_pass@1_at_tokens"] = float(np.interp(row["tokens"], b["tokens"], b["pass@1"]))
      row["grpo_tokens_per_step"] = costs(runs[base])["tokens_per_step"]
      row["within_grpo_curve"] = bool(row["tokens"] <= b["tokens"][-1])
    row["curve"] = c
    table[n] = row
  print("| method | tokens / step (GRPO) | steps | sampled tokens | greedy | GRPO greedy at those "
        "tokens | pass@1 | GRPO pass@1 | step ms, median / mean (GRPO) | sampling ms, median / "
        "mean |")  # fmt: skip
  print("|---|---|---|---|---|---|---|---|---|---|")
  ms = lambda r, k: f"{1e3 * r[k]:.0f} / {1e3 * r[k + '_mean']:.0f}"  # noqa: E731
  for n in order:
    r = table[n]
    base = METHODS[n][1]
    steps = len([x for x in runs[n]["rows"] if "time/step" in x])
    if base:
      print(f"| {n} | {r['tokens_per_step']:.0f} ({r['grpo_tokens_per_step']:.0f}) | {steps} | "
            f"{r['tokens']:.0f} | {r['accuracy']:.3f} ± {r['accuracy_se']:.3f} | "
            f"{r['grpo_accuracy_at_tokens']:.3f} | {r['pass@1']:.3f} | "
            f"{r['grpo_pass@1_at_tokens']:.3f} | {ms(r, 'step_s')} ({ms(table[base], 'step_s')})"
            f" | {ms(r, 'sampling_s')} |")  # fmt: skip
    else:
      print(f"| {n} | {r['tokens_per_step']:.0f} | {steps} | {r['tokens']:.0f} | "
            f"{r['accuracy']:.3f} ± {r['accuracy_se']:.3f} | - | {r['pass@1']:.3f} | - | "
            f"{ms(r, 'step_s')} | {ms(r, 'sampling_s')} |")  # fmt: skip
  if a.plot:
    plot(table, a.plot, title=f"{os.path.basename(a.config)}, seed {a.seed}")
  if a.json_out:
    with open(a.json_out, "w") as f:
      json.dump({"args": vars(a), "table": table}, f, indent=1)


if __name__ == "__main__":
  main()
