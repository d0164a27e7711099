"""One update of rlvr_jax vs PyTorch + transformers (TRL's GRPO update) on one GPU, in one command.

Table: docs/benchmarks.md, "One update against PyTorch + transformers on one GPU
(`tools/bench_accelerator.py`)" (under "The update on an accelerator").

  python tools/bench_accelerator.py --json-out /tmp/bench_accelerator.json   # ~8 min on an H200
  python tools/bench_accelerator.py --tiny --packing off --rounds 1           # CPU, seconds

The model is a named Hugging Face config (``MODELS``, embedded: no download) with random weights.
For each shape (rows x tokens per row; all tokens real, the prompt 1/8 of the row; ``--lengths
longtail`` gives completions a long-tailed length mix instead, the rest right padding) one
update = forward + backward + AdamW over the step batch, split in M micro-batches
(``ROWSxTOKENS:M`` or ``:M_OURS/M_TORCH``; default: rows per micro-batch such that it holds at
most ``--microbatch-tokens`` tokens; the same rows x tokens per update on both sides):

  ours:  ``train.step.make_train_step`` (objective "grpo", token-mean aggregation, on-policy,
         the trainer's fused AdamW ``train.optimizer.OptimizerSpec``) on a ``TrainBatch``, model
         ``ModelConfig.from_hf_dict(d, dtype="float32", compute_dtype="bfloat16", remat=True,
         attention=--attention)``; with ``--packing`` the batch goes through
         ``train.packing.pack_batch(batch, num_microbatches=M)`` first (host time: ``pack_s``).
  torch: what TRL's GRPOTrainer runs per update with bf16=True: float32 master weights,
         ``torch.autocast(bfloat16)`` around the forward, outputs cast to float32 (accelerate's
         ``convert_outputs_to_fp32``), activation checkpointing per decoder layer (non-reentrant),
         ``attn_implementation="sdpa"``, ``logits_to_keep=T+1``, TRL's per-row selective
         log-softmax (gather, then one ``logsumexp`` per row), loss -min(r A, clip(r, 1-e, 1+e) A)
         summed over completion tokens / their count, ``clip_grad_norm_(1.0)``,
         ``torch.optim.AdamW(fused=True)``. Same lr / betas / eps / clip as ours.

Each (side, shape) runs in its own worker process (``harness.Worker``; so peak memory is per side):
ours then torch build and warm up (``--warmup`` updates, compiles), then ``--rounds`` interleaved
rounds (ours, torch, ours, torch, ...). While one side computes the other sits idle holding its
memory (JAX's pool does not shrink); a side that runs out of memory next to the other is measured
again alone, and only an OOM alone is reported as OOM (``alone: true`` marks such a measurement).
Workers run with ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` and ``XLA_PYTHON_CLIENT_MEM_FRACTION=0.95``
(unless set), so JAX may use about as much of the GPU as torch.

Model FLOPs of one update (matmuls only; biases, norms, softmax not counted), over real tokens:
  6 * P_ne * sum_b S_b              P_ne = L (D N H + 2 D K H + N H D + 3 D F), non-embedding
  + 6 * D * V * sum_b T_b           the LM head, on the completion tokens (the only logits used)
  + 6 * L * N * H * sum_b S_b^2     causal attention: (QK^T + PV = 4 N H S^2) / 2, x 3 fwd+bwd
S_b = tokens of row b (prompt + completion), T_b = its completion tokens. Hardware FLOPs add the
forward that per-layer checkpointing recomputes (both sides): + 2 P_ne sum S_b + 2 L N H sum S_b^2.
TFLOP/s = FLOPs / median seconds; "% peak" = model TFLOP/s / the best bf16 [n, n] @ [n, n]
matmul measured in the same process (``harness.matmul_peak``, ``harness.torch_matmul_peak``;
n = 8192 on GPU).
Peak memory: ``memory_stats()["peak_bytes_in_use"]`` / ``torch.cuda.max_memory_allocated()`` over
the worker's life (weights, optimizer state, activations; the matmul peak is measured after).

Also (ours only): the rollout's tokens/s (``sampling.generate``, the trainer's entry point, mixed
precision, temperature 1, no stop token: every row generates all tokens; ``--rollout
ROWSxNEWxPROMPT``, G = 8 samples per prompt, or 1 when 8 does not divide the rows); static
against continuous batching (``--continuous ROWSxSLOTSxPROMPTxMEDIANxP99xMAX_NEW``: B rows with
long-tailed lengths imposed as per-row budgets, log-normal with that median and 99th percentile;
the static sampler in calls of SLOTS rows, the continuous one with SLOTS slots; tokens/s, the
useful-token fraction, decode steps, and the fraction of the decode roofline
``decode_roofline``, from a measured copy bandwidth and bf16 matmul peak); and whole RL steps of ``train.loop.Trainer``
(``--rl-step PROMPTSxGROUPxNEW``, model ``--rl-step-model``, default the same): the random weights
are exported with ``model.export_hf`` (bfloat16 on disk) with a word-level tokenizer over the
full vocabulary, then loaded as ``model.source="hf"``; arithmetic prompts (a few tokens), the
arithmetic reward; phases from the trainer's metrics (time/sample, time/reward, time/rollout,
time/update, time/step).

Budget: no measurement (worker, round, part) starts after ``--budget-s`` seconds, and a worker
still running ``--grace-s`` later is stopped (reported as timeout): the defaults end within 8
minutes. A warm-up + 3 rounds x 4 shapes is most of it on an H200 (each worker compiles or builds
its model once); the rollout and RL-step parts get what is left, and are skipped when it is
spent (``--parts`` chooses). ``JAX_COMPILATION_CACHE_DIR`` makes a second run compile less.

The table: shape (micro-batches ours/torch) | ours: median s [min-max] (model TFLOP/s, % peak,
peak GB) | torch: the same | ratio = ours median s / torch median s (< 1: ours is faster).

JSON (``--json-out``, ``harness.write_json``): {tool, argv, environment (``harness.environment``:
date, git commit and dirty flag, machine, versions, environment variables; jax's devices are not
asked in the parent, which would take GPU memory from the workers), git_commit (the commit,
"+dirty" when tracked files changed), machine: {ours_platform, ours_device, torch_platform,
torch_device, jax_version, torch_version} (what the workers saw), settings:
{model, model_config, attention, packing, lengths, rounds, warmup, optimizer, clip, ...},
flop_formula, shapes: [{shape, rows, tokens_per_row, prompt_tokens, completion_tokens, tokens,
microbatches: [ours, torch], non_embedding_params, model_flops, hardware_flops, ratio, ours and
torch: {status: ok | oom | error | timeout | skipped, error, alone, seconds: [per round],
warmup_s, median_s, min_s, max_s, model_tflops, hardware_tflops, matmul_peak_flops,
matmul_peak_tflops, peak_fraction, peak_memory_bytes (null on CPU), max_rss_bytes, microbatches,
ours: packed (the layout or false), pack_s}}], rollout: {status, rows, new_tokens, prompt_tokens, group,
first_call_s, seconds, median_s, tokens_per_s, peak_memory_bytes} | null, continuous: {status,
rows, slots, prompt_tokens, max_new_tokens, median_length, p99_length, tokens, same_tokens
({continuous, continuous_pallas}: bool), bandwidth_bytes_per_s, matmul_peak_flops, static,
continuous and continuous_pallas: {seconds, median_s, tokens_per_s, steps, useful_fraction,
bytes, flops, roofline_s, bound, roofline_fraction}, speedup, pallas_over_einsum} | null, rl_step: {status,
model, prompts, group, new_tokens, export_s, first_step, steps: [{time/...}], median: {time/...},
peak_memory_bytes} | null, wall_s}.

Dependencies on a GPU machine: jax with CUDA, optax, torch, transformers (the update and rollout
parts need nothing else of ours). The RL-step part builds the whole trainer: it also needs
ml-collections, datasets and tensorboardX; a part whose imports fail is reported as an error.

Tunix (google-tunix on PyPI) is not a third column: 0.1.7 (the newest) requires
``safetensors<0.8`` and 0.1.6 ``transformers<=4.57.1``, against our pins (safetensors 0.8.0,
transformers 5.23.0), and both pull tensorflow-datasets, grain, qwix, kagglehub, perfetto and
more that we do not install; its GRPO update is reachable only through its RL cluster / learner
with its own flax-nnx model classes, not as a step on a batch.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import harness  # noqa: E402


def _hf_configs() -> dict:
  """``rlvr_jax.model.config.HF_CONFIGS``, read from its file: the torch worker must not import
  ``rlvr_jax.model`` (it imports jax)."""
  path = os.path.join(ROOT, "rlvr_jax", "model", "config.py")
  spec = importlib.util.spec_from_file_location("_rlvr_jax_model_config", path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up there
  spec.loader.exec_module(module)
  return module.HF_CONFIGS


# Hugging Face config.json contents (random weights are drawn from them; nothing is downloaded).
MODELS = {
  **_hf_configs(),
  "tiny": dict(
    architectures=["Qwen2ForCausalLM"],
    model_type="qwen2",
    rms_norm_eps=1e-6,
    rope_theta=1e6,
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    tie_word_embeddings=True,
    max_position_embeddings=1024,
    bos_token_id=1,
    eos_token_id=1,
  ),  # fmt: skip
}
DEFAULT_SHAPES = "64x1024,8x4096,2x16384,1x32768"
DEFAULTS = dict(model="Qwen/Qwen2.5-1.5B", shapes=DEFAULT_SHAPES, rollout="256x512x256",
                continuous="512x256x256x512x8192x8192", rl_step="4x8x256")  # fmt: skip
TINY = dict(model="tiny", shapes="4x64:2,2x128", rollout="8x16x8", continuous="32x16x8x4x32x32",
            rl_step="2x2x8")  # fmt: skip
OPTIM = dict(learning_rate=1e-6, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.0, grad_clip=1.0)
CLIP = 0.2  # GRPO's epsilon (both sides, symmetric)
SIDES = ("ours", "torch")


# ------------------------------------------------------------------------------ shapes and FLOPs
@dataclasses.dataclass(frozen=True)
class Shape:
  rows: int
  tokens: int  # S, tokens per row
  microbatches: tuple[int, int]  # (ours, torch)

  @property
  def name(self) -> str:
    return f"{self.rows}x{self.tokens}"


def parse_shapes(text: str, microbatch_tokens: int) -> list[Shape]:
  """``ROWSxTOKENS[:M | :M_OURS/M_TORCH],...``; M defaults to the fewest micro-batches (a divisor
  of ROWS) with at most ``microbatch_tokens`` tokens each (one row each when a row is longer)."""
  shapes = []
  for item in text.split(","):
    dims, _, micro = item.strip().partition(":")
    rows, tokens = (int(x) for x in dims.split("x"))
    if micro:
      ms = [int(x) for x in micro.split("/")]
      ms = ms * 2 if len(ms) == 1 else ms
    else:
      m = next(m for m in range(1, rows + 1) if rows % m == 0 and
               (rows // m) * tokens <= max(microbatch_tokens, tokens))  # fmt: skip
      ms = [m, m]
    if tokens < 8 or any(rows % m for m in ms):
      raise ValueError(f"shape {item!r}: needs >= 8 tokens and micro-batches that divide the rows")
    shapes.append(Shape(rows, tokens, tuple(ms)))
  return shapes


def row_lengths(shape: Shape, lengths: str, seed: int = 0):
  """(prompt tokens Sp, completion tokens T_b per row [B]): Sp = S / 8, T = S - Sp; "uniform":
  every T_b = T; "longtail": T_b log-normal around T / 4, the longest row T (the batch width)."""
  import numpy as np

  sp = shape.tokens // 8
  t = shape.tokens - sp
  if lengths == "uniform":
    return sp, np.full(shape.rows, t, np.int64)
  rng = np.random.default_rng(seed)
  frac = np.clip(np.exp(rng.normal(np.log(0.25), 0.9, shape.rows)), 1.0 / t, 1.0)
  frac[np.argmax(frac)] = 1.0
  return sp, np.maximum(1, np.round(frac * t)).astype(np.int64)


def update_flops(cfg, seq_lengths, completion_lengths) -> dict:
  """Model and hardware FLOPs of one update (module docstring) for a ``ModelConfig`` and the real
  tokens per row: ``seq_lengths`` S_b and ``completion_lengths`` T_b ([B] ints each)."""
  d, f, v, layers = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_layers
  n, k, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  non_embedding = layers * (d * n * h + 2 * d * k * h + n * h * d + 3 * d * f)
  tokens = sum(int(s) for s in seq_lengths)
  squares = sum(int(s) ** 2 for s in seq_lengths)
  linear = 6 * non_embedding * tokens
  head = 6 * d * v * sum(int(t) for t in completion_lengths)
  attention = 6 * layers * n * h * squares
  model = linear + head + attention
  return {
    "non_embedding_params": non_embedding,
    "model_flops": model,
    "hardware_flops": model + (linear + attention) // 3,  # + the recomputed layer forward
  }


def make_rows(shape: Shape, lengths: str, vocab: int, seed: int = 0):
  """The step batch both sides train on: tokens [B, S] (0 after a row's end), completion lengths
  [B], prompt width Sp, one advantage per row [B]."""
  import numpy as np

  sp, comp = row_lengths(shape, lengths, seed)
  rng = np.random.default_rng(seed + 1)
  tokens = rng.integers(3, vocab, (shape.rows, shape.tokens)).astype(np.int32)
  tokens[np.arange(shape.tokens)[None, :] >= (sp + comp)[:, None]] = 0
  advantages = rng.normal(size=shape.rows).astype(np.float32)
  return tokens, comp, sp, advantages


# ------------------------------------------------------------------------------ worker helpers
def _is_oom(e: BaseException) -> bool:
  text = f"{type(e).__name__} {e}".lower()
  return "resource_exhausted" in text or "out of memory" in text or "outofmemory" in text


def _run_guarded(fn):
  """fn()'s reply, or {"status": "oom" | "error", "error": ...} when it raises."""
  try:
    return fn()
  except Exception as e:  # noqa: BLE001 - reported to the parent, which records it
    status = "oom" if _is_oom(e) else "error"
    return {"status": status, "error": (str(e).strip().splitlines() or [type(e).__name__])[0][:300],
            "traceback": traceback.format_exc()[-2000:]}  # fmt: skip


def _timed(fn) -> dict:
  """One call of ``fn`` (it waits for its own work) as a worker's reply."""
  return {"status": "ok", "seconds": harness.timed(fn, block=False)[0]}


def _max_rss_bytes() -> int:
  import resource

  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _jax_info() -> dict:
  import jax

  dev = jax.devices()[0]
  return {"platform": dev.platform, "device": dev.device_kind, "jax": jax.__version__}


def _jax_peak_memory():
  import jax

  stats = jax.devices()[0].memory_stats() or {}
  return stats.get("peak_bytes_in_use")


def _jax_model(spec: dict, **overrides):
  """``ModelConfig`` of ``MODELS[spec["model"]]``: float32 weights, bfloat16 compute."""
  from rlvr_jax import model

  kwargs = dict(dtype="float32", compute_dtype="bfloat16", attention=spec["attention"])
  return model.ModelConfig.from_hf_dict(MODELS[spec["model"]], **(kwargs | overrides))


# ------------------------------------------------------------------------------ the workers
def ours_update_worker(spec: dict, channel):
  import jax
  import jax.numpy as jnp
  import numpy as np

  from rlvr_jax import model
  from rlvr_jax.train import optimizer as optimizer_lib
  from rlvr_jax.train import step as step_lib
  from rlvr_jax.train.state import TrainBatch, init_state

  shape = Shape(spec["rows"], spec["tokens"], tuple(spec["microbatches"]))
  m = shape.microbatches[0]
  cfg = _jax_model(spec, remat=True)
  opt = optimizer_lib.OptimizerSpec(schedule="constant", warmup_steps=0, final_lr_fraction=0.1,
                                    **OPTIM)  # fmt: skip
  train_step = step_lib.make_train_step(
    model_config=cfg, optimizer=opt, objective="grpo",
    objective_kwargs={"loss_agg_mode": "token_mean", "clip_low": CLIP, "clip_high": CLIP},
    num_microbatches=m, temperature=1.0, on_policy=True,
  )  # fmt: skip
  tokens, comp, sp, adv = make_rows(shape, spec["lengths"], cfg.vocab_size)
  t = shape.tokens - sp
  cmask = np.arange(t)[None, :] < comp[:, None]
  zeros = jnp.zeros(cmask.shape, jnp.float32)
  batch = TrainBatch(
    tokens=jnp.asarray(tokens), positions=jnp.broadcast_to(jnp.arange(shape.tokens), tokens.shape),
    completion_mask=jnp.asarray(cmask), advantages=jnp.asarray(adv[:, None] * cmask),
    old_logp=zeros, sampler_logp=zeros, ref_logp=None, extras={},
  )  # fmt: skip
  info = {"status": "ok", **_jax_info(), "microbatches": m, "packed": False}
  layout = spec["packing"]
  if layout == "auto":  # the trainer's rl.packing='auto' (train.config.packing_layout)
    layout = {"gpu": "ragged", "tpu": "rows"}.get(jax.default_backend(), "off")
  if layout != "off":
    from rlvr_jax.train import packing

    t0 = time.perf_counter()
    batch = packing.pack_batch(batch, num_microbatches=m, layout=layout)
    info.update(packed=layout, pack_s=time.perf_counter() - t0)
  state = {"s": init_state(model.init_params(cfg, jax.random.key(0)), opt, jax.random.key(1))}
  args = (batch, float(cmask.sum()), float(shape.rows), jax.random.key(2))

  def update():
    state["s"], metrics = train_step(state["s"], *args)
    jax.block_until_ready(metrics)

  warm = [_timed(update)["seconds"] for _ in range(spec["warmup"])]
  channel.send({**info, "warmup_s": warm})

  def finish():
    peak_memory = _jax_peak_memory()
    best = max(harness.matmul_peak(spec["peak_n"], repeats=5, dtype=jnp.bfloat16) for _ in range(2))
    return {"status": "ok", "peak_memory_bytes": peak_memory, "max_rss_bytes": _max_rss_bytes(),
            "matmul_peak_flops": best}  # fmt: skip

  channel.serve({"step": lambda: _run_guarded(lambda: _timed(update)), "finish": finish})


def selective_log_softmax(logits, index):
  """TRL's ``selective_log_softmax`` on float32 logits [B, T, V]: the taken tokens' logits minus
  a ``logsumexp`` computed one row at a time (never a [B, T, V] log_softmax)."""
  import torch

  selected = torch.gather(logits, dim=-1, index=index.unsqueeze(-1)).squeeze(-1)
  return selected - torch.stack([torch.logsumexp(row, dim=-1) for row in logits])


def torch_model(name: str, device: str):
  """A randomly initialised transformers model of ``MODELS[name]`` (float32, sdpa) on ``device``,
  activation checkpointing on, as TRL's GRPOTrainer trains it."""
  import torch
  import transformers

  d = dict(MODELS[name])
  hf_cfg = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
  hf_cfg.use_cache = False
  with torch.device(device):
    model = transformers.AutoModelForCausalLM.from_config(
      hf_cfg, attn_implementation="sdpa", dtype=torch.float32
    )
  if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5
    model.activation_checkpointing_enable({"use_reentrant": False})
  else:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
  model.train()
  return model


def torch_update_worker(spec: dict, channel):
  import torch

  cuda = torch.cuda.is_available()
  device = "cuda" if cuda else "cpu"
  sync = torch.cuda.synchronize if cuda else (lambda: None)
  torch.set_num_threads(os.cpu_count() or 1)
  torch.manual_seed(0)
  shape = Shape(spec["rows"], spec["tokens"], tuple(spec["microbatches"]))
  m = shape.microbatches[1]
  model = torch_model(spec["model"], device)
  opt = torch.optim.AdamW(model.parameters(), lr=OPTIM["learning_rate"], fused=True,
                          betas=(OPTIM["b1"], OPTIM["b2"]), eps=OPTIM["eps"],
                          weight_decay=OPTIM["weight_decay"])  # fmt: skip
  tokens, comp, sp, adv = make_rows(shape, spec["lengths"], model.config.vocab_size)
  t = shape.tokens - sp
  ids = torch.as_tensor(tokens, dtype=torch.long, device=device)
  attention_mask = (torch.arange(shape.tokens)[None, :] < torch.as_tensor(sp + comp)[:, None]).to(
    device, torch.long
  )
  cmask = attention_mask[:, sp:].float()
  adv = torch.as_tensor(adv, device=device)[:, None]
  num_tokens = cmask.sum()
  chunks = [slice(i * shape.rows // m, (i + 1) * shape.rows // m) for i in range(m)]

  def micro_batch(rows: slice):
    with torch.autocast(device_type=device, dtype=torch.bfloat16):
      out = model(input_ids=ids[rows], attention_mask=attention_mask[rows], logits_to_keep=t + 1)
    logits = out.logits.float()[:, :-1]  # accelerate converts the outputs to float32
    logp = selective_log_softmax(logits, ids[rows, sp:])
    ratio = torch.exp(logp - logp.detach())  # on-policy: old log-probs = these, detached
    a = adv[rows]
    per_token = -torch.min(ratio * a, torch.clamp(ratio, 1 - CLIP, 1 + CLIP) * a)
    ((per_token * cmask[rows]).sum() / num_tokens).backward()  # token mean over the step batch

  def update():
    sync()
    opt.zero_grad(set_to_none=True)
    for rows in chunks:
      micro_batch(rows)
    torch.nn.utils.clip_grad_norm_(model.parameters(), OPTIM["grad_clip"])
    opt.step()
    sync()

  if cuda:
    torch.cuda.reset_peak_memory_stats()
  warm = [_timed(update)["seconds"] for _ in range(spec["warmup"])]
  info = {"status": "ok", "platform": device, "torch": torch.__version__, "microbatches": m,
          "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu"}  # fmt: skip
  channel.send({**info, "warmup_s": warm})

  def finish():
    peak_memory = torch.cuda.max_memory_allocated() if cuda else None
    peak = harness.torch_matmul_peak(spec["peak_n"], device=device)
    return {"status": "ok", "peak_memory_bytes": peak_memory, "max_rss_bytes": _max_rss_bytes(),
            "matmul_peak_flops": peak}  # fmt: skip

  channel.serve({"step": lambda: _run_guarded(lambda: _timed(update)), "finish": finish})


def rollout_worker(spec: dict, channel):
  import jax
  import numpy as np

  from rlvr_jax import model, sampling

  rows, new, prompt = spec["rollout"]
  group = 8 if rows % 8 == 0 else 1
  cfg = _jax_model(spec)
  params = model.init_params(cfg, jax.random.key(0))
  ids = np.random.default_rng(0).integers(3, cfg.vocab_size, (rows // group, prompt), np.int32)

  def generate(i):
    out = sampling.generate(
      params, ids, np.ones(ids.shape, bool), config=cfg, num_samples=group,
      strategy=sampling.Temperature(1.0), key=jax.random.key(i), max_new_tokens=new,
      stop_tokens=(), buckets=(prompt,),
    )  # fmt: skip
    jax.block_until_ready(out.tokens)
    return int(np.asarray(out.completion_mask).sum())

  first, generated = harness.timed(lambda: generate(0), block=False)
  seconds = []
  while len(seconds) < spec["rounds"] and (not seconds or time.time() < spec["stop_at"]):
    seconds.append(harness.timed(lambda: generate(len(seconds) + 1), block=False)[0])
  med = statistics.median(seconds)
  channel.send({
    "status": "ok", **_jax_info(), "rows": rows, "new_tokens": new, "prompt_tokens": prompt,
    "group": group, "generated_per_call": generated, "first_call_s": first, "seconds": seconds,
    "median_s": med, "tokens_per_s": rows * new / med, "peak_memory_bytes": _jax_peak_memory(),
  })  # fmt: skip


def decode_roofline(
  cfg,
  *,
  prompt: int,
  lengths,
  steps: int,
  bandwidth: float,
  peak: float,
  weight_bytes: int = 2,
  kv_bytes: int = 2,
) -> dict:
  """The decode roofline of rows with completion ``lengths`` (prompt ``prompt`` tokens each) in
  ``steps`` decode steps: every step reads the weights (non-embedding and the [D, V]
  unembedding, ``weight_bytes`` each) once, and each decoded token (t = 1 .. len - 1) reads its
  row's live keys / values (prompt + t entries of L x 2 x K x H values, ``kv_bytes`` each);
  matmul FLOPs 2 (P_ne + D V) per token plus attention 4 L N H (prompt + t). The roofline is
  max(bytes / bandwidth, FLOPs / peak) over the whole call."""
  import numpy as np

  lengths = np.asarray(lengths, np.int64)
  ctx = float(sum(prompt * (n - 1) + n * (n - 1) / 2 for n in lengths))  # sum of prompt + t
  tokens = float((lengths - 1).sum())
  p_ne = update_flops(cfg, [1], [1])["non_embedding_params"]
  unembed = cfg.hidden_size * cfg.vocab_size
  kv_per_entry = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * kv_bytes
  nbytes = steps * (p_ne + unembed) * weight_bytes + ctx * kv_per_entry
  flops = 2 * (p_ne + unembed) * tokens + 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * ctx
  seconds = max(nbytes / bandwidth, flops / peak)
  return {"bytes": nbytes, "flops": flops, "roofline_s": seconds,
          "bound": "memory" if nbytes / bandwidth >= flops / peak else "compute"}  # fmt: skip


def device_bandwidth(n_bytes: int = 1 << 30) -> float:
  """Bytes/s of a jitted elementwise pass over a bfloat16 array (read once, written once)."""
  import jax
  import jax.numpy as jnp

  x = jnp.ones((n_bytes // 2,), jnp.bfloat16)
  f = jax.jit(lambda a: a * jnp.bfloat16(1.0001))
  return 2 * n_bytes / harness.time_calls(lambda: f(x), warmup=1, repeats=10).min


def continuous_worker(spec: dict, channel):
  """Static against continuous batching on long-tailed lengths (``--continuous``): B rows of
  G = 8 samples, lengths imposed as per-row budgets from a log-normal (median, p99), no stop
  token. The static sampler runs the rows in calls of ``slots`` rows (the memory of the slots),
  the continuous one all rows through ``slots`` slots, with the einsum decode attention and with
  Pallas' decode kernel (``decode_attention='pallas_gpu'``); all give the same tokens."""
  import jax
  import numpy as np
  from bench_continuous import synthetic_lengths

  from rlvr_jax import model, sampling
  from rlvr_jax.sampling import continuous

  rows, slots, prompt, median, p99, new = spec["continuous"]
  group = 8 if rows % 8 == 0 and slots % 8 == 0 else 1
  cfg = _jax_model(spec)
  params = model.init_params(cfg, jax.random.key(0))
  ids = np.random.default_rng(0).integers(3, cfg.vocab_size, (rows // group, prompt), np.int32)
  lengths = synthetic_lengths(rows, median=median, p99=p99, max_len=new)
  kw = dict(config=cfg, num_samples=group, strategy=sampling.Temperature(1.0), max_new_tokens=new,
            stop_tokens=(), buckets=(prompt,))  # fmt: skip
  per_call = slots // group

  def static(budgets):
    out = []
    for c in range(0, rows // group, per_call):
      r = slice(c * group, (c + per_call) * group)
      out.append(sampling.generate(
        params, ids[c : c + per_call], np.ones((per_call, prompt), bool), key=jax.random.key(0),
        prompt_ids=np.arange(c, c + per_call), max_lengths=budgets[r], **kw,
      ).tokens)  # fmt: skip
    return jax.block_until_ready(out)

  def slotted(budgets, decode_attention="xla"):
    out, stats = continuous.generate(
      params, ids, np.ones(ids.shape, bool), key=jax.random.key(0), num_slots=slots,
      max_lengths=budgets, with_stats=True,
      **dict(kw, config=cfg.replace(decode_attention=decode_attention)),
    )  # fmt: skip
    return jax.block_until_ready(out.tokens), stats

  runs = {"static": static, "continuous": slotted,
          "continuous_pallas": functools.partial(slotted, decode_attention="pallas_gpu")}  # fmt: skip
  # Compile each with 2-token budgets (the budgets are traced: the same programs).
  first = {
    name: harness.timed(lambda fn=fn: fn(np.full(rows, 2, np.int32)), block=False)[0]
    for name, fn in runs.items()
  }
  seconds = {name: [] for name in runs}
  same, stats = {}, None
  while len(seconds["static"]) < spec["rounds"] and (
    not seconds["static"] or time.time() < spec["stop_at"]):  # fmt: skip
    t, a = harness.timed(lambda: static(lengths), block=False)
    seconds["static"].append(t)
    a = np.concatenate([np.asarray(x) for x in a])
    for name in ("continuous", "continuous_pallas"):
      t, (b, stats) = harness.timed(lambda name=name: runs[name](lengths), block=False)
      seconds[name].append(t)
      same.setdefault(name, bool(np.array_equal(a, np.asarray(b))))
  bandwidth, peak = device_bandwidth(), harness.matmul_peak(spec["peak_n"], dtype="bfloat16")
  static_steps = sum(int(lengths[c * group:(c + per_call) * group].max()) - 1
                     for c in range(0, rows // group, per_call))  # fmt: skip
  tokens = int(lengths.sum())
  out = {"status": "ok", **_jax_info(), "rows": rows, "slots": slots, "prompt_tokens": prompt,
         "max_new_tokens": new, "median_length": float(np.median(lengths)),
         "p99_length": float(np.percentile(lengths, 99)), "tokens": tokens, "same_tokens": same,
         "first_call_s": first, "bandwidth_bytes_per_s": bandwidth, "matmul_peak_flops": peak,
         "peak_memory_bytes": _jax_peak_memory()}  # fmt: skip
  steps_of = {"static": static_steps, "continuous": stats["steps"],
              "continuous_pallas": stats["steps"]}  # fmt: skip
  for name, steps in steps_of.items():
    med = statistics.median(seconds[name])
    useful = (tokens - rows) / (steps * slots)
    roof = decode_roofline(cfg, prompt=prompt, lengths=lengths, steps=steps, bandwidth=bandwidth,
                           peak=peak)  # fmt: skip
    out[name] = {"seconds": seconds[name], "median_s": med, "tokens_per_s": tokens / med,
                 "steps": steps, "useful_fraction": useful, **roof,
                 "roofline_fraction": roof["roofline_s"] / med}  # fmt: skip
  out["speedup"] = out["continuous"]["tokens_per_s"] / out["static"]["tokens_per_s"]
  out["pallas_over_einsum"] = (
    out["continuous_pallas"]["tokens_per_s"] / out["continuous"]["tokens_per_s"]
  )
  channel.send(out)


def _word_tokenizer(vocab_size: int):
  """A word-level tokenizer over the whole vocabulary: <pad> 0, <eos> 1, one id per printable
  character (prompts tokenise per character), the rest placeholders."""
  import tokenizers
  import transformers

  words = ["<pad>", "<eos>"] + [chr(c) for c in range(33, 127)]
  words += [f"<{i}>" for i in range(len(words), vocab_size)]
  raw = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)},
                                                         unk_token="<pad>"))  # fmt: skip
  raw.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex(r"\S"), "isolated")
  return transformers.PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>",
                                              eos_token="<eos>")  # fmt: skip


def rl_step_worker(spec: dict, channel):
  import jax

  from rlvr_jax import model
  from rlvr_jax.train import config as config_lib
  from rlvr_jax.train.loop import Trainer

  prompts, group, new = spec["rl_step"]
  folder = tempfile.mkdtemp(prefix="rl_step_", dir=spec["folder"])
  cfg = _jax_model({**spec, "model": spec["rl_step_model"]}, dtype="bfloat16",
                   eos_token_ids=(1,), pad_token_id=0, bos_token_id=None)  # fmt: skip
  t0 = time.perf_counter()
  params = model.init_params(cfg, jax.random.key(0))
  hf = os.path.join(folder, "hf")
  model.export_hf(params, cfg, hf, tokenizer=_word_tokenizer(cfg.vocab_size))
  del params
  export_s = time.perf_counter() - t0
  c = config_lib.base_config()
  c.workdir = os.path.join(folder, "run")
  c.model.update(source="hf", path=hf, dtype="float32", compute_dtype="bfloat16", remat=True,
                 attention=spec["attention"])  # fmt: skip
  c.tokenizer.kind = "model"
  c.data.update(num_eval=4, prompt_bucket=16)
  c.sampling.update(num_samples=group, max_new_tokens=new, temperature=1.0)
  c.rl.update(num_steps=1 + spec["rounds"], prompts_per_step=prompts, zero_variance="keep")
  c.reward.num_workers = 1
  c.eval.every = c.checkpoint.every = 0
  c.checkpoint.resume = False
  c.logging.update(progress=False, tensorboard=False, plot=False)
  trainer = Trainer(c, log=lambda s: print(s, file=sys.stderr, flush=True))
  try:
    trainer.restore_or_start()
    keys = ("time/sample", "time/reward", "time/rollout", "time/update", "time/step")
    steps = []
    while len(steps) < 1 + spec["rounds"] and (len(steps) < 2 or time.time() < spec["stop_at"]):
      m = trainer.rl_step(len(steps))
      steps.append({k: m[k] for k in keys if k in m})
  finally:
    trainer.close()
    shutil.rmtree(folder, ignore_errors=True)  # the exported weights (3 GB at 1.5B) and the run
  measured = steps[1:]
  channel.send({
    "status": "ok", **_jax_info(), "model": spec["rl_step_model"], "prompts": prompts,
    "group": group, "new_tokens": new, "export_s": export_s, "first_step": steps[0],
    "steps": measured, "median": {k: statistics.median(s[k] for s in measured) for k in keys
                                  if measured and k in measured[0]},
    "peak_memory_bytes": _jax_peak_memory(),
  })  # fmt: skip


WORKERS = {"ours": ours_update_worker, "torch": torch_update_worker, "rollout": rollout_worker,
           "continuous": continuous_worker, "rl_step": rl_step_worker}  # fmt: skip


def worker_main(kind: str, spec: dict):
  channel = harness.Channel()
  reply = _run_guarded(lambda: WORKERS[kind](spec, channel))
  if reply is not None:  # the build failed: say so (a worker that served returns None)
    channel.send(reply)


# ------------------------------------------------------------------------------ the parent side
class Worker(harness.Worker):
  """One worker process (its own process group: a late worker is stopped with what it started,
  reward workers); replies are read with a deadline (a late worker is killed), and a failure is
  a reply {"status": "timeout" | "oom" | "error", "error": ...}."""

  def __init__(self, kind: str, spec: dict, folder: str, deadline: float):
    self.kind = kind
    env = harness.child_env()
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
    env.setdefault("HF_HUB_OFFLINE", "1")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, json.dumps(spec)]
    log_path = os.path.join(folder, f"{kind}_{spec.get('shape', kind)}.log")
    super().__init__(cmd, log_path=log_path, env=env, deadline=deadline)

  def read(self) -> dict:
    try:
      return super().read()
    except harness.WorkerTimeout as e:
      return {"status": "timeout", "error": str(e)}
    except harness.WorkerExited as e:
      tail = e.log_tail[-1500:]
      status = "oom" if "out of memory" in tail.lower() else "error"
      return {"status": status, "error": f"worker exited ({e.returncode}): {tail}"}

  def close(self):
    super().close(timeout=30)


def measure_shape(shape: Shape, base: dict, folder: str, clock) -> dict:
  """Both sides of one shape: interleaved rounds; a side that fails next to the other, again
  alone (module docstring)."""
  spec = dict(base, rows=shape.rows, tokens=shape.tokens, microbatches=list(shape.microbatches),
              shape=shape.name)  # fmt: skip
  out = {side: {"status": "skipped", "error": "budget spent", "seconds": []} for side in SIDES}
  alone = []
  workers = {}
  try:
    for side in SIDES:
      if not clock.may_start():
        break
      w = Worker(side, spec, folder, clock.hard_deadline)
      reply = w.read()
      out[side] = {**reply, "seconds": []}
      print(
        f"#   {side}: {reply['status']} {reply.get('warmup_s', reply.get('error'))}", flush=True
      )
      if reply["status"] == "ok":
        workers[side] = w
      else:
        w.close()
        if reply["status"] == "oom" and workers:
          alone.append(side)
    _rounds(workers, out, base["rounds"], clock, alone)
  finally:
    for w in workers.values():
      w.close()
  for side in alone:  # out of memory next to the other side's idle memory: again on its own
    if clock.may_start():
      w = Worker(side, spec, folder, clock.hard_deadline)
      try:
        reply = w.read()
        out[side] = {**reply, "seconds": [], "alone": True}
        if reply["status"] == "ok":
          _rounds({side: w}, out, base["rounds"], clock, [])
      finally:
        w.close()
  return out


def _rounds(workers: dict, out: dict, rounds: int, clock, alone: list):
  for _ in range(rounds):
    if not clock.may_start(first_round=not any(out[s]["seconds"] for s in workers)):
      break
    for side, w in list(workers.items()):
      reply = w.ask("step")
      if reply["status"] != "ok":
        out[side].update(status=reply["status"], error=reply.get("error"))
        w.close()
        del workers[side]
        if reply["status"] == "oom" and workers:
          alone.append(side)
        continue
      out[side]["seconds"].append(reply["seconds"])
      print(f"#   {side}: {reply['seconds']:.3f} s", flush=True)
  for side, w in workers.items():
    out[side].update(w.ask("finish"))


class Clock:
  """The budget: no new measurement after ``budget_s``; workers stopped ``grace_s`` later."""

  def __init__(self, budget_s: float, grace_s: float):
    self.t0 = time.time()
    self.start_deadline = self.t0 + budget_s
    self.hard_deadline = self.start_deadline + grace_s

  def may_start(self, first_round: bool = False) -> bool:
    """Whether a measurement may start: before the budget's end, or a built worker's first round
    (its compilation is paid for; one round is short)."""
    return first_round or time.time() < self.start_deadline


def summarise_side(r: dict, flops: dict) -> dict:
  s = r.get("seconds") or []
  if r.get("status") != "ok" or not s:
    return r
  t = harness.Timing(s)
  med = t.median
  peak = r.get("matmul_peak_flops")
  return {
    **r, "median_s": med, "min_s": t.min, "max_s": t.max,
    "model_tflops": flops["model_flops"] / med / 1e12,
    "hardware_tflops": flops["hardware_flops"] / med / 1e12,
    "matmul_peak_tflops": peak / 1e12 if peak else None,
    "peak_fraction": flops["model_flops"] / med / peak if peak else None,
  }  # fmt: skip


def _side_cell(r: dict) -> str:
  if "median_s" not in r:
    return r.get("status", "?").upper() + (" (alone)" if r.get("alone") else "")
  gb, frac = r.get("peak_memory_bytes"), r.get("peak_fraction")
  parts = [f"{r['model_tflops']:.3g} TFLOP/s", f"{100 * frac:.0f}% peak" if frac else "peak n/a"]
  parts.append(f"{gb / 1e9:.1f} GB" if gb else "memory n/a")
  rng = f" [{r['min_s']:.3g}-{r['max_s']:.3g}]" if len(r["seconds"]) > 1 else ""
  notes = [
    n for n, on in (("alone", r.get("alone")), (str(r.get("packed")), r.get("packed"))) if on
  ]
  return f"{r['median_s']:.3g} s{rng} ({', '.join(parts)})" + "".join(f" {n}" for n in notes)


def markdown(report: dict) -> str:
  lines = [f"model {report['settings']['model']}, attention {report['settings']['attention']}, "
           f"packing {report['settings']['packing']}, lengths {report['settings']['lengths']}",
           "", "| shape (M ours/torch) | ours s (TFLOP/s, % peak, peak GB) | torch s (...) | "
           "ratio ours s / torch s |", "|---|---|---|---|"]  # fmt: skip
  for row in report["shapes"]:
    ratio = f"{row['ratio']:.2f}" if row["ratio"] is not None else "-"
    m = "/".join(str(x) for x in row["microbatches"])
    lines.append(f"| {row['shape']} ({m}) | {_side_cell(row['ours'])} | "
                 f"{_side_cell(row['torch'])} | {ratio} |")  # fmt: skip
  ro = report.get("rollout") or {}
  if "tokens_per_s" in ro:
    lines.append(f"\nrollout {ro['rows']} rows x {ro['new_tokens']} new tokens (prompt "
                 f"{ro['prompt_tokens']}): {ro['tokens_per_s']:.0f} tokens/s, "
                 f"{ro['median_s']:.3g} s per call")  # fmt: skip
  elif ro:
    lines.append(f"\nrollout: {ro.get('status')}: {ro.get('error', '')[:200]}")
  co = report.get("continuous") or {}
  if "speedup" in co:
    lines.append(
      f"\ncontinuous batching, {co['rows']} rows through {co['slots']} slots (prompt "
      f"{co['prompt_tokens']}, lengths median {co['median_length']:.0f} / p99 "
      f"{co['p99_length']:.0f}, same tokens: {co['same_tokens']}):\n"
      "| sampler | tokens/s | useful fraction | decode steps | % of roofline (bound) |\n"
      "|---|---|---|---|---|"
    )
    for name in ("static", "continuous", "continuous_pallas"):
      r = co[name]
      lines.append(f"| {name} | {r['tokens_per_s']:.0f} | {r['useful_fraction']:.2f} | "
                   f"{r['steps']} | {100 * r['roofline_fraction']:.0f}% ({r['bound']}) |")  # fmt: skip
    lines.append(f"speed-up (useful tokens/s): {co['speedup']:.2f}x; Pallas decode kernel / "
                 f"einsum: {co['pallas_over_einsum']:.2f}x")  # fmt: skip
  elif co:
    lines.append(f"\ncontinuous: {co.get('status')}: {co.get('error', '')[:200]}")
  rl = report.get("rl_step") or {}
  if rl.get("median"):
    phases = ", ".join(f"{k.split('/')[1]} {v:.3g} s" for k, v in rl["median"].items())
    lines.append(f"\nRL step ({rl['model']}, {rl['prompts']} prompts x {rl['group']} samples x "
                 f"{rl['new_tokens']} new tokens): {phases}")  # fmt: skip
  elif rl:
    lines.append(f"\nRL step: {rl.get('status')}: {rl.get('error', '')[:200]}")
  return "\n".join(lines)


def _git_commit(env: dict) -> str | None:
  git = env["git"]
  return git["commit"] + ("+dirty" if git["dirty"] else "") if git["commit"] else None


def parse_args(argv=None):
  from rlvr_jax.model.config import ATTENTION_IMPLEMENTATIONS

  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--model", choices=sorted(MODELS), help="default Qwen/Qwen2.5-1.5B")
  p.add_argument("--shapes", help=f"ROWSxTOKENS[:M | :M_OURS/M_TORCH],... ({DEFAULT_SHAPES})")
  p.add_argument("--microbatch-tokens", type=int, default=16384, help="default micro-batch size")
  p.add_argument("--lengths", default="uniform", choices=("uniform", "longtail"))
  p.add_argument("--attention", default="auto", choices=ATTENTION_IMPLEMENTATIONS)
  p.add_argument(
    "--packing", default="auto", choices=("auto", "off", "rows", "ragged"),
    help="our update's layout (train.packing); auto: ragged on GPU, rows on TPU, off on CPU",
  )  # fmt: skip
  p.add_argument("--parts", default="update,rollout,continuous,rl_step")
  p.add_argument("--rollout", help="ROWSxNEW_TOKENSxPROMPT_TOKENS (256x512x256)")
  p.add_argument(
    "--continuous", help="ROWSxSLOTSxPROMPTxMEDIANxP99xMAX_NEW (512x256x256x512x8192x8192)"
  )
  p.add_argument("--rl-step", help="PROMPTSxGROUPxNEW_TOKENS (4x8x256)")
  p.add_argument("--rl-step-model", choices=sorted(MODELS), help="default: --model")
  p.add_argument("--budget-s", type=float, default=420.0)
  p.add_argument("--grace-s", type=float, default=60.0)
  p.add_argument("--tiny", action="store_true", help=f"CPU-sized defaults: {TINY}")
  harness.add_common_args(p, rounds=3, warmup=1)
  p.add_argument("--out-dir", default="", help="worker logs (default: a temporary folder)")
  args = p.parse_args(argv)
  for name, value in (TINY if args.tiny else DEFAULTS).items():
    if getattr(args, name) is None:
      setattr(args, name, value)
  args.rl_step_model = args.rl_step_model or args.model
  return args


def main(argv=None):
  if len(sys.argv) > 1 and sys.argv[1] == "--worker" and argv is None:
    return worker_main(sys.argv[2], json.loads(sys.argv[3]))
  from rlvr_jax.model import ModelConfig

  args = parse_args(argv)
  clock = Clock(args.budget_s, args.grace_s)
  folder = args.out_dir or tempfile.mkdtemp(prefix="bench_accelerator_")
  os.makedirs(folder, exist_ok=True)
  parts = set(args.parts.split(","))
  base = dict(model=args.model, attention=args.attention, packing=args.packing, lengths=args.lengths,
              rounds=args.rounds, warmup=args.warmup, peak_n=256 if args.tiny else 8192,
              folder=folder, rl_step_model=args.rl_step_model,
              rollout=[int(x) for x in args.rollout.split("x")],
              continuous=[int(x) for x in args.continuous.split("x")],
              rl_step=[int(x) for x in args.rl_step.split("x")])  # fmt: skip
  cfg = ModelConfig.from_hf_dict(MODELS[args.model])
  env = harness.environment(packages=("torch", "transformers", "optax"), devices="none")
  print(harness.header(env), flush=True)
  report = {
    "git_commit": _git_commit(env), "machine": {},
    "settings": {k: v for k, v in base.items() if k != "folder"} | {"model_config": MODELS[args.model],
                                                                    "optimizer": OPTIM, "clip": CLIP},
    "flop_formula": __doc__.split("Model FLOPs")[1].split("TFLOP/s =")[0].strip(),
    "shapes": [], "rollout": None, "continuous": None, "rl_step": None,
  }  # fmt: skip
  for shape in parse_shapes(args.shapes, args.microbatch_tokens) if "update" in parts else []:
    print(f"# {shape.name}, micro-batches {shape.microbatches}", flush=True)
    sp, comp = row_lengths(shape, args.lengths)
    flops = update_flops(cfg, sp + comp, comp)
    res = measure_shape(shape, base, folder, clock)
    sides = {side: summarise_side(res[side], flops) for side in SIDES}
    a, b = sides["ours"].get("median_s"), sides["torch"].get("median_s")
    report["shapes"].append({
      "shape": shape.name, "rows": shape.rows, "tokens_per_row": shape.tokens, "prompt_tokens": sp,
      "completion_tokens": int(comp.sum()), "tokens": int((sp + comp).sum()),
      "microbatches": list(shape.microbatches), **flops, **sides,
      "ratio": a / b if a and b else None,
    })  # fmt: skip
    for side in SIDES:  # what the workers saw: device names and versions
      names = {"platform": f"{side}_platform", "device": f"{side}_device", "jax": "jax_version",
               "torch": "torch_version"}  # fmt: skip
      for k, name in names.items():
        if k in sides[side]:
          report["machine"].setdefault(name, sides[side][k])
  for part in ("rollout", "continuous", "rl_step"):
    if part in parts:
      if not clock.may_start():
        report[part] = {"status": "skipped", "error": "budget spent"}
        continue
      print(f"# {part}", flush=True)
      w = Worker(part, dict(base, stop_at=clock.start_deadline), folder, clock.hard_deadline)
      try:
        report[part] = w.read()
      finally:
        w.close()
  report["wall_s"] = time.time() - clock.t0
  text = markdown(report)
  if args.json_out:
    harness.write_json(args.json_out, report, env, tool="tools/bench_accelerator.py",
                       argv=sys.argv[1:] if argv is None else argv)  # fmt: skip
  print(text)
  print(f"# wall {report['wall_s']:.0f} s; worker logs in {folder}")
  return report


if __name__ == "__main__":
  main()
