"""Where a decode step's time goes: our step vs its matmul-only and weight-streaming floors.

For a model config (default: SmolLM2-135M's shapes with random weights; the timing does not depend
on the values) and each batch size, one process measures, best of ``--repeats``:

  * step: ``sampling.decode_step`` in a host loop, unstacked weights, a cache of ``--prompt`` +
    ``--new-tokens`` slots (every slot attended, as in ``generate``'s loop);
  * matmul floor: one jitted chain of the step's weight matmuls alone (per layer q, k, v, o, gate,
    up, down, then the unembedding), same shapes, nothing else;
  * weight read: one pass over all weights (``jnp.sum`` of every parameter array), the
    memory-bandwidth floor of a step that streams the weights once.

step - matmul floor bounds what attention over the cache, norms, RoPE and the cache writes cost.
(Replacing the attention by a stand-in to time the rest is not reliable: XLA then lays out the
output projection differently, and at batch 64 that "step without attention" was slower.)

Usage (idle machine; record ``uptime``):
  .venv/bin/python tools/bench_decode_floor.py --batch-sizes 8,32,64
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from rlvr_jax.model import ModelConfig, init_params, unstack_layers  # noqa: E402
from rlvr_jax.model.smollm2 import SMOLLM2_SHAPES  # noqa: E402
from rlvr_jax.sampling import decode_step, prefill  # noqa: E402


def best(fn, repeats: int) -> float:
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return min(times)


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
  args = parser.parse_args()
  config = ModelConfig.tiny(**SMOLLM2_SHAPES, max_position_embeddings=2048)
  params = init_params(config, jax.random.key(0))
  mb = sum(a.nbytes for a in jax.tree.leaves(params)) / 1e6
  print(
    f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; jax {jax.__version__}; {mb:.0f} MB"
  )
  print("# load before:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
  read = weight_read_ms(params, args.repeats)
  print(f"# weight read: {read:.1f} ms ({mb / read:.1f} GB/s)")
  print("| batch | step ms | matmul floor ms | step - floor ms | weight read ms |")
  print("|---|---|---|---|---|")
  for batch in [int(b) for b in args.batch_sizes.split(",")]:
    full = step_ms(params, config, batch, args.prompt, args.new_tokens, args.repeats)
    floor = matmul_floor_ms(params, config, batch, args.repeats)
    print(f"| {batch} | {full:.1f} | {floor:.1f} | {full - floor:.1f} | {read:.1f} |", flush=True)
  print("# load after:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
  main()
