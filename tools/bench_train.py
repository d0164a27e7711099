"""Benchmark the trainer: per-phase step times, and the update's achieved FLOP/s vs matmul peak.

Table: docs/benchmarks.md, "Trainer: time per phase and the update's achieved FLOP/s
(`tools/bench_train.py`)" (and ``update_flops`` is the FLOP count of "One RL step end to end",
tools/bench_trl_report.py).

  .venv/bin/python tools/bench_train.py                # all parts
  .venv/bin/python tools/bench_train.py --skip_loop    # only the update FLOP/s part
  .venv/bin/python tools/bench_train.py --compute_dtype=bfloat16   # mixed precision throughout

1. Matmul peak (``harness.matmul_peak``): the best of several [n, n] @ [n, n] products (2 n^3
   FLOPs each) in the compute
   dtype (``--compute_dtype``: float32, or bfloat16 operands with float32 accumulation, as the
   mixed-precision model computes; ``model.compute_dtype``, float32 master weights).
2. The jitted train step (forward + backward + AdamW, GRPO objective) on random rollout batches of
   a few model sizes: FLOPs counted analytically (``update_flops``: matmuls of every layer on
   every token, attention scores and values, the unembedding on completion tokens only, backward
   = 2 x forward), time = median of repeated calls after compilation and one warm-up call
   (``harness.time_calls``). XLA's own cost analysis is
   printed too, but on CPU it counts a loop body (the scan over layers, the chunked log-prob loop)
   once, so it undercounts.
3. Per-phase times of real RL steps of the default experiment (sample / reward / update), read
   from a short run of ``experiments/default.py`` without the warm start.

It prints one JSON object (stdout holds nothing else); ``--json-out PATH`` writes it with the
environment record.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlvr_jax import model
from rlvr_jax.train import step as step_lib
from rlvr_jax.train.state import TrainBatch, init_state

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def update_flops(cfg, *, rows: int, seq_len: int, completion_len: int, prompt_group: int = 1):
  """Forward + backward FLOPs of one update (3 x forward; matmuls only, full attention).

  ``prompt_group`` G > 1 (rl.share_prompts): the rows / G prompts run once and each completion
  attends to its prompt and itself, so the FLOPs actually executed are counted."""
  d, f, n, k, h = (
    cfg.hidden_size,
    cfg.intermediate_size,
    cfg.num_heads,
    cfg.num_kv_heads,
    cfg.head_dim,
  )
  layer_params = d * n * h + 2 * d * k * h + n * h * d + 3 * d * f
  t, sp = completion_len, seq_len - completion_len
  if prompt_group > 1:
    tokens = rows // prompt_group * sp + rows * t
    scores = rows // prompt_group * sp * sp + rows * t * seq_len  # query x key pairs
  else:
    tokens, scores = rows * seq_len, rows * seq_len * seq_len
  forward = 2 * cfg.num_layers * layer_params * tokens
  forward += cfg.num_layers * 2 * (2 * scores * n * h)  # q.k and p.v
  forward += 2 * d * cfg.vocab_size * rows * completion_len  # unembedding (completion only)
  return 3.0 * forward


def bench_update(cfg, *, rows: int, prompt_len: int, completion_len: int, repeats: int = 5):
  params = model.init_params(cfg, jax.random.key(0))
  n_params = sum(x.size for x in jax.tree.leaves(params))
  opt = optax.adamw(1e-4)
  step = step_lib.make_train_step(
    model_config=cfg, optimizer=opt, objective="grpo", on_policy=True, chunk_size=64
  )
  rng = np.random.default_rng(0)
  prompt = rng.integers(3, cfg.vocab_size, (rows, prompt_len)).astype(np.int32)
  comp = rng.integers(3, cfg.vocab_size, (rows, completion_len)).astype(np.int32)
  tokens, positions = step_lib.sequence_inputs(
    prompt, np.ones_like(prompt, bool), jnp.asarray(comp)
  )
  cmask = jnp.ones((rows, completion_len), bool)
  adv = jnp.asarray(rng.normal(size=(rows, 1)).astype(np.float32)) * cmask
  zeros = jnp.zeros((rows, completion_len), jnp.float32)
  batch = TrainBatch(tokens, positions, cmask, adv, zeros, zeros, None, {})
  n_tok = float(rows * completion_len)
  state = init_state(params, opt, jax.random.key(1))
  args = (batch, n_tok, float(rows), jax.random.key(2))
  # make_train_step returns the jitted train_step bound to its static StepConfig: lower that.
  compiled = step.func.lower(state, *args, **step.keywords).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list | tuple) else cost
  flops = float(cost.get("flops", 0.0))
  holder = [state]

  def call():
    holder[0], metrics = step(holder[0], *args)
    return metrics

  t = harness.time_calls(call, warmup=1, repeats=repeats).median
  analytic = update_flops(cfg, rows=rows, seq_len=prompt_len + completion_len,
                          completion_len=completion_len)  # fmt: skip
  return {
    "params": n_params,
    "rows": rows,
    "seq_len": prompt_len + completion_len,
    "step_s": t,
    "flops": analytic,
    "xla_cost_analysis_flops": flops,
    "achieved_flops_per_s": analytic / t,
  }


def run_default_steps(steps: int, compute_dtype: str = "float32") -> dict:
  import importlib.util

  from rlvr_jax.metrics import read_jsonl
  from rlvr_jax.train.loop import Trainer

  spec = importlib.util.spec_from_file_location("default", "experiments/default.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  c.workdir = tempfile.mkdtemp(prefix="bench_train_")
  c.warm_start.num_steps = c.warm_start.clean_steps = 0
  c.rl.num_steps = steps
  c.model.compute_dtype = compute_dtype
  c.data.num_eval = 32
  c.checkpoint.every = 0
  c.logging.progress = c.logging.tensorboard = c.logging.plot = False
  trainer = Trainer(c, log=lambda s: None)
  try:
    trainer.run()
  finally:
    trainer.close()
  records = [r for r in read_jsonl(os.path.join(c.workdir, "metrics.jsonl")) if "time/step" in r]
  steady = records[2:]  # the first steps compile
  keys = ("time/step", "time/sample", "time/reward", "time/update", "reward/time_s")
  return {k: statistics.median(r[k] for r in steady) for k in keys if k in steady[0]} | {
    "first_step_s": records[0]["time/step"],
    "steps_measured": len(steady),
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--skip_loop", action="store_true")
  parser.add_argument("--loop_steps", type=int, default=12)
  parser.add_argument("--compute_dtype", default="float32", choices=("float32", "bfloat16"))
  harness.add_common_args(parser)
  args = parser.parse_args()
  env = harness.environment(packages=("optax",))
  dt = args.compute_dtype
  out = {"load_avg": os.getloadavg(), "devices": str(jax.devices()[0]), "compute_dtype": dt}
  out["matmul_peak_flops_per_s"] = max(harness.matmul_peak(1024, dtype=dt),
                                       harness.matmul_peak(2048, 3, dtype=dt))  # fmt: skip
  sizes = {
    "default tiny (D64 L2, B256 S13)": (
      model.ModelConfig.tiny(vocab_size=17, hidden_size=64, intermediate_size=256, num_layers=2,
                             num_heads=4, num_kv_heads=2, head_dim=16), 256, 8, 5),
    "small (D256 L4, B32 S128)": (
      model.ModelConfig.tiny(vocab_size=512, hidden_size=256, intermediate_size=1024,
                             num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64), 32, 64, 64),
  }  # fmt: skip
  for name, (cfg, rows, sp, t) in sizes.items():
    r = bench_update(cfg.replace(compute_dtype=dt), rows=rows, prompt_len=sp, completion_len=t)
    r["fraction_of_peak"] = r["achieved_flops_per_s"] / out["matmul_peak_flops_per_s"]
    out[name] = r
  if not args.skip_loop:
    out["default RL step phases (median s)"] = run_default_steps(args.loop_steps, dt)
  out["load_avg_after"] = os.getloadavg()
  print(json.dumps(out, indent=2))
  if args.json_out:
    harness.write_json(args.json_out, out, env)


if __name__ == "__main__":
  main()
