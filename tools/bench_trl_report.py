"""Summary and tables of tools/bench_trl.py's measurements (per-phase medians, ratios, FLOP/s).

Tables: docs/benchmarks.md, "One RL step end to end: rlvr_jax vs TRL's GRPOTrainer
(`tools/bench_trl.py`)"; not run on its own (``markdown`` renders a bench_trl.json document:
``HF_HUB_OFFLINE=1 .venv/bin/python tools/bench_trl.py --out-dir /tmp/bench_trl`` writes both).
"""

from __future__ import annotations

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402


def update_flops_of(shapes) -> float:
  """Model FLOPs of one update: ``bench_train.update_flops`` summed over its minibatches, each
  (rows, sequence length, completion length[, prompt group])."""
  from bench_train import update_flops

  from rlvr_jax.model import ModelConfig
  from rlvr_jax.model.smollm2 import SMOLLM2_SHAPES

  cfg = ModelConfig.tiny(**SMOLLM2_SHAPES)
  return sum(
    update_flops(cfg, rows=b, seq_len=s, completion_len=t, prompt_group=group[0] if group else 1)
    for b, s, t, *group in shapes
  )


def summarise(result: dict) -> dict:
  """Per side: median phase times and FLOP/s; per round: the ratios TRL / ours."""
  out = {}
  m = result["measured"]
  for side, recs in m.items():
    med = {k: float(np.median([r[k] for r in recs])) for k in ("step", "generation", "reward")}
    med["update"] = float(np.median([r["update"] for r in recs]))
    med["rest"] = float(
      np.median([r["step"] - r["generation"] - r["reward"] - r["update"] for r in recs])
    )
    flops = [update_flops_of(r["shapes"]) / r["update"] for r in recs]
    peak = result["matmul_peak_flops_per_s"][side]
    med["update_flops_per_s"] = float(np.median(flops))
    med["matmul_peak_flops_per_s"] = peak
    med["fraction_of_peak"] = med["update_flops_per_s"] / peak
    med["mean_completion_tokens"] = float(
      np.mean([r["completion_tokens"] / r["rows"] for r in recs])
    )
    out[side] = med
  out["ratio_trl_over_ours"] = {
    k: harness.ratio_summary([b[k] for b in m["trl"]], [a[k] for a in m["ours"]])
    for k in ("step", "generation", "reward", "update")
  }
  return out


def markdown(report: dict) -> str:
  """The tables of a bench_trl.json document (``harness.document``: the environment record and
  tools/bench_trl.py's results)."""
  s, env = report["settings"], report["environment"]
  versions = ", ".join(f"{k} {v}" for k, v in env["packages"].items() if k != "numpy")
  load_before = " ".join(f"{x:.2f}" for x in env["machine"]["load_avg"])
  lines = [
    f"# bench_trl {env['date_utc']}; load before {load_before}, after "
    f"{report['load_after']}; {versions}",
    f"P = {s['prompts_per_step']} prompts x G = {s['group_size']}, T = {s['max_new_tokens']} new "
    f"tokens, M = {s['num_microbatches']} micro-batches; warm-up {report['warmup']}, "
    f"{report['rounds']} rounds",
    "",
    "| precision | trainer | step s | generation s | reward s | update s | rest s | "
    "TRL / ours step (range) | update GFLOP/s | matmul peak GFLOP/s | fraction | mean completion tokens |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for dtype, res in report["precisions"].items():
    if "skipped" in res:
      lines.append(f"| {dtype} | - | skipped: {res['skipped']} | | | | | | | | | |")
      continue
    summ = res["summary"]
    r = summ["ratio_trl_over_ours"]["step"]
    for side, name in (("ours", "rlvr_jax"), ("trl", "TRL GRPOTrainer")):
      d = summ[side]
      ratio = f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})" if side == "trl" else "1.00x"
      lines.append(
        f"| {dtype} | {name} | {d['step']:.2f} | {d['generation']:.2f} | {d['reward']:.2f} | "
        f"{d['update']:.2f} | {d['rest']:.2f} | {ratio} | {d['update_flops_per_s'] / 1e9:.1f} | "
        f"{d['matmul_peak_flops_per_s'] / 1e9:.1f} | {d['fraction_of_peak']:.2f} | "
        f"{d['mean_completion_tokens']:.1f} |"
      )
  lines += ["", "| precision | batch | new tokens | ours tok/s | transformers generate tok/s | "
            "speed-up: transformers wall / ours wall (range) |", "|---|---|---|---|---|---|"]  # fmt: skip
  for dtype, d in report["decode"].items():
    if "error" in d:
      lines.append(f"| {dtype} | | | failed: {d['error']} | | |")
      continue
    r = harness.ratio_summary(d["walls_s"]["dyn"], d["walls_s"]["ours"])
    lines.append(
      f"| {dtype} | {d['batch']} | {d['new_tokens']} | {d['tokens_per_s']['ours']:.0f} | "
      f"{d['tokens_per_s']['dyn']:.0f} | {harness.ratio_text(r)} |"
    )
  return "\n".join(lines) + "\n"
