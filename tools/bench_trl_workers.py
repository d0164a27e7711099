"""The two worker processes of tools/bench_trl.py: rlvr_jax's Trainer and TRL's GRPOTrainer.

Table: docs/benchmarks.md, "One RL step end to end: rlvr_jax vs TRL's GRPOTrainer
(`tools/bench_trl.py`)" (started by tools/bench_trl.py, not by hand).

  python tools/bench_trl_workers.py {ours|trl} SPEC_JSON FOLDER STEPS

A worker builds its trainer, writes one JSON line ("ready"), then answers commands read from stdin,
one JSON line each on the original stdout (everything else the libraries print goes to stderr;
``harness.Channel``): ``step`` (one RL step; its phase times), ``peak`` (matmul peak in the run's
precision: ``harness.matmul_peak`` / ``harness.torch_matmul_peak``), ``quit``. Between commands it
blocks on the pipe, so it computes only when asked.

Phases per RL step:
  ours: ``Trainer.rl_step``'s own timings: time/sample (generation), time/reward (reward workers;
        the no-grad passes dispatched meanwhile overlap it), time/update (all micro-batches and
        the optimizer step, until the metrics are on the host), time/step (the whole step).
  TRL:  step = ``on_step_begin`` to ``on_step_end`` of a TrainerCallback (the M micro-batches'
        forward / backward, generation inside the first one, clipping, optimizer step);
        generation = ``GRPOTrainer._generate`` (tokenisation + ``model.generate``), reward =
        ``_calculate_rewards``; update = step - generation - reward - the rest of
        ``_generate_and_score_completions`` (padding, advantages: timed and reported as rest).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import harness  # noqa: E402
from bench_trl import Spec, Unsupported, ours_config, prompt_digest, trl_kwargs  # noqa: E402
from harness import Channel  # noqa: E402

PEAK_SIZES = ((2048, 3), (3072, 2))  # (n, timed calls): the best of both


def jax_peak(dtype: str) -> float:
  return max(harness.matmul_peak(n, repeats=r, dtype=dtype) for n, r in PEAK_SIZES)


def torch_peak(dtype: str) -> float:
  return max(harness.torch_matmul_peak(n, repeats=r, dtype=dtype) for n, r in PEAK_SIZES)


# -------------------------------------------------------------------------------------- ours
def ours_worker(spec: Spec, folder: str, steps: int, channel: Channel):
  from rlvr_jax import host_memory

  host_memory.configure_jax()  # what rlvr_jax.main does under the same setting, before jax runs
  from rlvr_jax.train.loop import Trainer

  try:
    c = ours_config(spec, workdir=tempfile.mkdtemp(prefix="ours_", dir=folder), steps=steps)
  except Unsupported as e:
    channel.send({"unsupported": str(e)})
    return
  log = lambda s: print(s, file=sys.stderr, flush=True)
  trainer = Trainer(c, log=log)
  trainer.restore_or_start()
  seen = {"texts": [], "prompt_tokens": 0, "shapes": [], "tokens": 0.0, "rows": 0}
  collect_prompts, train_step = trainer.collector.prompts, trainer.train_step

  def prompts(records):
    texts, ids, mask = collect_prompts(records)
    seen["texts"] += list(texts)
    seen["prompt_tokens"] += int(mask.sum())
    return texts, ids, mask

  def step(state, batch, num_tokens, num_seqs, key):
    rows, width = batch.tokens.shape
    # rl.share_prompts: this minibatch's groups run their prompt once (G rows per prompt)
    group = trainer.c.sampling.num_samples if trainer.share_next else 1
    seen["shapes"].append((rows, width, batch.completion_mask.shape[1], group))
    seen["tokens"] += num_tokens
    seen["rows"] += rows
    return train_step(state, batch, num_tokens, num_seqs, key)

  trainer.collector.prompts, trainer.train_step = prompts, step
  i = 0

  def rl_step():
    nonlocal i
    for k in ("texts", "shapes"):
      seen[k] = []
    seen.update(prompt_tokens=0, tokens=0.0, rows=0)
    m = trainer.rl_step(i)
    i += 1
    return {
      "step": m["time/step"],
      "generation": m["time/sample"],
      "reward": m["time/reward"],
      "update": m["time/update"],
      "shapes": seen["shapes"],
      "completion_tokens": seen["tokens"],
      "rows": seen["rows"],
      "prompt_digest": prompt_digest(seen["texts"]),
      "prompt_tokens": seen["prompt_tokens"],
    }

  channel.send({"side": "ours", "dtype": spec.dtype, "prompt_width": c.data.prompt_bucket})
  handlers = {"step": rl_step, "peak": lambda: {"matmul_peak_flops_per_s": jax_peak(spec.dtype)}}
  while channel.serve(handlers) != "quit":
    pass
  trainer.close()


# --------------------------------------------------------------------------------------- TRL
def trl_worker(spec: Spec, folder: str, steps: int, channel: Channel):
  import datasets
  import torch
  import transformers
  from trl import GRPOConfig, GRPOTrainer

  from rlvr_jax.rewards import ArithmeticReward

  torch.set_num_threads(os.cpu_count() or 1)
  torch.manual_seed(spec.seed)
  hf = os.path.join(folder, "hf")
  tokenizer = transformers.AutoTokenizer.from_pretrained(hf)
  if tokenizer.pad_token is None:
    tokenizer.pad_token = tokenizer.eos_token
  model = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
  with open(os.path.join(folder, "prompts.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  reward = ArithmeticReward()

  def arithmetic(prompts, completions, answer, **_):
    return [
      reward.score_item(p, c, answer=a)["reward"]
      for p, c, a in zip(prompts, completions, answer, strict=True)
    ]

  times = {}
  seen = {}

  def reset():
    times.update(generation=0.0, reward=0.0, score=0.0)
    seen.update(texts=[], prompt_tokens=0, shapes=[], tokens=0.0, rows=0)

  class Timed(GRPOTrainer):
    def _generate_and_score_completions(self, inputs):
      t0 = time.perf_counter()
      out = super()._generate_and_score_completions(inputs)
      times["score"] += time.perf_counter() - t0
      return out

    def _generate(self, prompts):
      t0 = time.perf_counter()
      out = super()._generate(prompts)
      times["generation"] += time.perf_counter() - t0
      # one row per sample: the G copies of a prompt are consecutive
      seen["texts"] += list(prompts[:: spec.group_size])
      seen["prompt_tokens"] += sum(len(p) for p in out[0][:: spec.group_size])
      return out

    def _calculate_rewards(self, *args, **kwargs):
      t0 = time.perf_counter()
      out = super()._calculate_rewards(*args, **kwargs)
      times["reward"] += time.perf_counter() - t0
      return out

    def _compute_loss(self, model, inputs):
      rows, t = inputs["completion_ids"].shape
      seen["shapes"].append((rows, inputs["prompt_ids"].shape[1] + t, t))
      seen["tokens"] += float(inputs["completion_mask"].sum())
      seen["rows"] += rows
      return super()._compute_loss(model, inputs)

  peak = lambda: {"matmul_peak_flops_per_s": torch_peak(spec.dtype)}
  clock = {}

  class Stepper(transformers.TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
      cmd = channel.serve({"peak": peak})
      if cmd != "step":
        raise SystemExit(0)  # quit before the planned steps
      reset()
      clock["t0"] = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
      step = time.perf_counter() - clock["t0"]
      rest = times["score"] - times["generation"] - times["reward"]
      channel.send({
        "step": step,
        "generation": times["generation"],
        "reward": times["reward"],
        "update": step - times["score"],
        "score_rest": rest,
        "shapes": seen["shapes"],
        "completion_tokens": seen["tokens"],
        "rows": seen["rows"],
        "prompt_digest": prompt_digest(seen["texts"]),
        "prompt_tokens": seen["prompt_tokens"],
      })  # fmt: skip

  args = GRPOConfig(**trl_kwargs(spec, output_dir=os.path.join(folder, "trl_out"), steps=steps))
  trainer = Timed(
    model=model,
    reward_funcs=[arithmetic],
    args=args,
    train_dataset=datasets.Dataset.from_list(rows),
    processing_class=tokenizer,
    callbacks=[Stepper()],
  )
  channel.send({
    "side": "trl",
    "dtype": spec.dtype,
    "eos_token_ids": list(trainer.eos_token_ids),
    "optimizer": args.optim,
    "generation_batch_size": args.generation_batch_size,
  })  # fmt: skip
  trainer.train()
  while channel.serve({"peak": peak}) != "quit":
    pass


def main():
  side, spec_json, folder, steps = sys.argv[1:5]
  channel = Channel()
  spec = Spec(**json.loads(spec_json))
  worker = {"ours": ours_worker, "trl": trl_worker}[side]
  worker(spec, folder, int(steps), channel)


if __name__ == "__main__":
  main()
