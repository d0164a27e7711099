"""The trainer's AdamW as ``OptimizerSpec.fused_apply`` against the optax chain it stands for,
separate processes alternated.

Table: docs/benchmarks.md, "Optimizer: fused AdamW against the optax chain
(`tools/bench_optimizer.py`)".

  .venv/bin/python tools/bench_optimizer.py                   # SmolLM2 shapes, bfloat16
  .venv/bin/python tools/bench_optimizer.py --model tiny --rounds 1 --calls 2   # a quick check

Each round starts one child process per optimiser path, alternately (chain, fused, chain, ...;
``harness.alternate``), with the launcher's malloc tunables (``rlvr_jax.host_memory``'s default)
as ``python -m rlvr_jax.main`` runs. A child times ``--calls`` calls, after ``--warmup``
compiling ones, of one jitted train step (GRPO, AdamW with global-norm clip 1.0, remat, prompts
shared per group: 63-token prompts, 64 completion tokens) on a randomly initialised model. Two
batch sizes: 1 group of 4 rows (the model's FLOPs are small, so the optimiser's passes over the
135M parameters dominate) and the TRL comparison's 4 groups (16 rows, 2 micro-batches). The table
gives per path the median and range of all its calls, and per round the ratio of the children's
medians, chain / fused.

Why processes, not one process alternating two compiled steps: with two SmolLM2 train states
and two executables in one process the timings disagreed with separate processes (session 11:
1.00x and 1.46x in one process where separate processes gave 1.03-1.08x), the allocator's state
of one path leaking into the other's calls.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

PROMPTS, PROMPT_LEN, GROUP, NEW_TOKENS = 4, 63, 4, 64
PATHS = {"chain": False, "fused": True}  # the table's name -> fused


def update_call(model_name: str, dtype: str, *, fused: bool, groups: int, chunk_size: int = 128):
  """A function that runs one jitted train step on ``groups`` prompts x GROUP samples, the
  prompt shared per group (log-prob token tiles of ``chunk_size``): the trainer's optimiser
  (``OptimizerSpec``, whose update runs as ``fused_apply``) or, ``fused=False``, the optax chain
  it stands for (``update`` + ``apply_updates``)."""
  import jax
  import jax.numpy as jnp
  import ml_collections
  import numpy as np

  from rlvr_jax import model
  from rlvr_jax.model.smollm2 import SMOLLM2_SHAPES
  from rlvr_jax.train import step as step_lib
  from rlvr_jax.train.optimizer import OptimizerSpec
  from rlvr_jax.train.state import TrainBatch, init_state

  shapes = SMOLLM2_SHAPES if model_name == "smollm2" else {}
  cfg = model.ModelConfig.tiny(**shapes, compute_dtype=dtype, remat=True)
  optim = ml_collections.ConfigDict(
    dict(learning_rate=2e-6, schedule="constant", warmup_steps=0, final_lr_fraction=0.1, b1=0.9,
         b2=0.99, eps=1e-8, weight_decay=0.0, grad_clip=1.0)
  )  # fmt: skip
  opt = OptimizerSpec.from_config(optim, decay_steps=1)
  opt = opt if fused else opt.transformation
  step = step_lib.make_train_step(
    model_config=cfg, optimizer=opt, objective="grpo", on_policy=True,
    num_microbatches=min(2, groups), prompt_group=GROUP, chunk_size=chunk_size,
  )  # fmt: skip
  rows = groups * GROUP
  rng = np.random.default_rng(0)
  prompt = rng.integers(3, cfg.vocab_size, (groups, PROMPT_LEN)).astype(np.int32)
  prompt = np.repeat(prompt, GROUP, axis=0)
  completion = jnp.asarray(rng.integers(3, cfg.vocab_size, (rows, NEW_TOKENS)).astype(np.int32))
  tokens, positions = step_lib.sequence_inputs(prompt, np.ones_like(prompt, bool), completion)
  mask = jnp.ones((rows, NEW_TOKENS), bool)
  advantages = jnp.asarray(rng.normal(size=(rows, 1)).astype(np.float32)) * mask
  zeros = jnp.zeros((rows, NEW_TOKENS), jnp.float32)
  batch = TrainBatch(tokens, positions, mask, advantages, zeros, zeros, None, {})
  state = [init_state(model.init_params(cfg, jax.random.key(0)), opt, jax.random.key(1))]

  def call():
    state[0], metrics = step(
      state[0], batch, float(rows * NEW_TOKENS), float(rows), jax.random.key(2)
    )
    return metrics

  return call


def child(*, path: str, model: str, dtype: str, groups: int, warmup: int, calls: int) -> dict:
  """In a child process: ``--calls`` timed calls of one path's train step after ``--warmup``."""
  from rlvr_jax import host_memory

  host_memory.configure_jax()  # what rlvr_jax.main does under RLVR_JAX_MALLOC
  call = update_call(model, dtype, fused=PATHS[path], groups=groups)
  return harness.time_calls(call, warmup=warmup, repeats=calls).to_dict()


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", default="smollm2", choices=("smollm2", "tiny"))
  parser.add_argument("--dtype", default="bfloat16")
  parser.add_argument("--calls", type=int, default=4, help="timed calls per child process")
  harness.add_common_args(parser, rounds=2, warmup=1)
  args = parser.parse_args()
  from rlvr_jax import host_memory

  env = harness.environment(devices="subprocess")
  print(harness.header(env))
  malloc = {"GLIBC_TUNABLES": host_memory.TUNABLE, host_memory.SETTING: host_memory.DEFAULT}
  print(harness.table_header(["rows", "optimiser path", "median s (range)",
                              "chain / fused per round"]))  # fmt: skip
  rows = []
  for groups in (1, PROMPTS):
    kwargs = dict(model=args.model, dtype=args.dtype, groups=groups, warmup=args.warmup,
                  calls=args.calls)  # fmt: skip
    children = {p: harness.Child("tools/bench_optimizer.py:child", dict(kwargs, path=p), malloc)
                for p in PATHS}  # fmt: skip
    res = harness.alternate(children, rounds=args.rounds)
    ratio = harness.ratio_summary(harness.round_medians(res["chain"]),
                                  harness.round_medians(res["fused"]))  # fmt: skip
    for path, runs in res.items():
      times = [t for run in runs for t in run["samples"]]
      ratios = " ".join(f"{r:.3f}" for r in ratio["ratios"]) if path == "fused" else ""
      print(harness.table_row([groups * GROUP, path, harness.spread_text(times), ratios]),
            flush=True)  # fmt: skip
    rows.append({"rows": groups * GROUP, "runs": res, "chain_over_fused": ratio})
  if args.json_out:
    harness.write_json(args.json_out, {"settings": vars(args), "rows": rows}, env)


if __name__ == "__main__":
  main()
