"""End-to-end RL step, side by side: TRL's GRPOTrainer vs rlvr_jax's Trainer on SmolLM2-135M-Instruct.

Table: docs/benchmarks.md, "One RL step end to end: rlvr_jax vs TRL's GRPOTrainer
(`tools/bench_trl.py`)" (rendered by tools/bench_trl_report.py).

One spec (``Spec``) builds both sides' settings (``ours_config`` and ``trl_kwargs``), and
``compare`` reads them back and lists every setting the two share, so a mismatch is visible
(``mismatches`` is empty by construction; tests/test_bench_trl.py checks it):

  prompts per step P, group size G, new-token limit T, micro-batches M (gradient accumulation:
  one optimizer step of P*G rows per RL step, P*G/M rows per micro-batch), sampling at
  temperature 1 (no top-k / top-p), AdamW (lr, betas, eps, weight decay, global-norm clip,
  constant schedule), GRPO advantages (group mean / std), PPO-clip eps 0.2/0.2, loss
  aggregation ``seq_mean_token_mean`` = TRL ``loss_type="grpo"`` (a mean over rows of per-row
  token means; TRL takes it per micro-batch and divides by M, which is the same number for
  equal micro-batches), no KL (TRL beta = 0; our kl_coef = 0), activation checkpointing on both
  (TRL's default ``gradient_checkpointing=True``; our ``model.remat``, as the experiment sets).

Same prompts: the prompt stream of ``experiments/smollm2_arithmetic.py`` (arithmetic word problems
through the ChatML template), the first ``steps * P`` of it written once to ``prompts.jsonl``:
ours reads it from its own source (same config, same order), TRL gets it as a plain-text dataset
(already templated, ``shuffle_dataset=False``), and every step both sides report a hash of their
prompt texts and their prompt token count; the run stops if they differ. Same weights: ours
dequantised from the GGUF file, exported with ``export_hf`` (float32) for transformers. Same
reward: ``rewards.ArithmeticReward`` (ours in its reward worker process, TRL in-process).

Deliberate differences (documented in docs/benchmarks.md): zero-variance groups are kept
(``rl.zero_variance="keep"``: TRL always trains on them, with advantage 0); prompts are left
padded to one width for the run on our side (one compiled program; TRL pads per batch); ours
runs each group's prompt once in the update (``rl.share_prompts``, on by default: the same
values and gradients, P * S_prompt + B * T tokens of work instead of B * (S_prompt + T); TRL has
no such option; ``--share-prompts false`` turns it off).

Both workers (and the decode runs) start with the same glibc ``malloc`` tunables in their
environment (``rlvr_jax.host_memory``), by default the kept memory ``python -m rlvr_jax.main``
gives itself (``--malloc keep``; torch's CPU allocator takes its blocks from the same
``malloc`` and gains from it too); ``--malloc hugepages`` the huge pages alone, ``--malloc
none`` no tunables. ``--trl-malloc`` gives TRL's worker another setting than ours (``same``,
the default; ``none``: TRL as its users launch it, with no tunables).

Each side runs in its own long-lived worker process (tools/bench_trl_workers.py; a
``harness.Worker``) that waits on a pipe between steps, so only one side computes at a time. Per
precision: W warm-up steps each (compilation; not counted), then R interleaved rounds (ours, TRL,
ours, TRL, ...); the table shows per-phase medians (generation / reward / update / rest) and the
median and range over rounds of the per-round ratio TRL / ours. After the rounds each worker
measures its matmul peak in its precision (the best of large square products: ``jnp.dot`` in ours,
``torch.matmul`` in TRL's), and the update's achieved FLOP/s is model FLOPs (tools/bench_train.py
``update_flops``: forward + backward = 3 x forward, matmuls of every layer on every processed token,
full attention, unembedding on completion tokens; a shared prompt counted once, as it runs;
recomputation from checkpointing is not counted) / update time. Then decode tokens/s of our sampler
vs transformers ``generate`` (greedy, no early stop, batch P*G, T new tokens) in each precision, by
tools/bench_sampling.py.

Precisions: float32; bfloat16 where supported. TRL bfloat16 = ``bf16=True`` (torch autocast,
float32 master weights and optimizer state, transformers' standard mixed precision); ours =
``model.compute_dtype=bfloat16`` when the config has that field (else the bf16 rows say so).

  HF_HUB_OFFLINE=1 .venv/bin/python tools/bench_trl.py --out-dir /tmp/bench_trl

The results (``harness.write_json``: the environment record, the settings, every step's phases,
the summaries) go to OUT_DIR/bench_trl.json, and to ``--json-out PATH`` as well when given; the
tables to OUT_DIR/bench_trl.md and stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import harness  # noqa: E402

EXPERIMENT = os.path.join(ROOT, "experiments", "smollm2_arithmetic.py")
# TRL loss_type -> the rlvr_jax loss_agg_mode that computes the same number (docs/name_mapping.md).
TRL_LOSS_AGG = {
  "grpo": "seq_mean_token_mean",
  "dapo": "token_mean",
  "dr_grpo": "seq_mean_token_sum_norm",
}
# TRL scale_rewards -> our advantage estimator.
TRL_ADVANTAGE = {"group": "grpo", "batch": "lite_ppo", "none": "dr_grpo"}


class Unsupported(Exception):
  """A setting one side cannot run (e.g. our bfloat16 before ``model.compute_dtype`` exists)."""


@dataclasses.dataclass(frozen=True)
class Spec:
  """The one description both sides' settings are built from."""

  prompts_per_step: int = 4
  group_size: int = 4
  max_new_tokens: int = 64
  num_microbatches: int = 2
  learning_rate: float = 2e-6
  b1: float = 0.9
  b2: float = 0.99
  eps: float = 1e-8
  weight_decay: float = 0.0
  grad_clip: float = 1.0
  temperature: float = 1.0
  clip: float = 0.2
  remat: bool = True
  share_prompts: bool = True  # ours only: rl.share_prompts (TRL runs every row's prompt)
  malloc: str = "keep"  # both sides: host_memory setting ("keep", "hugepages") or "none"
  trl_malloc: str = "same"  # TRL's worker: "same" (as ``malloc``), or its own setting / "none"
  seed: int = 0
  dtype: str = "float32"
  prompt_width: int = 16  # our prompt padding (set to the run's longest prompt by ``prepare``)


def ours_config(spec: Spec, *, workdir: str, steps: int):
  """The rlvr_jax config: experiments/smollm2_arithmetic.py with the spec's settings."""
  from rlvr_jax import cli

  c = cli.load_config(EXPERIMENT)
  c.workdir = workdir
  c.seed = spec.seed
  c.rl.update(
    num_steps=steps,
    prompts_per_step=spec.prompts_per_step,
    num_microbatches=spec.num_microbatches,
    num_minibatches=1,
    num_epochs=1,
    zero_variance="keep",
    advantage="grpo",
    use_reference=False,
  )
  c.sampling.update(
    num_samples=spec.group_size,
    max_new_tokens=spec.max_new_tokens,
    temperature=spec.temperature,
    top_k=0,
    top_p=1.0,
  )
  c.optim.update(
    learning_rate=spec.learning_rate,
    schedule="constant",
    warmup_steps=0,
    b1=spec.b1,
    b2=spec.b2,
    eps=spec.eps,
    weight_decay=spec.weight_decay,
    grad_clip=spec.grad_clip,
  )
  c.objective.name = "grpo"
  c.objective.kwargs.clip_low = c.objective.kwargs.clip_high = spec.clip
  c.objective.kwargs.kl_coef = 0.0
  c.model.remat = spec.remat
  if "share_prompts" in c.rl:
    c.rl.share_prompts = spec.share_prompts
  c.data.prompt_bucket = spec.prompt_width
  c.data.num_eval = 4
  c.reward.num_workers = 1
  c.eval.every = 0
  c.checkpoint.every = 0
  c.checkpoint.resume = False
  c.logging.update(progress=False, tensorboard=False, plot=False)
  if spec.dtype != "float32":
    if "compute_dtype" not in c.model:
      raise Unsupported(
        f"rlvr_jax: config.model has no field compute_dtype in this checkout, so {spec.dtype} "
        "is not selectable yet"
      )
    c.model.compute_dtype = spec.dtype
  return c


def trl_kwargs(spec: Spec, *, output_dir: str, steps: int) -> dict:
  """``trl.GRPOConfig`` keyword arguments for the same spec (no trl import: tests run without it)."""
  rows = spec.prompts_per_step * spec.group_size
  return dict(
    output_dir=output_dir,
    max_steps=steps,
    seed=spec.seed,
    use_cpu=True,
    bf16=spec.dtype == "bfloat16",
    fp16=False,
    num_generations=spec.group_size,
    per_device_train_batch_size=rows // spec.num_microbatches,
    gradient_accumulation_steps=spec.num_microbatches,
    steps_per_generation=spec.num_microbatches,  # one generation batch = one optimizer step
    num_iterations=1,
    max_completion_length=spec.max_new_tokens,
    temperature=spec.temperature,
    top_k=0,
    top_p=1.0,
    learning_rate=spec.learning_rate,
    lr_scheduler_type="constant",
    warmup_steps=0,
    adam_beta1=spec.b1,
    adam_beta2=spec.b2,
    adam_epsilon=spec.eps,
    weight_decay=spec.weight_decay,
    max_grad_norm=spec.grad_clip,
    loss_type="grpo",
    scale_rewards="group",
    beta=0.0,
    epsilon=spec.clip,
    epsilon_high=spec.clip,
    mask_truncated_completions=False,
    gradient_checkpointing=spec.remat,
    use_vllm=False,
    shuffle_dataset=False,
    log_completions=False,
    report_to="none",
    save_strategy="no",
    logging_steps=10**6,
    disable_tqdm=True,
    dataloader_num_workers=0,
  )


def _objective_setting(c, name):
  from rlvr_jax import losses

  kwargs = {k: v for k, v in c.objective.kwargs.items() if v is not None}
  if name in kwargs:
    return kwargs[name]
  params = inspect.signature(losses.OBJECTIVES[c.objective.name].fn).parameters
  return params[name].default if name in params else None


def compare(c, t: dict) -> list[tuple[str, object, object]]:
  """(setting, ours, TRL) for every setting the two share, read back from the built configs."""
  P, G, M = c.rl.prompts_per_step, c.sampling.num_samples, c.rl.num_microbatches
  acc = t["gradient_accumulation_steps"]
  trl_opt_steps = t["num_iterations"] * t["steps_per_generation"] // acc
  return [
    ("group size", G, t["num_generations"]),
    ("prompts per step", P, t["per_device_train_batch_size"] * acc // t["num_generations"]),
    ("micro-batches per optimizer step", M, acc),
    ("rows per micro-batch", P * G // M, t["per_device_train_batch_size"]),
    ("optimizer steps per RL step", c.rl.num_epochs * c.rl.num_minibatches, trl_opt_steps),
    ("new-token limit", c.sampling.max_new_tokens, t["max_completion_length"]),
    ("temperature", c.sampling.temperature, t["temperature"]),
    ("top-k (0 = off)", c.sampling.top_k, t["top_k"]),
    ("top-p", c.sampling.top_p, t["top_p"]),
    ("learning rate", c.optim.learning_rate, t["learning_rate"]),
    ("lr schedule", c.optim.schedule, t["lr_scheduler_type"]),
    ("warm-up steps", c.optim.warmup_steps, t["warmup_steps"]),
    ("AdamW beta1", c.optim.b1, t["adam_beta1"]),
    ("AdamW beta2", c.optim.b2, t["adam_beta2"]),
    ("AdamW eps", c.optim.eps, t["adam_epsilon"]),
    ("weight decay", c.optim.weight_decay, t["weight_decay"]),
    ("grad-norm clip", c.optim.grad_clip, t["max_grad_norm"]),
    ("advantage", c.rl.advantage, TRL_ADVANTAGE.get(t["scale_rewards"])),
    ("loss aggregation", _objective_setting(c, "loss_agg_mode"), TRL_LOSS_AGG.get(t["loss_type"])),
    ("clip low", _objective_setting(c, "clip_low"), t["epsilon"]),
    ("clip high", _objective_setting(c, "clip_high"), t["epsilon_high"]),
    ("dual clip", _objective_setting(c, "dual_clip"), None),
    ("KL coefficient", _objective_setting(c, "kl_coef") or 0.0, t["beta"]),
    ("zero-variance groups trained on", c.rl.zero_variance == "keep", True),
    ("activation checkpointing", bool(c.model.remat), t["gradient_checkpointing"]),
    (
      "compute precision",
      c.model.get("compute_dtype", "float32"),
      "bfloat16" if t["bf16"] else "float32",
    ),
    ("seed", c.seed, t["seed"]),
  ]


def mismatches(c, t: dict) -> list[tuple[str, object, object]]:
  return [(name, a, b) for name, a, b in compare(c, t) if a != b]


# ------------------------------------------------------------------------------------ the run
def prepare(spec: Spec, steps: int, folder: str) -> Spec:
  """Exports the weights and tokenizer to ``folder/hf`` and the run's prompts to
  ``folder/prompts.jsonl``; returns the spec with our prompt width set to the longest prompt."""
  from rlvr_jax import data as data_lib
  from rlvr_jax.model import export_hf, load_smollm2

  params, config, tokenizer = load_smollm2("float32")
  export_hf(params, config, os.path.join(folder, "hf"), dtype="float32", tokenizer=tokenizer)
  del params
  c = ours_config(spec, workdir=os.path.join(folder, "unused"), steps=steps)
  source, _ = data_lib.build_sources(c.data)
  records = [r for _ in range(steps) for r in source.take(spec.prompts_per_step)]
  texts = data_lib.format_prompts(records, tokenizer, chat_template=True)
  lengths = [len(tokenizer.encode(t, add_special_tokens=False)) for t in texts]
  with open(os.path.join(folder, "prompts.jsonl"), "w") as f:
    for r, text in zip(records, texts, strict=True):
      f.write(json.dumps({"prompt": text, "answer": r["answer"]}) + "\n")
  return dataclasses.replace(spec, prompt_width=max(lengths))


def prompt_digest(texts) -> str:
  return hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16]


def worker_env(spec: Spec, side: str = "ours") -> dict:
  """The environment of a worker or decode process: this one, plus the malloc tunables of
  ``spec.malloc`` (by default what ``rlvr_jax.main`` sets for itself; torch's CPU allocator
  takes its blocks from the same ``malloc``), or of ``spec.trl_malloc`` for TRL's worker when
  that is not "same"; "none": none at all."""
  from rlvr_jax import host_memory

  setting = spec.trl_malloc if side == "trl" and spec.trl_malloc != "same" else spec.malloc
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  env.pop("GLIBC_TUNABLES", None)
  # Our worker applies the setting's jax half (host_memory.configure_jax) from this variable.
  env[host_memory.SETTING] = "0" if setting == "none" else setting
  if setting != "none":
    env["GLIBC_TUNABLES"] = host_memory.tunables(setting)
  return env


class Worker(harness.Worker):
  """One side's worker process, driven one command at a time over its stdin / stdout."""

  def __init__(self, side: str, spec: Spec, folder: str, steps: int):
    self.side = side
    cmd = [sys.executable, os.path.join(HERE, "bench_trl_workers.py"), side]
    cmd += [json.dumps(dataclasses.asdict(spec)), folder, str(steps)]
    super().__init__(cmd, log_path=os.path.join(folder, f"{side}_{spec.dtype}.log"),
                     env=worker_env(spec, side))  # fmt: skip
    try:
      self.ready = self.read()
    except Exception:
      self.close()
      raise

  def read(self) -> dict:
    try:
      reply = super().read()
    except harness.WorkerExited as e:
      raise RuntimeError(f"{self.side} worker exited ({e.returncode}):\n{e.log_tail}") from None
    if "unsupported" in reply:
      raise Unsupported(reply["unsupported"])
    return reply


def run_precision(spec: Spec, folder: str, *, warmup: int, rounds: int) -> dict:
  """Both sides in one precision: warm-up, interleaved rounds, matmul peaks."""
  steps = warmup + rounds
  workers = {}
  try:
    for side in ("ours", "trl"):
      workers[side] = Worker(side, spec, folder, steps)
      print(f"# {spec.dtype}: {side} worker ready: {workers[side].ready}", flush=True)
    records = {"ours": [], "trl": []}
    for i in range(steps):
      for side in ("ours", "trl"):  # the warm-up too, one side at a time
        r = workers[side].ask("step")
        records[side].append(r)
        print(f"# {spec.dtype} step {i} {side}: " + _phase_text(r), flush=True)
      a, b = records["ours"][-1], records["trl"][-1]
      if (a["prompt_digest"], a["prompt_tokens"]) != (b["prompt_digest"], b["prompt_tokens"]):
        raise RuntimeError(f"step {i}: the two sides saw different prompts: {a} vs {b}")
    peaks = {side: w.ask("peak")["matmul_peak_flops_per_s"] for side, w in workers.items()}
  finally:
    for w in workers.values():
      w.close()
  return {
    "ready": {side: w.ready for side, w in workers.items()},
    "warmup": {side: r[:warmup] for side, r in records.items()},
    "measured": {side: r[warmup:] for side, r in records.items()},
    "matmul_peak_flops_per_s": peaks,
  }


def _phase_text(r: dict) -> str:
  return ", ".join(f"{k} {r[k]:.2f} s" for k in ("step", "generation", "reward", "update"))


def decode_bench(spec: Spec, folder: str, rounds: int) -> dict:
  """tools/bench_sampling.py for batch P*G and T new tokens in the spec's precision."""
  path = os.path.join(folder, f"decode_{spec.dtype}.json")
  cmd = [sys.executable, os.path.join(HERE, "bench_sampling.py"), "--models", "smollm2"]
  cmd += ["--batch-sizes", str(spec.prompts_per_step * spec.group_size)]
  cmd += ["--new-tokens", str(spec.max_new_tokens), "--skip-compiled", "--dtype", spec.dtype]
  cmd += ["--rounds", str(rounds), "--json-out", path]
  proc = subprocess.run(cmd, capture_output=True, text=True, env=worker_env(spec))
  if proc.returncode != 0:
    return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
  return harness.read_json(path)["rows"][0]


def main():
  import bench_trl_report as report_lib

  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out-dir", default="")
  parser.add_argument("--dtypes", default="float32,bfloat16")
  harness.add_common_args(parser, rounds=3, warmup=1,
                          rounds_help="interleaved measured steps per side",
                          warmup_help="untimed steps per side (compiles)")  # fmt: skip
  parser.add_argument("--decode-rounds", type=int, default=3, help="0: skip the decode part")
  from rlvr_jax import host_memory

  settings = (*host_memory.SETTINGS, "none")
  choices = {"malloc": settings, "trl_malloc": ("same", *settings)}
  for f in dataclasses.fields(Spec):
    if f.name not in ("dtype", "prompt_width"):
      kind = (
        (lambda v: v.lower() in ("1", "true")) if isinstance(f.default, bool) else type(f.default)
      )
      parser.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=f.default,
                          choices=choices.get(f.name))  # fmt: skip
  args = parser.parse_args()
  folder = args.out_dir or tempfile.mkdtemp(prefix="bench_trl_")
  os.makedirs(folder, exist_ok=True)
  spec = Spec(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Spec)
                 if f.name not in ("dtype", "prompt_width")})  # fmt: skip
  env = harness.environment(packages=("torch", "transformers", "trl", "accelerate"))
  print(harness.header(env), flush=True)
  report = {
    "warmup": args.warmup,
    "rounds": args.rounds,
    "precisions": {},
    "decode": {},
  }
  t0 = time.perf_counter()
  spec = prepare(spec, args.warmup + args.rounds, folder)
  report["settings"] = dataclasses.asdict(spec)
  for dtype in args.dtypes.split(","):
    s = dataclasses.replace(spec, dtype=dtype)
    try:
      c = ours_config(s, workdir=os.path.join(folder, f"ours_{dtype}"), steps=1)
      t = trl_kwargs(s, output_dir=os.path.join(folder, f"trl_{dtype}"), steps=1)
      report["precisions"][dtype] = {"settings": [list(x) for x in compare(c, t)]}
      bad = mismatches(c, t)
      if bad:
        raise RuntimeError(f"settings differ between the two sides: {bad}")
      res = run_precision(s, folder, warmup=args.warmup, rounds=args.rounds)
      res["summary"] = report_lib.summarise(res)
      report["precisions"][dtype].update(res)
    except Unsupported as e:
      print(f"# {dtype}: skipped: {e}", flush=True)
      report["precisions"][dtype] = {"skipped": str(e)}
    if args.decode_rounds:
      report["decode"][dtype] = decode_bench(s, folder, args.decode_rounds)
  report["load_after"] = harness.load_text()
  report["wall_s"] = time.perf_counter() - t0
  doc = harness.write_json(os.path.join(folder, "bench_trl.json"), report, env)
  if args.json_out:
    harness.write_json(args.json_out, report, env)
  text = report_lib.markdown(doc)
  with open(os.path.join(folder, "bench_trl.md"), "w") as f:
    f.write(text)
  print(text)
  print(f"# wall {report['wall_s']:.0f} s; results in {folder}/bench_trl.json and bench_trl.md")


if __name__ == "__main__":
  main()
