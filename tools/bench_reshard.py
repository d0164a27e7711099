"""Cost of moving the params between the training layout and the sampling layout.

Table: docs/benchmarks.md, "Reshard between the training and sampling layouts
(`tools/bench_reshard.py`)".

Training layout (``sharding.TRAIN_RULES``): weights split over fsdp x tensor. Sampling layout
(``SAMPLE_RULES``): split over tensor only, so train -> sample is an all-gather over ``fsdp``
(done once per RL step, before the rollout) and sample -> train a local slice (no communication).

  python tools/bench_reshard.py                      # tiny + 20M + SmolLM2-135M shapes, 2x2x2 / 1x8x1
  python tools/bench_reshard.py --models=smollm2 --meshes=1,4,2

Prints one row per (model, mesh, direction): best wall time of ``sharding.reshard`` (params
created already sharded, ``jax.block_until_ready``), bytes per device before / after, and the
rate at which the new layout is written (its bytes summed over all devices / time). On simulated CPU devices the
"collective" is memory copies within one process: the numbers bound the host overhead, not ICI /
NVLink bandwidth. The environment record comes first; ``--json-out PATH`` writes it with the rows.
"""

from __future__ import annotations

import argparse
import os
import sys

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  ).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

from rlvr_jax import model  # noqa: E402
from rlvr_jax import sharding as S  # noqa: E402
from rlvr_jax.model.smollm2 import SMOLLM2_SHAPES  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

MODELS = {
  "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=256, num_layers=2),
  "20m": dict(
    vocab_size=8192,
    hidden_size=512,
    intermediate_size=1536,
    num_layers=4,
    num_heads=8,
    num_kv_heads=4,
    head_dim=64,
  ),
  "smollm2": SMOLLM2_SHAPES,  # random weights of SmolLM2-135M's shapes
}


def bench(name: str, mesh_shape, repeats: int) -> list[dict]:
  cfg = model.ModelConfig.tiny(**MODELS[name])
  mesh = S.make_mesh(*mesh_shape)
  train_sh = model.param_shardings(cfg, mesh, S.TRAIN_RULES)
  sample_sh = model.param_shardings(cfg, mesh, S.SAMPLE_RULES)
  params = model.init_params(cfg, jax.random.key(0), shardings=train_sh)
  jax.block_until_ready(params)
  rows = []
  sample = None
  for direction, src, dst in (
    ("train->sample", params, sample_sh),
    ("sample->train", None, train_sh),
  ):
    src = sample if src is None else src
    jax.block_until_ready(S.reshard(src, dst))  # warm-up (compiles the transfers)
    cost = S.reshard_cost(src, dst, repeats=repeats)
    if sample is None:
      sample = S.reshard(src, dst)
    written = cost["bytes_per_device_after"] * len(mesh.devices.flat)
    rows.append(
      dict(
        model=name,
        params_m=model.count_params(cfg) / 1e6,
        mesh="x".join(map(str, mesh_shape)),
        direction=direction,
        ms=cost["seconds"] * 1e3,
        mb_before=cost["bytes_per_device_before"] / 2**20,
        mb_after=cost["bytes_per_device_after"] / 2**20,
        gb_s=written / cost["seconds"] / 1e9,
      )
    )
  del params, sample
  return rows


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--models", default="tiny,20m,smollm2")
  p.add_argument("--meshes", default="2,2,2;1,8,1", help="';'-separated data,fsdp,tensor sizes")
  p.add_argument("--repeats", type=int, default=5)
  harness.add_common_args(p)
  args = p.parse_args()
  env = harness.environment()
  print(harness.header(env))
  print(f"jax {jax.__version__}, {jax.device_count()} x {jax.devices()[0].platform} devices")
  header = "| model | params (M) | mesh (d x f x t) | direction | time (ms) | MiB/device before -> after | written GB/s (all devices) |"
  print(header)
  print("|" + "---|" * 7)
  rows = []

  def run():
    for name in args.models.split(","):
      for m in args.meshes.split(";"):
        for r in bench(name, tuple(int(x) for x in m.split(",")), args.repeats):
          rows.append(r)
          print(
            f"| {r['model']} | {r['params_m']:.1f} | {r['mesh']} | {r['direction']} | "
            f"{r['ms']:.2f} | {r['mb_before']:.2f} -> {r['mb_after']:.2f} | {r['gb_s']:.2f} |",
            flush=True,
          )

  total, _ = harness.timed(run, block=False)
  print(f"total {total:.1f} s")
  if args.json_out:
    harness.write_json(args.json_out, {"settings": vars(args), "rows": rows, "total_s": total}, env)


if __name__ == "__main__":
  main()
