"""Forward-pass throughput of the decoder vs transformers, and FLOP/s as a fraction of matmul peak.

Table: docs/benchmarks.md, "Model forward: SmolLM2-135M-Instruct, batch 8 x 512 tokens
(`tools/bench_model.py`)". The ``--reshard`` mode (real SmolLM2 weights) has no table of its own:
"Reshard between the training and sampling layouts" is tools/bench_reshard.py's.

    HF_HUB_OFFLINE=1 .venv/bin/python tools/bench_model.py --batch 8 --seq 512 --repeats 3

Runs SmolLM2-135M-Instruct (float32, logits included) on random tokens [batch, seq]:
  * ours: ``jax.jit(forward)`` (compiled once, then timed),
  * transformers: the same GGUF loaded by ``AutoModelForCausalLM`` (``torch.no_grad``, float32),
each timed as the median of ``--repeats`` calls after a compiling one (``harness.time_calls``),
and measures the machine's matmul peak with a large float32 ``jnp.matmul``
(``harness.matmul_peak``). Model FLOPs per forward:
  2 * (matmul params incl. the unembedding) * B * S  +  4 * L * N * H * B * S^2  (QK^T and PV,
  full S x S as computed). Prints a markdown table row per implementation.

    .venv/bin/python tools/bench_model.py --reshard

instead measures the train -> sample layout reshard of SmolLM2 on a (data 2, fsdp 2, tensor 2) mesh
of 8 simulated CPU devices (``rlvr_jax.sharding.reshard_cost``). ``--json-out PATH``: the
environment record and the rows as JSON (``harness.write_json``).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def model_flops(config, batch: int, seq: int) -> float:
  c = config
  per_layer = c.hidden_size * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
  per_layer += c.num_heads * c.head_dim * c.hidden_size + 3 * c.hidden_size * c.intermediate_size
  matmul_params = c.num_layers * per_layer + c.hidden_size * c.vocab_size
  tokens = batch * seq
  attention = 4 * c.num_layers * c.num_heads * c.head_dim * batch * seq * seq
  return 2 * matmul_params * tokens + attention


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--seq", type=int, default=512)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--skip-torch", action="store_true")
  parser.add_argument("--reshard", action="store_true", help="measure the layout reshard instead")
  harness.add_common_args(parser)
  args = parser.parse_args()
  if args.reshard:
    return bench_reshard(args.repeats, args.json_out)

  import jax
  import jax.numpy as jnp

  from rlvr_jax.model import forward, load_smollm2
  from rlvr_jax.model.smollm2 import smollm2_gguf_path

  params, config, _ = load_smollm2()
  B, S = args.batch, args.seq
  tokens = np.random.default_rng(0).integers(0, config.vocab_size, (B, S)).astype(np.int32)
  positions = np.broadcast_to(np.arange(S, dtype=np.int32), (B, S))
  flops = model_flops(config, B, S)
  env = harness.environment(packages=("torch", "transformers"))
  print(harness.header(env))
  peak = harness.matmul_peak(2048, repeats=5)
  print(f"devices: {jax.devices()}  matmul peak (f32 2048^3): {peak / 1e9:.1f} GFLOP/s")
  print(f"model FLOPs per forward: {flops / 1e12:.3f} TFLOP")

  fn = jax.jit(lambda p, t, q: forward(p, t, q, config=config, return_logits=True)[0])
  t_arr, p_arr = jnp.asarray(tokens), jnp.asarray(positions)
  ours = harness.time_calls(lambda: fn(params, t_arr, p_arr), warmup=1, repeats=args.repeats)
  rows = [("rlvr_jax (jax.jit, f32)", ours)]
  print(f"ours: first call (compile + run) {ours.warmup[0]:.1f} s, runs "
        f"{[round(x, 2) for x in ours.samples]}")  # fmt: skip

  if not args.skip_torch:
    import torch
    from transformers import AutoModelForCausalLM

    folder, name = os.path.split(smollm2_gguf_path())
    hf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    t_tok = torch.tensor(tokens, dtype=torch.long)
    with torch.no_grad():
      theirs = harness.time_calls(lambda: hf(input_ids=t_tok), warmup=1, repeats=args.repeats,
                                  block=False)  # fmt: skip
    rows.append(
      (f"transformers {torch.__version__} (torch, f32, {torch.get_num_threads()} thr)", theirs)
    )
    print(f"transformers runs {[round(x, 2) for x in theirs.samples]}")

  print()
  print(harness.table_header(["implementation", "median s / forward", "tokens/s", "GFLOP/s",
                              "fraction of matmul peak"]))  # fmt: skip
  for name, t in rows:
    secs = t.median
    print(
      f"| {name} | {secs:.2f} | {B * S / secs:,.0f} | {flops / secs / 1e9:.1f} |"
      f" {flops / secs / peak:.2f} |"
    )
  if args.json_out:
    results = [{"implementation": name, **t.to_dict(), "tokens_per_s": B * S / t.median,
                "flops_per_s": flops / t.median} for name, t in rows]  # fmt: skip
    out = {"settings": vars(args), "model_flops": flops, "matmul_peak_flops_per_s": peak,
           "rows": results}  # fmt: skip
    harness.write_json(args.json_out, out, env)


def bench_reshard(repeats: int, json_out: str = ""):
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  )
  from rlvr_jax import sharding as S
  from rlvr_jax.model import load_smollm2, param_shardings

  env = harness.environment()
  print(harness.header(env))
  mesh = S.make_mesh(2, 2, 2)
  params, config, _ = load_smollm2(mesh=mesh, rules=S.TRAIN_RULES)
  sample = param_shardings(config, mesh, S.SAMPLE_RULES)
  train = param_shardings(config, mesh, S.TRAIN_RULES)
  to_sample = S.reshard_cost(params, sample, repeats=repeats)
  sampled = S.reshard(params, sample)
  to_train = S.reshard_cost(sampled, train, repeats=repeats)
  print("| direction | best s | MB per device before | MB per device after |")
  print("|---|---|---|---|")
  directions = {"train -> sample": to_sample, "sample -> train": to_train}
  for name, c in directions.items():
    print(
      f"| {name} | {c['seconds']:.3f} | {c['bytes_per_device_before'] / 1e6:.1f} |"
      f" {c['bytes_per_device_after'] / 1e6:.1f} |"
    )
  if json_out:
    harness.write_json(json_out, {"reshard": directions, "repeats": repeats}, env)


if __name__ == "__main__":
  main()
