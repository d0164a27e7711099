"""Static against continuous batching (``sampling.generate`` vs ``sampling.continuous.generate``)
on long-tailed completion lengths: useful-token fraction and tokens/s, side by side.

Table: docs/benchmarks.md, "Rollouts with long-tailed lengths: continuous batching".

Both samplers decode the same B = P x G rows (same keys: the same tokens) and differ in how: the
static one runs one batch of B rows until its longest row has ended, the continuous one keeps N
slots busy with a queue of the rows. For each length distribution:

  * ``real``: SmolLM2-135M-Instruct on the word problems of ``experiments/smollm2_learn.py``
    (chat template, temperature 0.7, its own stop token): the lengths of a real rollout batch.
  * ``synthetic``: lengths imposed as per-row budgets (``max_lengths``, no stop token), drawn from
    a log-normal with the given median and 99th percentile (``--median``, ``--p99``).
  * ``equal``: every row runs to ``--max-new-tokens`` (no stop): the case where continuous
    batching can only cost.

Reported per sampler: wall time of the call (compiled beforehand; interleaved rounds, median and
range), tokens/s = generated tokens / wall, the useful-token fraction = tokens decoded for live
rows / slot-steps (static: sum(lengths - 1) / (B (max length - 1)); continuous: its
``SlotStats``), and the ratio continuous / static of tokens/s per round. The KV entries per row
(``continuous.kv_entries_per_row``) are printed with each table.

``--memory ROWSxSLOTSxPROMPTxNEW`` (with ``--hf-model``, default Qwen/Qwen2.5-1.5B, bfloat16
compute): instead of timing, lowers and compiles both samplers on abstract arguments (nothing
allocated) and prints XLA's ``memory_analysis()`` of each: the KV cache the call needs, static
(B rows x (prompt + NEW)) against continuous (the prompt cache + SLOTS slots).

Usage (the docs' table; minutes on the 2-core CPU):
  .venv/bin/python tools/bench_continuous.py --model smollm2 --lengths real,synthetic,equal \
      --prompts 8 --samples 8 --max-new-tokens 256 --median 32 --p99 256 --slots 16,32 \
      --rounds 3 --json-out /tmp/continuous.json
  # quick check: --model tiny --max-new-tokens 64 --median 8 --p99 64 --rounds 2
  .venv/bin/python tools/bench_continuous.py --memory 1024x256x256x2048
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from rlvr_jax import sampling  # noqa: E402
from rlvr_jax.model import ModelConfig, init_params  # noqa: E402
from rlvr_jax.sampling import continuous  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def synthetic_lengths(n: int, *, median: float, p99: float, max_len: int, seed: int = 0):
  """``n`` lengths from a log-normal with this median and 99th percentile, in [1, max_len]."""
  sigma = np.log(p99 / median) / 2.3263478740408408  # the standard normal's 99th percentile
  z = np.random.default_rng(seed).standard_normal(n)
  return np.clip(np.round(median * np.exp(sigma * z)), 1, max_len).astype(np.int32)


def load(model: str, num_prompts: int):
  """(params, config, prompt ids [P, S], mask, stop ids, temperature) of ``model``."""
  if model == "tiny":
    config = ModelConfig.tiny(vocab_size=512, max_position_embeddings=4096)
    params = init_params(config, jax.random.key(0))
    rng = np.random.default_rng(0)
    ids = rng.integers(3, config.vocab_size, (num_prompts, 24)).astype(np.int32)
    return params, config, ids, np.ones(ids.shape, bool), (), 1.0
  from rlvr_jax import cli
  from rlvr_jax import data as data_lib
  from rlvr_jax.data import source as source_lib
  from rlvr_jax.data import tasks
  from rlvr_jax.model import load_smollm2

  params, config, tokenizer = load_smollm2()
  c = cli.load_config(os.path.join(ROOT, "experiments", "smollm2_learn.py"))
  records = tasks.heldout_set(source_lib.task_spec(c.data), num_prompts, seed=c.data.seed + 1)
  texts = data_lib.format_prompts(records, tokenizer, chat_template=True)
  ids, mask = data_lib.encode_prompts(texts, tokenizer, add_special_tokens=False)
  return params, config, ids, mask, tuple(tokenizer.eos_ids), c.sampling.temperature


def compiled_memory(hf_model: str, rows: int, slots: int, prompt: int, new: int) -> dict:
  """XLA's memory analysis of both samplers compiled for abstract arguments, in bytes."""
  from update_memory import analysis_bytes

  from rlvr_jax.model.config import HF_CONFIGS

  cfg = ModelConfig.from_hf_dict(HF_CONFIGS[hf_model], dtype="float32", compute_dtype="bfloat16")
  G = 8
  P = rows // G
  params = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype)
  args = (
    params, spec((P, prompt), np.int32), spec((P, prompt), bool), spec((P,), np.int32),
    jax.random.key(0), spec((8,), np.int32), None, spec((rows,), np.int32),
  )  # fmt: skip
  kw = dict(config=cfg, strategy=sampling.Temperature(1.0), num_samples=G, max_new_tokens=new,
            pad_id=0)  # fmt: skip
  out = {}
  static_phases = sampling.sampler.cache_phases(prompt, new)
  lowered = sampling.sampler.generate_jit.lower(*args, phases=static_phases, **kw)
  out["static"] = analysis_bytes(lowered.compile())
  lowered = continuous.generate_jit.lower(
    *args, num_slots=slots, phases=continuous.completion_phases(new, min_steps=32), **kw
  )
  out["continuous"] = analysis_bytes(lowered.compile())
  kv = continuous.kv_entries_per_row(num_prompts=P, num_samples=G, prompt_len=prompt,
                                     max_new_tokens=new, num_slots=slots)  # fmt: skip
  per_entry = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 2  # bfloat16 k and v
  for name in ("static", "continuous"):
    out[name]["kv_bytes_formula"] = kv[name] * rows * per_entry
  return out


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--model", default="tiny", choices=["tiny", "smollm2"])
  ap.add_argument("--lengths", default="synthetic,equal", help="real, synthetic, equal")
  ap.add_argument("--prompts", type=int, default=8)
  ap.add_argument("--samples", type=int, default=8)
  ap.add_argument("--max-new-tokens", type=int, default=64)
  ap.add_argument("--median", type=float, default=8)
  ap.add_argument("--p99", type=float, default=64)
  ap.add_argument("--slots", default="16", help="comma-separated slot counts")
  ap.add_argument("--memory", default="", help="ROWSxSLOTSxPROMPTxNEW: compiled memory only")
  ap.add_argument("--hf-model", default="Qwen/Qwen2.5-1.5B", help="the model of --memory")
  harness.add_common_args(ap, rounds=3, warmup=1)
  args = ap.parse_args()
  env = harness.environment()
  print(harness.header(env))
  if args.memory:
    rows, slots, prompt, new = (int(x) for x in args.memory.split("x"))
    mem = compiled_memory(args.hf_model, rows, slots, prompt, new)
    gb = lambda x: f"{x / 1e9:.2f}"
    print(f"\n{args.hf_model}, {rows} rows (G = 8), prompt {prompt}, {new} new tokens, "
          f"continuous with {slots} slots; XLA memory analysis, GB:")  # fmt: skip
    print(harness.markdown_table(
      ["sampler", "arguments", "temporaries", "peak", "KV cache (formula)"],
      [[name, gb(m["argument_bytes"]), gb(m["temp_bytes"]), gb(m["peak_bytes"]),
        gb(m["kv_bytes_formula"])] for name, m in mem.items()],
    ))  # fmt: skip
    if args.json_out:
      harness.write_json(args.json_out, {"memory": mem, "args": vars(args)}, env)
    return
  params, config, ids, mask, eos, temperature = load(args.model, args.prompts)
  P, G, T = args.prompts, args.samples, args.max_new_tokens
  B = P * G
  key = jax.random.key(0)
  results = []
  for kind in args.lengths.split(","):
    kw = dict(
      config=config, num_samples=G, strategy=sampling.Temperature(temperature), key=key,
      max_new_tokens=T,
    )  # fmt: skip
    if kind == "real":
      if args.model != "smollm2":
        raise SystemExit("--lengths real needs --model smollm2 (the lengths of a real model)")
      kw["stop_tokens"] = eos
    elif kind == "synthetic":
      kw.update(stop_tokens=(), max_lengths=synthetic_lengths(
        B, median=args.median, p99=args.p99, max_len=T))  # fmt: skip
    elif kind == "equal":
      kw.update(stop_tokens=(), max_lengths=np.full(B, T, np.int32))
    else:
      raise SystemExit(f"--lengths: unknown kind {kind!r} (real, synthetic, equal)")
    reference = sampling.generate(params, ids, mask, **kw)
    lengths = np.asarray(reference.lengths)
    decoded = int(lengths.sum() - B)  # token 0 of every row comes from the prefill
    contenders = {"static": lambda kw=kw: sampling.generate(params, ids, mask, **kw)}
    useful = {"static": decoded / max(1, (lengths.max() - 1) * B)}
    for n in [int(s) for s in args.slots.split(",")]:
      n = min(n, B)
      _, stats = continuous.generate(params, ids, mask, num_slots=n, with_stats=True, **kw)
      useful[f"continuous N={n}"] = stats["live_slot_steps"] / max(1, stats["slot_steps"])
      contenders[f"continuous N={n}"] = lambda kw=kw, n=n: continuous.generate(
        params, ids, mask, num_slots=n, **kw
      )
    same = all(
      np.array_equal(np.asarray(f().tokens), np.asarray(reference.tokens))
      for name, f in contenders.items()
      if name != "static"
    )
    walls = harness.interleave(contenders, rounds=args.rounds, warmup=args.warmup)
    tokens = int(lengths.sum())
    rows = []
    for name, samples in walls.items():
      ratio = harness.ratio_summary(walls["static"], samples)  # static wall / this wall
      rows.append([
        name, f"{useful[name]:.2f}", harness.spread_text(samples, ".2f"),
        f"{tokens / np.median(samples):.0f}", harness.ratio_text(ratio),
      ])  # fmt: skip
      results.append(dict(
        lengths=kind, sampler=name, useful_fraction=useful[name], wall_s=samples,
        tokens=tokens, speedup=ratio,
      ))  # fmt: skip
    kv = {
      f"N={n}": continuous.kv_entries_per_row(num_prompts=P, num_samples=G,
                                              prompt_len=ids.shape[1], max_new_tokens=T,
                                              num_slots=min(int(n), B))
      for n in args.slots.split(",")
    }  # fmt: skip
    print(
      f"\n{args.model}, {kind} lengths: B = {P} x {G}, T = {T}, median {np.median(lengths):.0f}, "
      f"p99 {np.percentile(lengths, 99):.0f}, max {lengths.max()}; same tokens: {same}; "
      f"KV entries per row (static / continuous): {kv}"
    )
    print(harness.markdown_table(
      ["sampler", "useful fraction", "wall s (median, range)", "tokens/s", "speed-up"], rows
    ))  # fmt: skip
  if args.json_out:
    harness.write_json(args.json_out, {"rows": results, "args": vars(args)}, env)


if __name__ == "__main__":
  main()
