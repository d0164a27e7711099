"""Memory of one update (forward + backward + AdamW) at real shapes, from XLA's compiled analysis.

The trainer's jitted train step is lowered and compiled for abstract arguments (nothing is
allocated, no device is needed): a named Hugging Face config with random-weight shapes
(``rlvr_jax.model.config.HF_CONFIGS``), float32 master weights with bfloat16 compute and remat
(the accelerator setting), the AdamW of ``config.optim``, a GRPO loss, rows x tokens per row (the
prompt one eighth of each row) in micro-batches of at most ``--microbatch-tokens`` tokens.
``memory_analysis()`` gives the arguments (state and batch), the outputs (aliased to the donated
state) and the temporaries; the peak is at most arguments + outputs - aliased + temporaries.

XLA:CPU compiles what it would run on the CPU: on a GPU the fusions, the attention kernel (cuDNN
instead of the blockwise loop) and the scheduler differ, so the numbers are an estimate of the
GPU's (the accelerator bench measures the GPU's own peak).

    .venv/bin/python tools/update_memory.py                       # the table of docs/benchmarks.md
    .venv/bin/python tools/update_memory.py --shapes 1x32768 --attention blockwise
"""

from __future__ import annotations

import argparse
import json
import math
import time

import jax
import jax.numpy as jnp

from rlvr_jax import model
from rlvr_jax.model.config import HF_CONFIGS
from rlvr_jax.train import config as config_lib
from rlvr_jax.train import step as step_lib
from rlvr_jax.train.optimizer import OptimizerSpec
from rlvr_jax.train.state import TrainBatch, init_state

SHAPES = ((64, 1024), (8, 4096), (2, 16384), (1, 32768))
GB = 1e9


def abstract_batch(rows: int, tokens: int) -> TrainBatch:
  """A ``TrainBatch`` of ShapeDtypeStructs: rows x tokens, the last 7/8 of each row completion."""
  T = tokens - tokens // 8
  sds = jax.ShapeDtypeStruct
  per_token = sds((rows, T), jnp.float32)
  return TrainBatch(
    tokens=sds((rows, tokens), jnp.int32), positions=sds((rows, tokens), jnp.int32),
    completion_mask=sds((rows, T), jnp.bool_), advantages=per_token, old_logp=per_token,
    sampler_logp=per_token, ref_logp=None, extras={},
  )  # fmt: skip


def update_memory(
  model_name: str,
  rows: int,
  tokens: int,
  *,
  attention: str = "blockwise",
  microbatch_tokens: int = 32768,
  compute_dtype: str = "bfloat16",
  remat: bool = True,
) -> dict:
  """The compiled memory analysis of one update, in bytes, with the compile time."""
  cfg = model.ModelConfig.from_hf_dict(
    HF_CONFIGS[model_name], dtype="float32", compute_dtype=compute_dtype, remat=remat,
    attention=attention,
  )  # fmt: skip
  out = full_update_memory(cfg, rows, tokens, microbatch_tokens=microbatch_tokens)
  return dict(model=model_name, **out)


def num_microbatches_for(rows: int, tokens: int, microbatch_tokens: int) -> int:
  """The fewest micro-batches of at most ``microbatch_tokens`` tokens that divide the rows."""
  num_microbatches = max(1, math.ceil(rows * tokens / microbatch_tokens))
  while rows % num_microbatches:
    num_microbatches += 1
  return num_microbatches


def analysis_bytes(compiled) -> dict:
  """argument / output / alias / temporary bytes of a compiled program, and the peak bound
  arguments + outputs - aliased + temporaries."""
  analysis = compiled.memory_analysis()
  out = dict(
    argument_bytes=analysis.argument_size_in_bytes, output_bytes=analysis.output_size_in_bytes,
    alias_bytes=analysis.alias_size_in_bytes, temp_bytes=analysis.temp_size_in_bytes,
  )  # fmt: skip
  out["peak_bytes"] = (
    out["argument_bytes"] + out["output_bytes"] - out["alias_bytes"] + out["temp_bytes"]
  )
  return out


def full_update_memory(
  cfg: model.ModelConfig, rows: int, tokens: int, *, microbatch_tokens: int = 32768
) -> dict:
  """``update_memory`` for any model config: the trainer's train step (full fine-tuning, the
  params in ``cfg.dtype`` with AdamW moments of that dtype), lowered on abstract shapes."""
  optim = OptimizerSpec.from_config(config_lib.base_config().optim, decay_steps=1000)
  params = jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0)))
  state = jax.eval_shape(lambda p: init_state(p, optim, jax.random.key(1)), params)
  num_microbatches = num_microbatches_for(rows, tokens, microbatch_tokens)
  step = step_lib.make_train_step(
    model_config=cfg, optimizer=optim, objective="grpo", num_microbatches=num_microbatches,
    chunk_size=1024,
  )  # fmt: skip
  t0 = time.perf_counter()
  lowered = step.func.lower(
    state, abstract_batch(rows, tokens), 1.0, 1.0, jax.random.key(0), **step.keywords
  )
  compiled = lowered.compile()
  out = dict(
    rows=rows, tokens=tokens, attention=cfg.attention, num_microbatches=num_microbatches,
    compile_s=round(time.perf_counter() - t0, 1),
  )  # fmt: skip
  out.update(analysis_bytes(compiled))
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default="Qwen/Qwen2.5-1.5B", choices=sorted(HF_CONFIGS))
  parser.add_argument(
    "--shapes", default=",".join(f"{r}x{t}" for r, t in SHAPES), help="rows x tokens, ','"
  )
  parser.add_argument("--attention", default="xla,blockwise", help="implementations, ','")
  parser.add_argument("--microbatch-tokens", type=int, default=32768)
  parser.add_argument("--json-out", default="")
  args = parser.parse_args()
  results = []
  print(f"| {args.model}: rows x tokens | attention | micro-batches | temporaries GB | peak GB |")
  print("|---|---|---|---|---|")
  for shape in args.shapes.split(","):
    rows, tokens = (int(x) for x in shape.split("x"))
    for attention in args.attention.split(","):
      r = update_memory(
        args.model, rows, tokens, attention=attention, microbatch_tokens=args.microbatch_tokens
      )
      results.append(r)
      print(
        f"| {rows} x {tokens:,} | {attention} | {r['num_microbatches']} | "
        f"{r['temp_bytes'] / GB:.1f} | {r['peak_bytes'] / GB:.1f} |",
        flush=True,
      )
  if args.json_out:
    with open(args.json_out, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  main()
