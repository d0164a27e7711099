"""Sampler vs trainer log-prob parity on SmolLM2-135M-Instruct (float32), each against float64.

Table: docs/benchmarks.md, "Log-prob parity on SmolLM2: sampler vs trainer, each vs float64
(`tools/bench_parity.py`)".

For a greedy and a temperature-1 rollout (``--prompts`` chat prompts, one row each,
``--new-tokens`` tokens, no early stop):

  * decode vs full: |sampler model_logp - trainer recomputed logp| per token (max, mean);
  * each vs float64: the same against ``rlvr_jax.model.reference`` (independent NumPy float64);
  * head only: the trainer's final hidden states scored by the sampler's head (one [B, D] x [D, V]
    matmul per position, then logsumexp) and by the trainer's chunked ``token_logprobs_from_hidden``,
    each against a float64 head on the same (float32) hidden states;
  * kernels: for the matmul shapes of one SmolLM2 layer, the fraction of outputs of an M-row
    product that are bitwise equal to the same rows of a 512-row product (XLA:CPU picks its dot
    kernel by shape), and each one's max error vs float64.

Usage (2-core CPU shared with other jobs; the numbers are errors, not timings; ``--json-out PATH``
writes the environment record and both tables' numbers):
  .venv/bin/python tools/bench_parity.py --prompts 8 --new-tokens 64     # ~4 min of CPU
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")  # as the tests

from rlvr_jax.logprobs import token_logprobs_from_hidden  # noqa: E402
from rlvr_jax.model import load_smollm2, logits_from_hidden, unembed_matrix  # noqa: E402
from rlvr_jax.model.reference import token_logprobs_f64  # noqa: E402
from rlvr_jax.sampling import Greedy, Temperature, generate, recompute_logprobs  # noqa: E402
from rlvr_jax.sampling.parity import completion_hidden  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

PROMPTS = [
  "What is 12 + 7? Answer with a number.",
  "Name the capital of France.",
  "Write a haiku about the sea.",
  "Explain gravity in one sentence.",
  "List three colours.",
  "What is the square root of 81?",
  "Tell me a fun fact about cats.",
  "Translate 'hello' into Spanish.",
]


def _stats(err: np.ndarray) -> list[float]:
  """[max, mean] of an error array."""
  return [float(np.max(err)), float(np.mean(err))]


def _text(stats: list[float]) -> str:
  return f"{stats[0]:.1e} / {stats[1]:.1e}"


def _head_f64(hidden: np.ndarray, unembed: np.ndarray, tokens: np.ndarray) -> np.ndarray:
  z = hidden.astype(np.float64) @ unembed
  top = z.max(axis=-1, keepdims=True)
  lse = top[..., 0] + np.log(np.exp(z - top).sum(axis=-1))
  return np.take_along_axis(z, tokens[..., None], axis=-1)[..., 0] - lse


def parity_rows(params, config, tokenizer, num_prompts: int, new_tokens: int) -> list[dict]:
  """One row per rollout (greedy, temperature 1): each comparison's [max, mean] error; printed as
  the first table's rows."""
  chats = [[{"role": "user", "content": p}] for p in (PROMPTS * 4)[:num_prompts]]
  tokens, mask = tokenizer.encode_batch(tokenizer.apply_chat_template(chats))
  unembed = unembed_matrix(params, config)
  unembed64 = np.asarray(unembed, np.float64)

  @jax.jit
  def sampler_head(hidden, targets):  # one [B, D] x [D, V] product per position, as decoding
    def one(args):
      h, y = args
      z = logits_from_hidden(params, h, config)
      return jnp.take_along_axis(z, y[:, None], axis=-1)[:, 0] - jax.nn.logsumexp(z, axis=-1)

    return jax.lax.map(one, (jnp.swapaxes(hidden, 0, 1), targets.T)).T

  rows = []
  for strategy in (Greedy(), Temperature(1.0)):
    rollout = generate(
      params,
      np.asarray(tokens),
      np.asarray(mask),
      config=config,
      num_samples=1,
      strategy=strategy,
      key=jax.random.key(0),
      max_new_tokens=new_tokens,
      stop_tokens=(),
    )
    assert np.asarray(rollout.completion_mask).all()
    sampler = np.asarray(rollout.model_logp, np.float64)
    _, trainer = recompute_logprobs(params, rollout, config=config, strategy=strategy)
    trainer = np.asarray(trainer, np.float64)
    prompt_tokens, prompt_mask = np.asarray(rollout.prompt_tokens), np.asarray(rollout.prompt_mask)
    completions = np.asarray(rollout.tokens)
    sequences = [
      np.concatenate([p[m], c])
      for p, m, c in zip(prompt_tokens, prompt_mask, completions, strict=True)
    ]
    truth = np.stack(token_logprobs_f64(params, config, sequences, prompt_mask.sum(axis=1)))
    hidden = completion_hidden(params, rollout, config=config)
    head_sampler = np.asarray(sampler_head(hidden, rollout.tokens), np.float64)
    head_trainer, _ = token_logprobs_from_hidden(
      hidden, unembed, rollout.tokens, compute_entropy=False
    )
    head_trainer = np.asarray(head_trainer, np.float64)
    head_truth = _head_f64(np.asarray(hidden), unembed64, completions)
    row = {
      "rollout": type(strategy).__name__,
      "tokens": int(sampler.size),
      "decode_vs_full": _stats(np.abs(sampler - trainer)),
      "decode_vs_f64": _stats(np.abs(sampler - truth)),
      "full_vs_f64": _stats(np.abs(trainer - truth)),
      "head_sampler_vs_trainer": _stats(np.abs(head_sampler - head_trainer)),
      "head_sampler_vs_f64": _stats(np.abs(head_sampler - head_truth)),
      "head_trainer_vs_f64": _stats(np.abs(head_trainer - head_truth)),
    }
    rows.append(row)
    cells = [row["rollout"], row["tokens"]] + [_text(v) for v in list(row.values())[2:]]
    print(harness.table_row(cells), flush=True)
  return rows


def kernel_rows(config, seed: int = 0) -> list[dict]:
  """One row per matmul shape: the share of bitwise-equal outputs per M, and the errors vs
  float64 of the 512-row and the 1-row products; printed as the second table's rows."""
  rng = np.random.default_rng(seed)
  D, F, NH = config.hidden_size, config.intermediate_size, config.num_heads * config.head_dim
  matmul = jax.jit(lambda x, w: x @ w)
  rows = []
  for k, n in ((D, NH), (D, F), (F, D), (D, config.vocab_size)):
    w = jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), jnp.float32)
    x = jnp.asarray(rng.standard_normal((512, k)), jnp.float32)
    full = np.asarray(matmul(x, w))
    truth = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    equal = {}
    for m in (1, 4, 8, 32, 48, 64):
      part = np.asarray(matmul(x[:m], w))
      equal[m] = float(np.mean(part == full[:m]))
    one = np.concatenate([np.asarray(matmul(x[i : i + 1], w)) for i in range(16)])
    errors = [float(np.abs(full - truth).max()), float(np.abs(one - truth[:16]).max())]
    rows.append({"product": f"[M, {k}] x [{k}, {n}]", "bitwise_equal_share": equal,
                 "max_error_vs_f64_512_rows_1_row": errors})  # fmt: skip
    cells = [f"{v:.2f}" for v in equal.values()] + [f"{errors[0]:.1e} / {errors[1]:.1e}"]
    print(harness.table_row([rows[-1]["product"], *cells]), flush=True)
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--prompts", type=int, default=8)
  parser.add_argument("--new-tokens", type=int, default=64)
  harness.add_common_args(parser)
  args = parser.parse_args()
  env = harness.environment()
  print(harness.header(env))
  params, config, tokenizer = load_smollm2()
  print(
    "| rollout | tokens | decode vs full (max / mean) | decode vs f64 | full vs f64 | head only: "
    "sampler vs trainer | sampler head vs f64 | trainer head vs f64 |\n|---|---|---|---|---|---|---|---|"
  )
  parity = parity_rows(params, config, tokenizer, args.prompts, args.new_tokens)
  print(
    "\n| product | M=1 | M=4 | M=8 | M=32 | M=48 | M=64 | max error vs f64: 512 rows / 1 row |\n"
    "|---|---|---|---|---|---|---|---|"
  )
  kernels = kernel_rows(config)
  if args.json_out:
    harness.write_json(args.json_out, {"settings": vars(args), "parity": parity,
                                       "kernels": kernels}, env)  # fmt: skip


if __name__ == "__main__":
  main()
