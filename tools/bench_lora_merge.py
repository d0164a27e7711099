"""Sampling with LoRA: merge once per RL step, or decode unmerged? The costs side by side.

Table: docs/design.md, "LoRA and a quantized base" (the merged-sampling bullet).

The sampler reads base + (alpha / r) A B merged once per RL step (``lora.merge``). The
alternative, decoding with the adapters unmerged, adds to every projection of every decode step
the two low-rank products x A and (x A) B: 2 r (d_in + d_out) FLOPs per token against the base's
2 d_in d_out, and reads A and B at every step. This tool measures, on SmolLM2-135M-Instruct with
rank-r adapters on all seven projections:

  * ``merge``: one jitted ``lora.merge`` of the whole tree (median of ``--rounds``);
  * ``decode step``: ``sampling.generate`` of B rows x T new tokens (no stop) on the merged
    params, divided by T;

and prints the merge in decode steps (how many steps the unmerged decoder would have to be
cheaper by a whole step to win back), beside the unmerged decoder's extra FLOPs per step
(computed, not measured: the cached decoder refuses attached adapters).

  .venv/bin/python tools/bench_lora_merge.py --rank 16 --rows 32 --new-tokens 64 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from rlvr_jax import sampling  # noqa: E402
from rlvr_jax.model import load_smollm2, lora  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def extra_flops_fraction(config, rank: int) -> float:
  """Unmerged decoding's extra matmul FLOPs per token over the base's, all seven projections."""
  D, F = config.hidden_size, config.intermediate_size
  q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
  shapes = [(D, q), (D, kv), (D, kv), (q, D), (D, F), (D, F), (F, D)]
  base = sum(i * o for i, o in shapes) * config.num_layers + D * config.vocab_size
  extra = sum(rank * (i + o) for i, o in shapes) * config.num_layers
  return extra / base


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--rank", type=int, default=16)
  ap.add_argument("--rows", type=int, default=32)
  ap.add_argument("--new-tokens", type=int, default=64)
  harness.add_common_args(ap, rounds=5, warmup=1)
  args = ap.parse_args()
  env = harness.environment()
  print(harness.header(env))
  base, config, _ = load_smollm2()
  lcfg = lora.LoraConfig(rank=args.rank, alpha=2.0 * args.rank)
  adapters = lora.init_lora(base, lcfg, jax.random.key(0))
  # B != 0: a trained adapter, not the initial one.
  adapters = jax.tree.map(lambda x: x + 1e-3, adapters)
  merge = jax.jit(lambda b, a: lora.merge(b, a, lcfg))
  merged = jax.block_until_ready(merge(base, adapters))
  ids = np.random.default_rng(0).integers(3, config.vocab_size, (args.rows, 32), np.int32)
  mask = np.ones(ids.shape, bool)

  def decode():
    return sampling.generate(
      merged, ids, mask, config=config, num_samples=1, strategy=sampling.Temperature(1.0),
      key=jax.random.key(1), max_new_tokens=args.new_tokens, stop_tokens=(), buckets=(32,),
    ).tokens  # fmt: skip

  samples = harness.interleave(
    {"merge": lambda: merge(base, adapters), "decode": decode}, rounds=args.rounds,
    warmup=args.warmup,
  )  # fmt: skip
  t_merge = statistics.median(samples["merge"])
  t_step = statistics.median(samples["decode"]) / args.new_tokens
  extra = extra_flops_fraction(config, args.rank)
  print(f"SmolLM2-135M, LoRA r={args.rank} on q,k,v,o,gate,up,down; decode {args.rows} rows x "
        f"{args.new_tokens} tokens")  # fmt: skip
  print(f"merge: median {t_merge * 1e3:.1f} ms ({min(samples['merge']) * 1e3:.1f}-"
        f"{max(samples['merge']) * 1e3:.1f})")  # fmt: skip
  print(f"decode step (merged weights): median {t_step * 1e3:.1f} ms")
  print(f"merge = {t_merge / t_step:.2f} decode steps; unmerged decoding: +{100 * extra:.1f}% "
        f"matmul FLOPs per step")  # fmt: skip
  if args.json_out:
    harness.write_json(args.json_out, {
      "settings": vars(args), "seconds": samples, "merge_s": t_merge, "decode_step_s": t_step,
      "merge_in_steps": t_merge / t_step, "unmerged_extra_flops": extra,
    }, env)  # fmt: skip


if __name__ == "__main__":
  main()
