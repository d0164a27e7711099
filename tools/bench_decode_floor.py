"""Where a decode step's time goes: our step vs its matmul-only and weight-streaming floors.

Table: docs/benchmarks.md, "Where a decode step's time goes (`tools/bench_decode_floor.py`)".

For a model config (default: SmolLM2-135M's shapes with random weights; the timing does not depend
on the values) and each batch size, one process measures, best of ``--repeats`` after a warm-up
call (``harness.time_calls``):

  * step: ``sampling.decode_step`` in a host loop, unstacked weights, a cache of ``--prompt`` +
    ``--new-tokens`` slots (every slot attended, as in ``generate``'s loop);
  * matmul floor: one jitted chain of the step's weight matmuls alone (per layer q, k, v, o, gate,
    up, down, then the unembedding), same shapes, nothing else;
  * weight read: one pass over all weights (``jnp.sum`` of every parameter array), the
    memory-bandwidth floor of a step that streams the weights once.

step - matmul floor bounds what attention over the cache, norms, RoPE and the cache writes cost.
(Replacing the attention by a stand-in to time the rest is not reliable: XLA then lays out the
output projection differently, and at batch 64 that "step without attention" was slower.)

Usage (idle machine; the environment record is printed first; ``--json-out PATH`` writes it with
the rows):
  .venv/bin/python tools/bench_decode_floor.py --batch-sizes 8,32,64
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from rlvr_jax.model import ModelConfig, init_params, unstack_layers  # noqa: E402
from rlvr_jax.model.smollm2 import SMOLLM2_SHAPES  # noqa: E402
from rlvr_jax.sampling import decode_step, prefill  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def best(fn, repeats: int) -> float:
  """The fastest of ``repeats`` calls after a warm-up one."""
  return harness.time_calls(fn, warmup=1, repeats=repeats).min


def step_ms(params, config, batch, prompt, new_tokens, repeats, steps=8) -> float:
  tokens = np.full((batch, prompt), 3, np.int32)
  logits, cache, pos = prefill(
    params, tokens, np.ones_like(tokens, bool), config=config, cache_len=prompt + new_tokens
  )
  per_layer = unstack_layers(params, config)
  tok = jnp.zeros((batch,), jnp.int32)
  state = {"cache": cache}

  def run():
    logits = None
    for i in range(steps):
      logits, state["cache"] = decode_step(per_layer, state["cache"], tok, pos + i, config=config)
    return logits

  return 1e3 * best(run, repeats) / steps


def matmul_floor_ms(params, config, batch, repeats) -> float:
  c = config
  per_layer = unstack_layers(params, config)["layers"]
  mats = [
    (
      lp["wq"].reshape(c.hidden_size, -1),
      lp["wk"].reshape(c.hidden_size, -1),
      lp["wv"].reshape(c.hidden_size, -1),
      lp["wo"].reshape(-1, c.hidden_size),
      lp["w_gate"],
      lp["w_up"],
      lp["w_down"],
    )
    for lp in per_layer
  ]

  @jax.jit
  def chain(x, mats, embed):
    for wq, wk, wv, wo, wg, wu, wd in mats:
      q, k, v = x @ wq, x @ wk, x @ wv
      x = x + q @ wo + 1e-9 * (k.sum() + v.sum())
      x = x + (jax.nn.silu(x @ wg) * (x @ wu)) @ wd
    return jnp.einsum("bd,vd->bv", x, embed)

  x = jnp.ones((batch, c.hidden_size), jnp.float32)
  return 1e3 * best(lambda: chain(x, mats, params["embed"]), repeats)


def weight_read_ms(params, repeats) -> float:
  total = jax.jit(lambda p: sum(jnp.sum(a) for a in jax.tree.leaves(p)))
  return 1e3 * best(lambda: total(params), repeats)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch-sizes", default="8,32,64")
  parser.add_argument("--prompt", type=int, default=48)
  parser.add_argument("--new-tokens", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=5)
  harness.add_common_args(parser)
  args = parser.parse_args()
  config = ModelConfig.tiny(**SMOLLM2_SHAPES, max_position_embeddings=2048)
  params = init_params(config, jax.random.key(0))
  mb = sum(a.nbytes for a in jax.tree.leaves(params)) / 1e6
  env = harness.environment()
  print(harness.header(env, f"{mb:.0f} MB of weights"))
  read = weight_read_ms(params, args.repeats)
  print(f"# weight read: {read:.1f} ms ({mb / read:.1f} GB/s)")
  print("| batch | step ms | matmul floor ms | step - floor ms | weight read ms |")
  print("|---|---|---|---|---|")
  rows = []
  for batch in [int(b) for b in args.batch_sizes.split(",")]:
    full = step_ms(params, config, batch, args.prompt, args.new_tokens, args.repeats)
    floor = matmul_floor_ms(params, config, batch, args.repeats)
    print(f"| {batch} | {full:.1f} | {floor:.1f} | {full - floor:.1f} | {read:.1f} |", flush=True)
    rows.append({"batch": batch, "step_ms": full, "matmul_floor_ms": floor, "weight_read_ms": read})
  print(f"# load after: {harness.load_text()}")
  if args.json_out:
    harness.write_json(args.json_out, {"settings": vars(args), "weights_mb": mb, "rows": rows}, env)


if __name__ == "__main__":
  main()
