"""The launcher's glibc malloc tunables (``rlvr_jax.host_memory``) on and off, interleaved processes.

  .venv/bin/python tools/bench_hugepages.py                      # SmolLM2 shapes, bfloat16
  .venv/bin/python tools/bench_hugepages.py --model tiny --rounds 1 --calls 2   # a quick check

Each round starts one child process per setting, alternately (off, on, off, on, ...), each with a
clean environment for the tunables: ``GLIBC_TUNABLES`` unset (and jax's asynchronous
dispatch), or what ``python -m rlvr_jax.main`` runs with by default (``host_memory.TUNABLE``,
the kept memory since session 15, and computations on the calling thread; the calls run back to
back, so the faults that the kept memory removes after a ``generate`` in the RL loop do not
show here: compare with ``RLVR_JAX_MALLOC=hugepages`` in the loop, docs/benchmarks.md). A
child builds a randomly initialised model (``--model smollm2``: SmolLM2-135M's shapes; the numbers
do not matter here, only the shapes), then times ``--calls`` calls after a compiling one of:

- update: one jitted train step (GRPO, AdamW with global-norm clip 1.0, remat, 2 micro-batches)
  on the TRL comparison's shape: 4 prompts of 63 tokens x 4 samples of 64 tokens, the prompt
  shared per group (``rl.share_prompts``);
- generate: ``sampling.generate`` of those 4 prompts x 4 samples, 64 new tokens at temperature 1
  with no early stop.

It reports per setting the median and range of the call times and the minor page faults per call
(``getrusage``: the first touches of freshly mapped pages), and per round the ratio off / on.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROMPTS, PROMPT_LEN, GROUP, NEW_TOKENS = 4, 63, 4, 64


def _model_config(name: str, dtype: str):
  from rlvr_jax import model
  from rlvr_jax.model.smollm2 import SMOLLM2_SHAPES

  shapes = SMOLLM2_SHAPES if name == "smollm2" else {}
  return model.ModelConfig.tiny(**shapes, compute_dtype=dtype, remat=True)


def _update_call(cfg, *, fused: bool = True, groups: int = PROMPTS, chunk_size: int = 128):
  """A function that runs one jitted train step on the TRL comparison's shape (``groups``
  prompts x GROUP samples, log-prob token tiles of ``chunk_size``): the trainer's optimiser
  (``OptimizerSpec``, whose update runs as ``fused_apply``) or, ``fused=False``, the optax chain
  it stands for (``update`` + ``apply_updates``)."""
  import jax
  import jax.numpy as jnp
  import ml_collections
  import numpy as np

  from rlvr_jax import model
  from rlvr_jax.train import step as step_lib
  from rlvr_jax.train.optimizer import OptimizerSpec
  from rlvr_jax.train.state import TrainBatch, init_state

  optim = ml_collections.ConfigDict(
    dict(learning_rate=2e-6, schedule="constant", warmup_steps=0, final_lr_fraction=0.1, b1=0.9,
         b2=0.99, eps=1e-8, weight_decay=0.0, grad_clip=1.0)
  )  # fmt: skip
  opt = OptimizerSpec.from_config(optim, decay_steps=1)
  opt = opt if fused else opt.transformation
  step = step_lib.make_train_step(
    model_config=cfg, optimizer=opt, objective="grpo", on_policy=True,
    num_microbatches=min(2, groups), prompt_group=GROUP, chunk_size=chunk_size,
  )  # fmt: skip
  rows = groups * GROUP
  rng = np.random.default_rng(0)
  prompt = rng.integers(3, cfg.vocab_size, (groups, PROMPT_LEN)).astype(np.int32)
  prompt = np.repeat(prompt, GROUP, axis=0)
  completion = jnp.asarray(rng.integers(3, cfg.vocab_size, (rows, NEW_TOKENS)).astype(np.int32))
  tokens, positions = step_lib.sequence_inputs(prompt, np.ones_like(prompt, bool), completion)
  mask = jnp.ones((rows, NEW_TOKENS), bool)
  advantages = jnp.asarray(rng.normal(size=(rows, 1)).astype(np.float32)) * mask
  zeros = jnp.zeros((rows, NEW_TOKENS), jnp.float32)
  batch = TrainBatch(tokens, positions, mask, advantages, zeros, zeros, None, {})
  state = [init_state(model.init_params(cfg, jax.random.key(0)), opt, jax.random.key(1))]

  def call():
    state[0], metrics = step(
      state[0], batch, float(rows * NEW_TOKENS), float(rows), jax.random.key(2)
    )
    jax.block_until_ready(metrics)

  return call


def _generate_call(cfg):
  import jax
  import numpy as np

  from rlvr_jax import model
  from rlvr_jax.sampling import sampler
  from rlvr_jax.sampling.strategies import Temperature

  params = model.init_params(cfg, jax.random.key(0))
  rng = np.random.default_rng(0)
  prompts = rng.integers(3, cfg.vocab_size, (PROMPTS, PROMPT_LEN)).astype(np.int32)
  mask = np.ones_like(prompts, bool)
  calls = [0]

  def call():
    calls[0] += 1
    out = sampler.generate(
      params, prompts, mask, key=jax.random.key(calls[0]), config=cfg, num_samples=GROUP,
      strategy=Temperature(1.0), max_new_tokens=NEW_TOKENS, stop_tokens=[], pad_id=0,
    )  # fmt: skip
    jax.block_until_ready(out.tokens)

  return call


CALLS = {
  "update": _update_call,
  "update_chain": lambda cfg, **kw: _update_call(cfg, fused=False, **kw),
  "generate": lambda cfg, **kw: _generate_call(cfg),
}


def _launcher_host_memory():
  """This checkout's ``rlvr_jax/host_memory.py``, loaded by path: tools/bench_revisions.py runs
  ``child`` on other revisions' ``rlvr_jax``, which may predate ``configure_jax``, and every
  revision must run under the same setting."""
  import importlib.util

  path = os.path.join(ROOT, "rlvr_jax", "host_memory.py")
  spec = importlib.util.spec_from_file_location("_launcher_host_memory", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def child(what: str, model_name: str, dtype: str, calls: int, **shape) -> dict:
  """Times ``calls`` calls of ``CALLS[what]`` after a compiling one, in this process; ``shape``:
  the update's ``groups`` / ``chunk_size``."""
  import resource

  _launcher_host_memory().configure_jax()  # what rlvr_jax.main does under RLVR_JAX_MALLOC
  cfg = _model_config(model_name, dtype)
  call = CALLS[what](cfg, **shape)
  call()  # compiles
  times = []
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  for _ in range(calls):
    t0 = time.perf_counter()
    call()
    times.append(time.perf_counter() - t0)
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
  return {"times": times, "faults_per_call": faults / calls}


def run_child(what: str, setting: str, args) -> dict:
  """``child`` in a fresh process, malloc huge pages ``setting`` ("on" / "off"); ``args`` has
  model, dtype, calls and groups."""
  from rlvr_jax import host_memory

  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  env.pop("GLIBC_TUNABLES", None)
  env[host_memory.SETTING] = host_memory.DEFAULT if setting == "on" else "0"
  if setting == "on":
    env["GLIBC_TUNABLES"] = host_memory.TUNABLE
  cmd = [sys.executable, os.path.abspath(__file__), "--child", what, "--model", args.model]
  cmd += ["--dtype", args.dtype, "--calls", str(args.calls), "--groups", str(args.groups)]
  out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
  if out.returncode != 0:
    raise RuntimeError(f"{what} ({setting}) failed:\n{out.stderr[-3000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", default="smollm2", choices=("smollm2", "tiny"))
  parser.add_argument("--dtype", default="bfloat16")
  parser.add_argument("--what", default="update,generate")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--calls", type=int, default=5, help="timed calls per child process")
  parser.add_argument("--groups", type=int, default=PROMPTS, help="prompts of GROUP rows")
  parser.add_argument("--child", default="", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    print(json.dumps(child(args.child, args.model, args.dtype, args.calls, groups=args.groups)))
    return
  from rlvr_jax import host_memory

  print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()[0]:.2f}, "
        f"THP mode {host_memory.thp_mode()!r}, glibc {host_memory.glibc_version()}")  # fmt: skip
  print(
    "| call | malloc huge pages | median s (range) | minor faults per call | off / on per round |"
  )
  print("|---|---|---|---|---|")
  for what in args.what.split(","):
    res = {"off": [], "on": []}
    for _ in range(args.rounds):
      for setting in ("off", "on"):
        res[setting].append(run_child(what, setting, args))
    medians = {s: [statistics.median(r["times"]) for r in rs] for s, rs in res.items()}
    ratios = [a / b for a, b in zip(medians["off"], medians["on"], strict=True)]
    for setting, rs in res.items():
      times = [t for r in rs for t in r["times"]]
      faults = statistics.median(r["faults_per_call"] for r in rs)
      ratio = " ".join(f"{x:.3f}" for x in ratios) if setting == "on" else ""
      print(f"| {what} | {setting} | {statistics.median(times):.3f} ({min(times):.3f}-"
            f"{max(times):.3f}) | {faults:,.0f} | {ratio} |", flush=True)  # fmt: skip


if __name__ == "__main__":
  main()
