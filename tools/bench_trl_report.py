"""Summary and tables of tools/bench_trl.py's measurements (per-phase medians, ratios, FLOP/s)."""

from __future__ import annotations

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def update_flops_of(shapes) -> float:
  """Model FLOPs of one update: ``bench_train.update_flops`` summed over its minibatches, each
  (rows, sequence length, completion length[, prompt group])."""
  if HERE not in sys.path:
    sys.path.insert(0, HERE)
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
  ratios = {}
  for k in ("step", "generation", "reward", "update"):
    r = np.asarray([b[k] for b in m["trl"]]) / np.asarray([a[k] for a in m["ours"]])
    ratios[k] = {"median": float(np.median(r)), "min": float(r.min()), "max": float(r.max())}
  out["ratio_trl_over_ours"] = ratios
  return out


def markdown(report: dict) -> str:
  s = report["settings"]
  lines = [
    f"# bench_trl {report['date']}; load before {report['load_before']}, after "
    f"{report['load_after']}; {report['versions']}",
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
    r = np.asarray(d["ratio_dynamic_over_ours"])
    lines.append(
      f"| {dtype} | {d['batch']} | {d['new_tokens']} | {d['tokens_per_s']['ours']:.0f} | "
      f"{d['tokens_per_s']['dyn']:.0f} | {np.median(r):.2f}x ({r.min():.2f}-{r.max():.2f}) |"
    )
  return "\n".join(lines) + "\n"
