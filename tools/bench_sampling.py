"""Decode throughput of ``rlvr_jax.sampling.generate`` vs ``transformers`` ``generate``, side by side.

Table: docs/benchmarks.md, "Sampling throughput: `rlvr_jax.sampling.generate` vs `transformers`
`generate` (`tools/bench_sampling.py`)" (and the decode table of "One RL step end to end",
through tools/bench_trl.py).

Same weights (ours exported with ``export_hf`` and loaded by transformers), same prompts, greedy,
no early stop (every row generates exactly ``--new-tokens`` tokens). For each model and batch size:

  * ours: ``generate`` (jitted prefill + ``lax.while_loop`` decode), compiled beforehand;
  * hf-dynamic: ``model.generate`` with the default dynamic cache;
  * hf-static-compiled: static cache + ``torch.compile`` (skipped with the reason if it fails);
  * tokens/s = batch * new_tokens / wall time of the whole call (prefill included, short prompts);
  * host overhead of ours: the host time of a ``generate`` call (bucketing, transfers, jit dispatch:
    the time until the asynchronous call returns; the PRNG key is made before the call, as a
    trainer derives one per step) as a fraction of the call's wall time (= of an
    average decode step, since the decode loop itself runs on the device without host round
    trips); and, for contrast, the per-step time of a host-driven Python loop over ``decode_step``.
  * ours step ms: wall time of the compiled executable alone / new tokens.
  * ``--rounds R``: after the best-of measurement, R - 1 more rounds time one call of each
    contender back to back (``harness.interleave``); the table then shows median tokens/s and the
    median (range) of the per-round ratios, robust to this VM's drifting speed.
  * ``--json-out PATH``: the environment record and the rows (``harness.write_json``).

Usage (2-core CPU shared with other jobs: record ``uptime`` with the results):
  .venv/bin/python tools/bench_sampling.py --models tiny,smollm2 --batch-sizes 1,8,32,64 \
      --new-tokens 128
  # --compute-dtype bfloat16: ours in mixed precision (float32 weights, bfloat16 compute copy),
  # transformers with the weights loaded in bfloat16
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from rlvr_jax.model import (  # noqa: E402
  ModelConfig,
  compute_params,
  export_hf,
  init_params,
  unstack_layers,
)
from rlvr_jax.sampling import Greedy, decode_step, generate, pad_to_bucket, prefill  # noqa: E402
from rlvr_jax.sampling import sampler as sampler_lib  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

PROMPT_TEXTS = [
  "What is 12 + 7? Answer with a number.",
  "Name the capital of France.",
  "Write a haiku about the sea.",
  "Explain what a prime number is in one sentence.",
  "List three colours.",
  "How many legs does a spider have?",
  "Translate 'good morning' into Spanish.",
  "What is the square root of 81?",
]


def load_model(name: str, dtype: str = "float32"):
  """(params, config, prompt ids [8, S], mask [8, S]) for 'tiny' or 'smollm2', weights in ``dtype``."""
  if name == "tiny":
    config = ModelConfig.tiny(vocab_size=512, max_position_embeddings=1024)
    params = jax.tree.map(lambda x: x.astype(dtype), init_params(config, jax.random.key(0)))
    rng = np.random.default_rng(0)
    lengths = rng.integers(8, 25, len(PROMPT_TEXTS))
    ids = rng.integers(3, config.vocab_size, (len(PROMPT_TEXTS), 24)).astype(np.int32)
    mask = np.arange(24)[None, :] >= (24 - lengths)[:, None]
    ids[~mask] = config.pad_token_id
    return params, config, ids, mask
  if name == "smollm2":
    from rlvr_jax.model import load_smollm2

    params, config, tokenizer = load_smollm2(dtype)
    texts = tokenizer.apply_chat_template([[{"role": "user", "content": t}] for t in PROMPT_TEXTS])
    ids, mask = tokenizer.encode_batch(texts)
    return params, config, np.asarray(ids), np.asarray(mask)
  raise ValueError(f"unknown model {name!r}")


def best_time(fn, *, budget_s: float = 2.0, max_repeats: int = 5) -> tuple[float, object]:
  """(minimum wall time, last output) of ``fn()`` over repeats (repeats while under ``budget_s`` in
  total; the caller warmed it up): on a shared machine the minimum is the least disturbed run."""
  t = harness.time_calls(fn, warmup=0, repeats=max_repeats, budget_s=budget_s, keep_last=True)
  return t.min, t.last


def interleaved_rounds(contenders: dict, first_walls: dict, rounds: int) -> dict:
  """Wall times per contender over ``rounds`` rounds; round 1 is ``first_walls`` (the best-of
  measurement), each later round times one call of every contender back to back, so that a ratio
  is taken between calls minutes apart at most (this VM's speed drifts by up to ~30% over tens of
  minutes, for both frameworks alike)."""
  later = harness.interleave(contenders, rounds=rounds - 1, warmup=0)
  return {k: [first_walls[k], *later[k]] for k in contenders}


def ratio(walls: dict, other: str) -> dict:
  """The per-round ratios other / ours of wall times, with their range (``harness``)."""
  return harness.ratio_summary(walls[other], walls["ours"])


def batch_prompts(ids, mask, batch):
  reps = -(-batch // ids.shape[0])
  return np.tile(ids, (reps, 1))[:batch], np.tile(mask, (reps, 1))[:batch]


def bench_ours(params, config, ids, mask, new_tokens):
  """Returns dict: best wall time, a timer of one more call, host overhead fraction,
  python-loop vs while-loop per-step ms."""
  pad = config.pad_token_id or 0
  kw = dict(config=config, num_samples=1, strategy=Greedy(), max_new_tokens=new_tokens, pad_id=pad)
  # Warm-up that compiles the exact program without decoding: with a zero final norm all logits
  # are 0, greedy picks token 0, and stop token 0 ends every row at step 0 (stop ids are traced).
  warm = dict(params, final_norm=jnp.zeros_like(params["final_norm"]))
  jax.block_until_ready(generate(warm, ids, mask, key=jax.random.key(0), stop_tokens=(0,), **kw))
  dispatch = []  # host time until generate returns (the device work runs asynchronously after)
  key = jax.random.key(0)  # the caller's (a trainer derives one per step), not generate's cost

  def run():
    seconds, out = harness.timed(
      lambda: generate(params, ids, mask, key=key, stop_tokens=(), **kw), block=False
    )
    dispatch.append(seconds)
    return jax.block_until_ready(out)

  wall, rollout = best_time(run)
  assert int(rollout.lengths.min()) == new_tokens  # no early stop: exactly new_tokens per row

  # The compiled executable alone, on inputs already on the device.
  tokens_b, mask_b = pad_to_bucket(ids, mask, pad_id=pad)
  args = [jax.device_put(a) for a in (tokens_b, mask_b, np.arange(ids.shape[0], dtype=np.int32))]
  stops = jax.device_put(np.full((8,), -1, np.int32))
  static = {k: kw[k] for k in ("config", "strategy", "num_samples", "max_new_tokens", "pad_id")}
  static["phases"] = sampler_lib.cache_phases(tokens_b.shape[1], new_tokens)
  compiled = sampler_lib.generate_jit.lower(
    params, *args, jax.random.key(0), stops, **static
  ).compile()
  jax.block_until_ready(
    compiled(warm, *args, jax.random.key(0), jax.device_put(np.zeros(8, np.int32)))
  )
  device_wall, _ = best_time(
    lambda: jax.block_until_ready(compiled(params, *args, jax.random.key(0), stops))
  )

  # A host-driven loop over the donated decode_step, for contrast (per decode step).
  steps = min(new_tokens, 32)
  logits, cache, positions = prefill(
    params, tokens_b, mask_b, config=config, cache_len=tokens_b.shape[1] + steps + 1
  )
  # once, as generate does before its decode loop (and the compute-dtype copy with it)
  per_layer = unstack_layers(compute_params(params, config), config)
  loop = {"logits": logits, "cache": cache}

  def decode(first: int, last: int):
    for t in range(first, last):
      tok = jnp.argmax(loop["logits"], -1).astype(jnp.int32)
      loop["logits"], loop["cache"] = decode_step(
        per_layer, loop["cache"], tok, positions + t, config=config
      )
    return loop["logits"]

  harness.timed(lambda: decode(0, 1))  # compiles
  py_step = harness.timed(lambda: decode(1, steps))[0] / (steps - 1)
  return {
    "wall": wall,
    "call": run,
    "host_frac": min(dispatch) / wall,
    "host_ms": 1e3 * min(dispatch),
    "step_ms": 1e3 * device_wall / new_tokens,
    "py_step_ms": 1e3 * py_step,
  }


def bench_hf(model, ids, mask, new_tokens, pad, *, static: bool):
  import torch
  from transformers import CompileConfig

  gen_kw = dict(
    do_sample=False,
    max_new_tokens=new_tokens,
    min_new_tokens=new_tokens,
    pad_token_id=pad,
    eos_token_id=None,
  )
  if static:
    # transformers' own static-cache + torch.compile path (it compiles the decode forward);
    # _compile_all_devices enables it on CPU. mode="default": "reduce-overhead" is CUDA graphs.
    compile_config = CompileConfig(mode="default", fullgraph=True)
    compile_config._compile_all_devices = True
    gen_kw.update(cache_implementation="static", compile_config=compile_config)
  inputs = dict(
    input_ids=torch.tensor(ids, dtype=torch.long),
    attention_mask=torch.tensor(mask, dtype=torch.long),
  )
  with torch.no_grad():
    # Warm-up. Static: dynamo compiles on the first call and recompiles (automatic dynamic shapes)
    # on the second, so two full-length calls; dynamic: one short call.
    for _ in range(2 if static else 1):
      short = dict(gen_kw, max_new_tokens=new_tokens if static else 4, min_new_tokens=0)
      model.generate(**inputs, **short)
    call = lambda: model.generate(**inputs, **gen_kw)
    wall, out = best_time(call)
  assert out.shape[1] - ids.shape[1] == new_tokens

  def again():
    with torch.no_grad():
      return call()

  return {"wall": wall, "call": again}


def hf_model(params, config, dtype: str = "float32"):
  """Our weights exported to a safetensors folder and loaded by transformers in ``dtype``."""
  import torch
  import transformers

  folder = tempfile.mkdtemp(prefix="bench_sampling_")
  export_hf(params, config, folder, dtype=dtype)
  torch_dtype = getattr(torch, dtype)
  return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype).eval()


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--models", default="tiny,smollm2")
  parser.add_argument("--batch-sizes", default="1,8,32,64")
  parser.add_argument("--new-tokens", type=int, default=128)
  parser.add_argument(
    "--skip-compiled", action="store_true", help="skip static cache + torch.compile"
  )
  parser.add_argument("--torch-threads", type=int, default=os.cpu_count() or 1)
  parser.add_argument("--compute-dtype", default="float32", choices=("float32", "bfloat16"))
  harness.add_common_args(
    parser,
    rounds=1,
    rounds_help="rounds of back-to-back calls (ours, hf dynamic, hf compiled); > 1 reports "
    "medians and the median of the per-round ratios, with their range",
  )
  parser.add_argument(
    "--dtype",
    default="float32",
    choices=("float32", "bfloat16"),
    help="parameter dtype of ours (bfloat16: pure bfloat16); transformers computes in ours' "
    "compute dtype (bfloat16 when this or --compute-dtype is)",
  )
  args = parser.parse_args()
  import torch

  torch.set_num_threads(args.torch_threads)
  env = harness.environment(packages=("torch", "transformers"))
  print(
    harness.header(env, f"torch {torch.__version__} ({args.torch_threads} threads), "
                   f"params {args.dtype}, compute {args.compute_dtype}")
  )  # fmt: skip
  print(
    "| model | batch | ours tok/s | hf dynamic tok/s | hf static+compile tok/s | ours / dynamic "
    "| ours / compiled | host overhead (ms per call) | ours step ms | python-loop step ms |"
  )
  print("|---|---|---|---|---|---|---|---|---|---|")
  rows = []
  for name in args.models.split(","):
    params, config, ids, mask = load_model(name, args.dtype)
    config = config.replace(compute_dtype=args.compute_dtype)
    pad = config.pad_token_id or 0
    # transformers in the precision ours computes in (bfloat16 when either flag says so)
    dynamic = hf_model(params, config, config.activation_dtype)
    compiled_model = None if args.skip_compiled else dynamic
    compiled_error = None
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
      b_ids, b_mask = batch_prompts(ids, mask, batch)
      ours = bench_ours(params, config, b_ids, b_mask, args.new_tokens)
      dyn = bench_hf(dynamic, b_ids, b_mask, args.new_tokens, pad, static=False)
      comp = None
      if compiled_model is not None:
        try:
          comp = bench_hf(compiled_model, b_ids, b_mask, args.new_tokens, pad, static=True)
        except Exception as e:  # noqa: BLE001 - torch.compile on CPU may fail: report it
          compiled_error = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
          compiled_model = None
      runs = {"ours": ours, "dyn": dyn} | ({"comp": comp} if comp else {})
      walls = interleaved_rounds(
        {k: r["call"] for k, r in runs.items()},
        {k: r["wall"] for k, r in runs.items()},
        args.rounds,
      )
      tok_s = {k: batch * args.new_tokens / float(np.median(w)) for k, w in walls.items()}

      comp_s, ratio_c = "skipped", "-"
      if comp:
        comp_s, ratio_c = f"{tok_s['comp']:.0f}", harness.ratio_text(ratio(walls, "comp"))
      elif compiled_error:
        comp_s = f"failed ({compiled_error})"
      print(
        f"| {name} | {batch} | {tok_s['ours']:.0f} | {tok_s['dyn']:.0f} | {comp_s} | "
        f"{harness.ratio_text(ratio(walls, 'dyn'))} | {ratio_c} | "
        f"{100 * ours['host_frac']:.2f}% ({ours['host_ms']:.1f}) | "
        f"{ours['step_ms']:.2f} | {ours['py_step_ms']:.2f} |",
        flush=True,
      )
      rows.append(
        {
          "model": name,
          "dtype": args.dtype,
          "batch": batch,
          "new_tokens": args.new_tokens,
          "walls_s": {k: [float(x) for x in w] for k, w in walls.items()},
          "tokens_per_s": tok_s,
          "ratio_dynamic_over_ours": ratio(walls, "dyn")["ratios"],
          "ours_step_ms": ours["step_ms"],
        }
      )
  if args.json_out:
    harness.write_json(args.json_out, {"settings": vars(args), "rows": rows}, env)
  print(f"# load after: {harness.load_text()}")


if __name__ == "__main__":
  main()
