"""Forward-pass throughput of the decoder vs transformers, and FLOP/s as a fraction of matmul peak.

    HF_HUB_OFFLINE=1 .venv/bin/python tools/bench_model.py --batch 8 --seq 512 --repeats 3

Runs SmolLM2-135M-Instruct (float32, logits included) on random tokens [batch, seq]:
  * ours: ``jax.jit(forward)`` (compiled once, then timed),
  * transformers: the same GGUF loaded by ``AutoModelForCausalLM`` (``torch.no_grad``, float32),
and measures the machine's matmul peak with a large float32 ``jnp.matmul``. Model FLOPs per forward:
  2 * (matmul params incl. the unembedding) * B * S  +  4 * L * N * H * B * S^2  (QK^T and PV,
  full S x S as computed). Prints a markdown table row per implementation.

    .venv/bin/python tools/bench_model.py --reshard

instead measures the train -> sample layout reshard of SmolLM2 on a (data 2, fsdp 2, tensor 2) mesh
of 8 simulated CPU devices (``rlvr_jax.sharding.reshard_cost``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def matmul_peak(n: int = 2048, repeats: int = 5) -> float:
  """Best FLOP/s of an [n, n] @ [n, n] float32 matmul under jit."""
  import jax
  import jax.numpy as jnp

  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  f = jax.jit(jnp.matmul)
  f(a, b).block_until_ready()
  best = min(_time(lambda: f(a, b).block_until_ready()) for _ in range(repeats))
  return 2 * n**3 / best


def _time(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


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
  args = parser.parse_args()
  if args.reshard:
    return bench_reshard(args.repeats)

  import jax
  import jax.numpy as jnp

  from rlvr_jax.model import forward, load_smollm2
  from rlvr_jax.model.smollm2 import smollm2_gguf_path

  params, config, _ = load_smollm2()
  B, S = args.batch, args.seq
  tokens = np.random.default_rng(0).integers(0, config.vocab_size, (B, S)).astype(np.int32)
  positions = np.broadcast_to(np.arange(S, dtype=np.int32), (B, S))
  flops = model_flops(config, B, S)
  peak = matmul_peak()
  print(f"devices: {jax.devices()}  matmul peak (f32 2048^3): {peak / 1e9:.1f} GFLOP/s")
  print(f"model FLOPs per forward: {flops / 1e12:.3f} TFLOP")

  fn = jax.jit(lambda p, t, q: forward(p, t, q, config=config, return_logits=True)[0])
  t_arr, p_arr = jnp.asarray(tokens), jnp.asarray(positions)
  compile_s = _time(lambda: fn(params, t_arr, p_arr).block_until_ready())
  ours = [_time(lambda: fn(params, t_arr, p_arr).block_until_ready()) for _ in range(args.repeats)]
  rows = [("rlvr_jax (jax.jit, f32)", statistics.median(ours))]
  print(f"ours: first call (compile + run) {compile_s:.1f} s, runs {[round(x, 2) for x in ours]}")

  if not args.skip_torch:
    import torch
    from transformers import AutoModelForCausalLM

    folder, name = os.path.split(smollm2_gguf_path())
    hf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    t_tok = torch.tensor(tokens, dtype=torch.long)
    with torch.no_grad():
      hf(input_ids=t_tok)
      theirs = [_time(lambda: hf(input_ids=t_tok)) for _ in range(args.repeats)]
    rows.append(
      (
        f"transformers {torch.__version__} (torch, f32, {torch.get_num_threads()} thr)",
        statistics.median(theirs),
      )
    )
    print(f"transformers runs {[round(x, 2) for x in theirs]}")

  print()
  print("| implementation | median s / forward | tokens/s | GFLOP/s | fraction of matmul peak |")
  print("|---|---|---|---|---|")
  for name, secs in rows:
    print(
      f"| {name} | {secs:.2f} | {B * S / secs:,.0f} | {flops / secs / 1e9:.1f} |"
      f" {flops / secs / peak:.2f} |"
    )


def bench_reshard(repeats: int):
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  )
  from rlvr_jax import sharding as S
  from rlvr_jax.model import load_smollm2, param_shardings

  mesh = S.make_mesh(2, 2, 2)
  params, config, _ = load_smollm2(mesh=mesh, rules=S.TRAIN_RULES)
  sample = param_shardings(config, mesh, S.SAMPLE_RULES)
  train = param_shardings(config, mesh, S.TRAIN_RULES)
  to_sample = S.reshard_cost(params, sample, repeats=repeats)
  sampled = S.reshard(params, sample)
  to_train = S.reshard_cost(sampled, train, repeats=repeats)
  print("| direction | best s | MB per device before | MB per device after |")
  print("|---|---|---|---|")
  for name, c in (("train -> sample", to_sample), ("sample -> train", to_train)):
    print(
      f"| {name} | {c['seconds']:.3f} | {c['bytes_per_device_before'] / 1e6:.1f} |"
      f" {c['bytes_per_device_after'] / 1e6:.1f} |"
    )


if __name__ == "__main__":
  main()
