"""A long-lived process: memory mappings and RSS over many runs, and the first step's time with and
without JAX's persistent compilation cache. Its tables: docs/benchmarks.md, "Long-lived
processes: many runs in one process".

  .venv/bin/python tools/bench_lifecycle.py steps --count 120     # make_train_step configurations
  .venv/bin/python tools/bench_lifecycle.py steps --count 120 --keep   # every step kept alive
  .venv/bin/python tools/bench_lifecycle.py runs --count 100      # tiny runs through api.run
  .venv/bin/python tools/bench_lifecycle.py first-step --rounds 3 # cache off / cold / warm

* ``steps``: one fresh process builds ``--count`` train steps (``train.step.make_train_step``) of
  a tiny model, each with its own configuration (5 objectives in turn, a new learning rate each:
  no two share a compiled program), runs each once and drops it. ``--keep`` holds every step, as
  a module-level jit cache does (jax keeps what a function compiled as long as the function
  lives): the behaviour before the steps were owned by their callers.
* ``runs``: one fresh process calls ``rlvr_jax.api.run`` ``--count`` times on tiny configurations
  (objectives and seeds in turn, a new learning rate each: a sweep, no two runs share a step
  program). ``--package DIR`` imports ``rlvr_jax`` from DIR
  (e.g. a ``git worktree`` of an older commit) to measure the code before a change.
* Both print and record (``--json-out``) the process's memory mappings (``/proc/self/maps``,
  which the kernel limits to ``vm.max_map_count``, 65,530 by default) and RSS after each item.
* ``first-step``: fresh processes, in alternation, each building the trainer of
  ``experiments/default.py`` (no warm start) and timing its construction plus the first RL step
  (which compiles the sampler and the train step) with the cache off, with an empty cache folder
  (cold: compiles and writes), and with the folder the cold process filled (warm: loads).

The processes' environment, commit and machine are recorded by ``tools/harness.py``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

OBJECTIVES = ("grpo", "gspo", "cispo", "dapo", "gppo")


def process_size() -> dict:
  """This process's memory mappings and resident set (MB)."""
  with open("/proc/self/maps", "rb") as f:
    maps = sum(1 for _ in f)
  rss = 0
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        rss = int(line.split()[1]) / 1024
  return {"maps": maps, "rss_mb": round(rss, 1)}


def many_steps(count: int, keep: bool = False, log_every: int = 10) -> dict:
  """``count`` train-step configurations of a tiny model, each run once (module docstring)."""
  import jax
  import numpy as np
  import optax

  from rlvr_jax import model
  from rlvr_jax.train import step as step_lib
  from rlvr_jax.train.state import TrainBatch, init_state

  cfg = model.ModelConfig.tiny(
    vocab_size=16, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=1,
    num_kv_heads=1, head_dim=16,
  )  # fmt: skip
  b, s_p, t = 4, 3, 3
  rng = np.random.default_rng(0)
  prompt = rng.integers(1, 16, (b, s_p)).astype(np.int32)
  completion = rng.integers(1, 16, (b, t)).astype(np.int32)
  tokens, positions = step_lib.sequence_inputs(prompt, np.ones((b, s_p), bool), completion)
  old = np.full((b, t), -2.0, np.float32)
  batch = TrainBatch(
    tokens=tokens, positions=positions, completion_mask=np.ones((b, t), bool),
    advantages=rng.normal(size=(b,)).astype(np.float32), old_logp=old, sampler_logp=old,
    ref_logp=None, extras={},
  )  # fmt: skip
  params = model.init_params(cfg, jax.random.key(0))
  kept, curve = [], [{"item": 0, **process_size()}]
  t0 = time.perf_counter()
  for i in range(count):
    opt = optax.adamw(1e-4 * (1 + i))  # a new configuration: nothing compiled can be shared
    step = step_lib.make_train_step(
      model_config=cfg, optimizer=opt, objective=OBJECTIVES[i % len(OBJECTIVES)], chunk_size=4
    )
    state = init_state(jax.tree.map(np.copy, params), opt, jax.random.key(1))
    state, metrics = step(state, batch, float(b * t), float(b), jax.random.key(2))
    jax.block_until_ready(metrics)
    if keep:
      kept.append(step)
    del step, state, metrics
    gc.collect()
    if (i + 1) % log_every == 0 or i + 1 == count:
      curve.append({"item": i + 1, **process_size()})
      print(f"steps {i + 1}: {curve[-1]}", file=sys.stderr, flush=True)
  return {"what": "steps", "keep": keep, "curve": curve, "seconds": time.perf_counter() - t0}


def many_runs(count: int, workdir: str, package: str = "", log_every: int = 5,
              trace: str = "") -> dict:  # fmt: skip
  """``count`` tiny runs through ``rlvr_jax.api.run`` in this process (module docstring); each
  point of the curve is also appended to ``trace`` (JSON lines), which outlives a crash."""
  if package:
    sys.path.insert(0, os.path.abspath(package))
  from rlvr_jax import api
  from rlvr_jax.train import config as config_lib

  curve = [{"item": 0, **process_size()}]
  t0 = time.perf_counter()
  for i in range(count):
    c = config_lib.tiny_config(os.path.join(workdir, f"run_{i}"))
    c.objective.name = OBJECTIVES[i % len(OBJECTIVES)]
    c.seed = i % 3
    c.optim.learning_rate = 1e-3 * (1 + i / count)  # a sweep: every run a new step program
    c.checkpoint.async_save = False
    api.run(c, log=lambda _: None)
    gc.collect()
    if (i + 1) % log_every == 0 or i + 1 == count:
      curve.append({"item": i + 1, **process_size()})
      if trace:
        with open(trace, "a") as f:
          f.write(json.dumps(curve[-1]) + "\n")
  return {"what": "runs", "package": package, "curve": curve, "seconds": time.perf_counter() - t0}


def first_step(cache_dir: str) -> dict:
  """Seconds to build the default experiment's trainer (no warm start) and run its first RL step,
  with the persistent compilation cache in ``cache_dir`` ('off': none)."""
  import jax

  from rlvr_jax.train import config as config_lib
  from rlvr_jax.train import loop

  hits = []
  jax.monitoring.register_event_listener(
    lambda name, **kw: hits.append(name) if name == "/jax/compilation_cache/cache_hits" else None
  )
  c = harness.load_target("experiments/default.py:get_config")()
  config_lib.apply_overrides(c, {
    "workdir": tempfile.mkdtemp(prefix="first_step_"), "warm_start": {"num_steps": 0,
    "clean_steps": 0}, "compilation": {"cache_dir": cache_dir}, "eval": {"every": 0},
    "logging": {"progress": False, "tensorboard": False, "plot": False},
  })  # fmt: skip
  t0 = time.perf_counter()
  trainer = loop.Trainer(c, log=lambda _: None)
  try:
    trainer.restore_or_start()
    trainer.rl_step(0)
    seconds = time.perf_counter() - t0
  finally:
    trainer.close()
  return {"seconds": seconds, "cache_hits": len(hits)}


def _print_curve(result: dict) -> None:
  rows = [(p["item"], p["maps"], f"{p['rss_mb']:.0f}") for p in result["curve"] if "maps" in p]
  print(harness.markdown_table([result["what"], "memory mappings", "RSS (MB)"], rows))
  print(f"({result['seconds']:.0f} s)")


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("what", choices=("steps", "runs", "first-step"))
  parser.add_argument("--count", type=int, default=100, help="configurations or runs")
  parser.add_argument("--keep", action="store_true", help="steps: keep every step alive")
  parser.add_argument("--package", default="", help="runs: import rlvr_jax from this folder")
  harness.add_common_args(parser, rounds=3)
  args = parser.parse_args(argv)
  tool = "tools/bench_lifecycle.py"
  if args.what == "steps":
    result = harness.run_child(
      harness.Child(f"{tool}:many_steps", {"count": args.count, "keep": args.keep})
    )
    _print_curve(result)
  elif args.what == "runs":
    with tempfile.TemporaryDirectory() as workdir:
      trace = os.path.join(workdir, "curve.jsonl")
      kwargs = {"count": args.count, "workdir": workdir, "package": args.package, "trace": trace}
      t0 = time.perf_counter()
      try:
        result = harness.run_child(harness.Child(f"{tool}:many_runs", kwargs))
      except harness.ChildFailed as e:  # e.g. at the kernel's limit on memory mappings
        with open(trace) as f:
          curve = [{"item": 0}] + [json.loads(line) for line in f]
        print(f"the process died after run {curve[-1]['item']}+ ({e.returncode}):\n"
              f"{e.output[-600:]}")  # fmt: skip
        result = {"what": "runs", "package": args.package, "curve": curve[1:], "died": True,
                  "seconds": time.perf_counter() - t0, "returncode": e.returncode}  # fmt: skip
    _print_curve(result)
  else:
    result = {"off": [], "cold": [], "warm": []}
    for _ in range(args.rounds):
      with tempfile.TemporaryDirectory() as cache:
        for setting, folder in (("off", "off"), ("cold", cache), ("warm", cache)):
          child = harness.Child(f"{tool}:first_step", {"cache_dir": folder})
          result[setting].append(harness.run_child(child))
    rows = []
    for setting, runs in result.items():
      seconds = [r["seconds"] for r in runs]
      rows.append((setting, harness.spread_text(seconds, ".1f"), runs[-1]["cache_hits"]))
    print(harness.markdown_table(["cache", "first step (s), median (min-max)", "hits"], rows))
  if args.json_out:
    harness.write_json(args.json_out, {"args": vars(args), "result": result}, tool=tool)


if __name__ == "__main__":
  main()
