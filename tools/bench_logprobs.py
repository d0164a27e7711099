"""Benchmark: log-probs + entropy + GRPO loss from hidden states, forward and backward, vs TRL and verl.

Table: docs/benchmarks.md, "Log-probs + entropy + GRPO loss from hidden states, forward and
backward (`tools/bench_logprobs.py`)".

Every contender computes, from the same seeded inputs (hidden [1, T, D], unembedding [D, V] with D = 896
as in Qwen2.5-0.5B and the real Qwen vocabulary V = 151,936, next tokens [1, T]):

  logp, H = log-probs and full-vocabulary entropy of softmax(hidden @ W)        (float32)
  L = token-mean PPO-clip (eps 0.2/0.2, group advantages) - 1e-3 * token-mean H
  grads of L w.r.t. hidden and W

Contenders (each in its own subprocess, ``harness.run_child``, so peak memory and time are clean):

  jax_chunked     rlvr_jax.logprobs (custom VJP, per-chunk recomputation) + rlvr_jax.losses.grpo_objective
  jax_fused       rlvr_jax.logprobs.fused_objective_from_hidden: the same grpo_objective fused into one
                  sweep over 64-token x whole-vocabulary tiles (gradient in the forward pass, 3 matmuls)
  jax_remat       same math as plain autodiff of log_softmax, jax.checkpoint per chunk inside lax.map
  trl_logits      TRL's public functions: logits = hidden @ W.T, trl.trainer.utils.selective_log_softmax,
                  trl.trainer.utils.entropy_from_logits (the pre-1.x GRPOTrainer path)
  trl_fused       trl.kernels.ChunkedLogProbFunction (what GRPOTrainer 1.16 runs via add_fused_lm_head;
                  on CPU it uses its torch fallback, tiles of 4096 tokens x 32768 vocab)
  verl_logits     verl 0.9.1: logits = hidden @ W.T, verl.utils.torch_functional.logprobs_from_logits
                  (no flash-attn on CPU: logprobs_from_logits_v2) and entropy_from_logits
  verl_fused      verl 0.9.1: verl.utils.experimental.torch_functional.FusedLinearForPPO (torch backend,
                  chunk 512; what use_fused_kernels=True runs)

verl does not install into this environment (its package import pulls in Ray and more); the two verl
contenders load its files from the downloaded 0.9.1 wheel: pass `--verl-src DIR` (the unzipped wheel,
holding `verl/`) and `--verl-deps DIR` (a pip `--target` dir with tensordict, pyvers, cloudpickle,
orjson, importlib_metadata). Without them the verl contenders are skipped.

Peak memory = the subprocess's peak RSS (VmHWM, reset through /proc/self/clear_refs after imports,
input creation and JAX compilation) minus its RSS at that point. Time = median over `--reps` runs
after `--warmup` runs (``harness.time_calls``). Before timing, a correctness check runs every
contender on a small case (T = 128, same D and V) against a float64 PyTorch reference.

  HF_HUB_OFFLINE=1 .venv/bin/python tools/bench_logprobs.py --tokens 2048 8192 \
      --verl-src /tmp/verl_src --verl-deps /tmp/verl_deps

``--json-out PATH``: the environment record, the check and the timings as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

D_MODEL = 896  # Qwen2.5-0.5B hidden size
VOCAB = 151_936  # Qwen2/2.5 vocabulary
NUM_SAMPLES = 8  # group size for the advantages
CLIP = 0.2
ENTROPY_COEF = 1e-3
CONTENDERS = (
  "jax_fused",
  "jax_chunked",
  "jax_remat",
  "trl_logits",
  "trl_fused",
  "verl_logits",
  "verl_fused",
)


# ------------------------------------------------------------------------------------------------
# Process memory.


def _status_kib(field):
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1])
  raise KeyError(field)


def _reset_peak():
  with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)


# ------------------------------------------------------------------------------------------------
# Inputs (written once by the `prepare` worker, read by every contender).


def _prepare(path, num_tokens, seed):
  """Seeded inputs; old_logp = exact logp + N(0, 0.1) so some ratios clip."""
  import jax
  import jax.numpy as jnp

  from rlvr_jax import logprobs

  rng = np.random.default_rng(seed)
  hidden = rng.standard_normal((1, num_tokens, D_MODEL), np.float32)
  unembed = (rng.standard_normal((D_MODEL, VOCAB), np.float32) * (3.0 / np.sqrt(D_MODEL))).astype(
    np.float32
  )
  tokens = rng.integers(0, VOCAB, (1, num_tokens)).astype(np.int64)
  logp, _ = jax.jit(
    lambda h, w, y: logprobs.token_logprobs_from_hidden(h, w, y, compute_entropy=False)
  )(hidden, unembed, jnp.asarray(tokens, jnp.int32))
  old_logp = (np.asarray(logp) + 0.1 * rng.standard_normal((1, num_tokens))).astype(np.float32)
  rewards = rng.integers(0, 2, NUM_SAMPLES).astype(np.float64)
  rewards[0], rewards[1] = 0.0, 1.0  # not a zero-variance group
  adv_g = (rewards - rewards.mean()) / (rewards.std(ddof=1) + 1e-6)  # GRPO z-score (METHODS §2.1)
  segment = (np.arange(num_tokens) * NUM_SAMPLES) // num_tokens  # T tokens as G packed samples
  advantages = adv_g[segment][None].astype(np.float32)
  mask = np.ones((1, num_tokens), bool)
  mask[:, int(0.95 * num_tokens) :] = False  # padded tail
  np.savez(
    path,
    hidden=hidden,
    unembed=unembed,
    tokens=tokens,
    old_logp=old_logp,
    advantages=advantages,
    mask=mask,
  )


# ------------------------------------------------------------------------------------------------
# Contenders. Each builder returns step() -> (loss, logp, entropy, grad_hidden, grad_unembed [D, V]).


def _torch_loss(logp, entropy, old_logp, advantages, mask):
  import torch

  n = mask.sum()
  ratio = torch.exp(torch.clamp(logp - old_logp, -20.0, 20.0))
  per_token = torch.maximum(
    -advantages * ratio, -advantages * torch.clamp(ratio, 1 - CLIP, 1 + CLIP)
  )
  policy = torch.where(mask, per_token, 0.0).sum() / n
  return policy - ENTROPY_COEF * torch.where(mask, entropy, 0.0).sum() / n


def _build_torch(name, data, args):
  import torch

  dtype = torch.float64 if name == "reference" else torch.float32
  hidden = torch.tensor(data["hidden"], dtype=dtype, requires_grad=True)
  weight = torch.tensor(
    data["unembed"].T.copy(), dtype=dtype, requires_grad=True
  )  # [V, D] like lm_head
  tokens = torch.tensor(data["tokens"])
  old_logp = torch.tensor(data["old_logp"], dtype=dtype)
  advantages = torch.tensor(data["advantages"], dtype=dtype)
  mask = torch.tensor(data["mask"])

  if name == "reference":

    def stats():
      ls = torch.log_softmax(hidden @ weight.T, -1)
      return ls.gather(-1, tokens[..., None])[..., 0], -(ls.exp() * ls).sum(-1)

  elif name == "trl_logits":
    from trl.trainer.utils import entropy_from_logits, selective_log_softmax

    def stats():
      logits = hidden @ weight.T
      return selective_log_softmax(logits, tokens), entropy_from_logits(logits)

  elif name == "trl_fused":
    from trl.kernels import ChunkedLogProbFunction
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

    def stats():
      out = ChunkedLogProbFunction.apply(
        hidden.reshape(-1, D_MODEL),
        weight,
        None,
        tokens.reshape(-1),
        1.0,
        _CHUNKED_LOGPROB_CHUNK_SIZE,
        None,
        1.0,
        ("entropy",),
      )
      return out[0].view(tokens.shape), out[1].view(tokens.shape)

  elif name == "verl_logits":
    import types

    for mod, sub in (("verl", "verl"), ("verl.utils", "verl/utils")):  # skip verl/__init__ (Ray)
      package = types.ModuleType(mod)
      package.__path__ = [os.path.join(args.verl_src, sub)]
      sys.modules[mod] = package
    from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

    def stats():
      logits = hidden @ weight.T
      return logprobs_from_logits(logits, tokens), entropy_from_logits(logits)

  elif name == "verl_fused":
    import importlib.util

    path = os.path.join(args.verl_src, "verl/utils/experimental/torch_functional.py")
    spec = importlib.util.spec_from_file_location("verl_experimental_tf", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fused = module.FusedLinearForPPO(chunk_size=512, impl_backend="torch")

    def stats():
      return fused(hidden, weight, tokens, temperature=1.0)

  else:
    raise ValueError(name)

  def step():
    hidden.grad = None
    weight.grad = None
    logp, entropy = stats()
    loss = _torch_loss(logp, entropy, old_logp, advantages, mask)
    loss.backward()
    return loss, logp, entropy, hidden.grad, weight.grad

  def to_numpy(out):
    loss, logp, entropy, g_h, g_w = out
    return [x.detach().double().numpy() for x in (loss, logp, entropy, g_h)] + [
      g_w.detach().double().numpy().T
    ]

  return step, to_numpy


def _build_jax(name, data, args):
  import jax
  import jax.numpy as jnp

  from rlvr_jax import logprobs, losses

  hidden = jnp.asarray(data["hidden"])
  unembed = jnp.asarray(data["unembed"])
  tokens = jnp.asarray(data["tokens"], jnp.int32)
  old_logp = jnp.asarray(data["old_logp"])
  advantages = jnp.asarray(data["advantages"])
  mask = jnp.asarray(data["mask"])
  num_tokens = jnp.sum(mask).astype(jnp.float32)
  chunk = args.chunk_size or logprobs.DEFAULT_CHUNK_SIZE
  vocab_chunk = args.vocab_chunk_size or logprobs.DEFAULT_VOCAB_CHUNK_SIZE

  fused_chunk = args.chunk_size or logprobs.DEFAULT_FUSED_CHUNK_SIZE
  if name == "jax_fused":
    stats = None  # the loss and the statistics come from one fused call, below
  elif name == "jax_chunked":

    def stats(h, w):
      return logprobs.token_logprobs_from_hidden(
        h, w, tokens, chunk_size=chunk, vocab_chunk_size=vocab_chunk
      )

  elif name == "jax_remat":
    chunk = args.chunk_size or 256  # whole-vocabulary rows: [chunk, V] float32 temporaries

    def stats(h, w):
      n = h.shape[1]
      pad = -n % chunk
      h_c = jnp.pad(h[0], ((0, pad), (0, 0))).reshape(-1, chunk, D_MODEL)
      y_c = jnp.pad(tokens[0], (0, pad)).reshape(-1, chunk)

      @jax.checkpoint
      def one_chunk(h_y):
        ls = jax.nn.log_softmax(jnp.dot(h_y[0], w, preferred_element_type=jnp.float32))
        logp = jnp.take_along_axis(ls, h_y[1][:, None], -1)[:, 0]
        return logp, -jnp.sum(jnp.exp(ls) * ls, -1)

      logp, entropy = jax.lax.map(one_chunk, (h_c, y_c))
      return logp.reshape(1, -1)[:, :n], entropy.reshape(1, -1)[:, :n]

  else:
    raise ValueError(name)

  def objective(logp, entropy):
    return losses.grpo_objective(
      logp,
      old_logp,
      advantages,
      mask,
      num_tokens=num_tokens,
      num_seqs=1.0,
      entropy=entropy,
      entropy_coef=ENTROPY_COEF,
      clip_low=CLIP,
      clip_high=CLIP,
      loss_agg_mode="token_mean",
    )[0]

  def loss_fn(h, w):
    if name == "jax_fused":
      loss, logp, entropy = logprobs.fused_objective_from_hidden(
        h, w, tokens, objective, chunk_size=fused_chunk, logp_fill=old_logp
      )
      return loss, (logp, entropy)
    logp, entropy = stats(h, w)
    return objective(logp, entropy), (logp, entropy)

  grad_fn = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True))
  compiled = grad_fn.lower(hidden, unembed).compile()  # compile before the memory baseline

  def step():
    (loss, (logp, entropy)), (g_h, g_w) = compiled(hidden, unembed)
    return jax.block_until_ready((loss, logp, entropy, g_h, g_w))

  def to_numpy(out):
    return [np.asarray(x, np.float64) for x in out]

  return step, to_numpy


def worker(*, name, inputs, result, mode, num_tokens, reps, warmup, seed, chunk_size,
           vocab_chunk_size, verl_src) -> dict:  # fmt: skip
  """In a child process: ``prepare`` the inputs, or run contender ``name`` once (``mode``
  "check": its outputs saved to ``result`` + ".npz") or time it (``mode`` "time")."""
  if name == "prepare":
    _prepare(inputs, num_tokens, seed)
    return {"ok": True}
  data = dict(np.load(inputs))
  build = _build_jax if name.startswith("jax") else _build_torch
  opts = argparse.Namespace(chunk_size=chunk_size, vocab_chunk_size=vocab_chunk_size,
                            verl_src=verl_src)  # fmt: skip
  step, to_numpy = build(name, data, opts)
  del data
  if mode == "check":
    np.savez(result + ".npz", *to_numpy(step()))
    return {"ok": True}
  import gc

  gc.collect()
  _reset_peak()
  base_kib = _status_kib("VmRSS")
  timing = harness.time_calls(step, warmup=warmup, repeats=reps)  # the warm-up counts for memory
  peak_kib = _status_kib("VmHWM")
  return {
    "times_s": timing.samples,
    "median_s": timing.median,
    "base_mib": base_kib / 1024,
    "peak_delta_mib": (peak_kib - base_kib) / 1024,
  }


# ------------------------------------------------------------------------------------------------
# Driver.


def _run_worker(name, inputs, result, args, mode, num_tokens=0, reps=0):
  kwargs = dict(name=name, inputs=inputs, result=result, mode=mode, num_tokens=num_tokens,
                reps=reps or args.reps, warmup=args.warmup, seed=args.seed,
                chunk_size=args.chunk_size, vocab_chunk_size=args.vocab_chunk_size,
                verl_src=args.verl_src)  # fmt: skip
  deps = args.verl_deps if name == "verl_logits" else ""  # keep verl's extra deps away from jax
  env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
         "PYTHONPATH": os.pathsep.join(p for p in (harness.ROOT, deps) if p)}  # fmt: skip
  try:
    return harness.run_child(harness.Child("tools/bench_logprobs.py:worker", kwargs, env))
  except harness.ChildFailed as e:
    return {"error": e.output.strip().splitlines()[-4:]}


def _rel_err(got, want):
  return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def _check(contenders, tmp, args):
  inputs = os.path.join(tmp, "check_inputs.npz")
  _run_worker("prepare", inputs, os.path.join(tmp, "prep.json"), args, "prepare", args.check_tokens)
  ref = _run_worker("reference", inputs, os.path.join(tmp, "ref.json"), args, "check")
  assert "error" not in ref, ref
  want = list(np.load(os.path.join(tmp, "ref.json.npz")).values())
  rows = {}
  for name in contenders:
    res = os.path.join(tmp, f"check_{name}.json")
    out = _run_worker(name, inputs, res, args, "check")
    if "error" in out:
      rows[name] = out
      continue
    got = list(np.load(res + ".npz").values())
    labels = ("loss", "logp", "entropy", "grad_hidden", "grad_unembed")
    rows[name] = {k: _rel_err(g, w) for k, g, w in zip(labels, got, want, strict=True)}
    rows[name]["logp_max_abs"] = float(np.abs(got[1] - want[1]).max())
    rows[name]["entropy_max_abs"] = float(np.abs(got[2] - want[2]).max())
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tokens", type=int, nargs="*", default=[2048, 8192])
  parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS))
  parser.add_argument("--reps", type=int, default=3)
  harness.add_common_args(parser, warmup=1, warmup_help="untimed runs before the timed ones")
  parser.add_argument("--reps-large", type=int, default=0, help="reps for T > 4096 (0: --reps)")
  parser.add_argument("--contenders-large", nargs="*", default=None, help="contenders for T > 4096")
  parser.add_argument("--chunk-size", type=int, default=0, help="0: library default")
  parser.add_argument("--vocab-chunk-size", type=int, default=0, help="0: library default")
  parser.add_argument("--check-tokens", type=int, default=128)
  parser.add_argument("--skip-check", action="store_true")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--verl-src", default="")
  parser.add_argument("--verl-deps", default="")
  args = parser.parse_args()

  contenders = [c for c in args.contenders if args.verl_src or not c.startswith("verl")]
  env = harness.environment(packages=("torch", "trl"), devices="subprocess")
  print(harness.header(env), flush=True)
  report = {"contenders": contenders, "settings": vars(args)}
  with tempfile.TemporaryDirectory() as tmp:
    if not args.skip_check:
      report["check"] = _check(contenders, tmp, args)
      print(json.dumps({"check": report["check"]}, indent=1), flush=True)
    report["timing"] = {}
    for num_tokens in args.tokens:
      inputs = os.path.join(tmp, f"inputs_{num_tokens}.npz")
      _run_worker("prepare", inputs, os.path.join(tmp, "p.json"), args, "prepare", num_tokens)
      large = num_tokens > 4096
      names = args.contenders_large if large and args.contenders_large is not None else contenders
      reps = args.reps_large if large and args.reps_large else args.reps
      for name in names:
        load = os.getloadavg()[0]
        res = os.path.join(tmp, f"t_{name}.json")
        out = _run_worker(name, inputs, res, args, "time", reps=reps)
        out["load_1min_before"] = load
        report["timing"][f"{name}@{num_tokens}"] = out
        print(name, num_tokens, json.dumps(out), flush=True)
      os.remove(inputs)
  report["load_after"] = os.getloadavg()
  if args.json_out:
    harness.write_json(args.json_out, report, env)


if __name__ == "__main__":
  main()
