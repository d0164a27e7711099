"""Sampler/trainer log-prob gap in float32 vs bfloat16-mixed precision, on an experiment's prompts.

Table: docs/benchmarks.md, "Sampler/trainer log-prob gap: float32 vs bfloat16
(`tools/precision_gap.py`)" (docs/design.md, "Mixed precision", quotes it: how the default mismatch
correction for bfloat16 runs was chosen).

For each ``model.compute_dtype`` (float32, bfloat16) it samples one RL batch of the experiment
(``rl.prompts_per_step`` train prompts x ``sampling.num_samples``, the experiment's temperature and
token budget) from the same float32 master weights, recomputes the trainer's log-probs of those
tokens with the same precision (the on-policy ``old_logp``) and reports over completion tokens the
distribution of log rho = trainer logp - sampler logp: |log rho| mean / p50 / p90 / p99 / max, the
share of tokens and of sequences that truncated IS (``token_truncate``, C = 2) and masked IS
(``token_mask`` [0.5, 2], ``seq_mask``) would change, and the cross gap (bfloat16 sampler scored by
a float32 trainer).

Usage (on the 2-core CPU the numbers are gaps, not timings; SmolLM2 takes ~10 min of CPU):
  .venv/bin/python tools/precision_gap.py --config=smollm2_arithmetic
  .venv/bin/python tools/precision_gap.py --config=default --warm_start   # the tiny model, after
                                                                        # its warm start
Extra ``--config.<field>=<value>`` arguments override the experiment's fields. ``--json-out PATH``
writes the environment record and the printed numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from rlvr_jax import api, cli, sampling  # noqa: E402
from rlvr_jax import data as data_lib  # noqa: E402
from rlvr_jax.train import build, sft  # noqa: E402
from rlvr_jax.train import step as step_lib  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def gap_stats(trainer_logp, sampler_logp, mask) -> dict:
  """The log rho = trainer - sampler distribution over completion tokens (module docstring)."""
  m = np.asarray(mask, bool)
  log_rho = np.asarray(trainer_logp, np.float64) - np.asarray(sampler_logp, np.float64)
  tok = np.abs(log_rho[m])
  seq = np.abs(np.sum(np.where(m, log_rho, 0.0), axis=1))[m.any(axis=1)]
  log2 = np.log(2.0)
  return {
    "tokens": int(m.sum()),
    "abs_mean": float(tok.mean()),
    "abs_p50": float(np.quantile(tok, 0.5)),
    "abs_p90": float(np.quantile(tok, 0.9)),
    "abs_p99": float(np.quantile(tok, 0.99)),
    "abs_max": float(tok.max()),
    "token_frac_rho_gt_2": float((log_rho[m] > log2).mean()),  # token_truncate C=2 clips these
    "token_frac_outside_0.5_2": float((tok > log2).mean()),  # token_mask [0.5, 2] drops these
    "seq_abs_mean": float(seq.mean()),
    "seq_abs_max": float(seq.max()),
    "seq_frac_outside_0.5_2": float((seq > log2).mean()),  # seq_mask [0.5, 2] drops these rows
  }


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="smollm2_arithmetic")
  parser.add_argument("--warm_start", action="store_true", help="run the experiment's warm start")
  parser.add_argument("--seed", type=int, default=0, help="sampling key")
  harness.add_common_args(parser)
  args, rest = parser.parse_known_args(argv)
  env = harness.environment()
  overrides = {}
  for item in rest:  # --config.a.b=value
    key, _, value = item[len("--config.") :].partition("=")
    try:
      overrides[key] = json.loads(value)
    except json.JSONDecodeError:  # a bare string
      overrides[key] = value
  c = api.make_config(cli.resolve_experiment(args.config), **overrides)
  tok, params, cfg = build.build_tokenizer_and_model(c)
  cfg = cfg.replace(compute_dtype="float32")
  if args.warm_start and c.warm_start.num_steps:
    params, _ = sft.warm_start(
      params, source=build.warm_start_source(c), tokenizer=tok, model_config=cfg,
      cfg=c.warm_start, max_new_tokens=c.sampling.max_new_tokens, log=print,
    )  # fmt: skip
  source, _ = data_lib.build_sources(c.data)
  records = source.take(c.rl.prompts_per_step)
  texts = data_lib.format_prompts(
    records, tok, chat_template=c.data.chat_template, system_prompt=c.data.system_prompt
  )
  ids, mask = data_lib.encode_prompts(
    texts, tok, add_special_tokens=c.data.add_special_tokens, bucket=c.data.prompt_bucket
  )
  s = c.sampling
  out = {"config": args.config, "overrides": overrides, "jax": jax.__version__}
  configs = {dt: cfg.replace(compute_dtype=dt) for dt in ("float32", "bfloat16")}
  for dt, mc in configs.items():
    rollout = sampling.generate(
      params, ids, mask, config=mc, num_samples=s.num_samples,
      strategy=sampling.Temperature(s.temperature), key=jax.random.key(args.seed),
      max_new_tokens=s.max_new_tokens, stop_tokens=tuple(tok.eos_ids), pad_id=tok.pad_id,
      phase_steps=s.phase_steps,
    )  # fmt: skip
    tokens, positions = step_lib.sequence_inputs(
      rollout.prompt_tokens, rollout.prompt_mask, rollout.tokens
    )
    score = jax.jit(
      step_lib.completion_logprobs,
      static_argnames=("num_completion", "model_config", "temperature", "chunk_size"),
    )
    for trainer_dt in sorted({dt, "float32"}):
      logp, _ = score(
        params, tokens, positions, num_completion=s.max_new_tokens,
        model_config=configs[trainer_dt], temperature=s.temperature,
        chunk_size=c.rl.logprob_chunk,
      )  # fmt: skip
      key = f"sampler_{dt}/trainer_{trainer_dt}"
      out[key] = gap_stats(logp, rollout.sampler_logp, rollout.completion_mask)
      print(key, json.dumps(out[key]), flush=True)
    out[f"sampler_{dt}/mean_length"] = float(jnp.mean(rollout.lengths))
  print(json.dumps(out, indent=1))
  if args.json_out:
    harness.write_json(args.json_out, out, env)


if __name__ == "__main__":
  main(sys.argv[1:])
