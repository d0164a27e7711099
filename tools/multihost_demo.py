"""A real multi-process RLVR run on one machine: N processes on loopback, ``jax.distributed`` (CPU).

Every process runs the same program on one global (data, fsdp, tensor) mesh:

  params, AdamW state: placed in the training layout (each process writes only its shards)
  per RL step:
    reshard params -> sampling layout; sample G completions for P prompts (rows over data x fsdp)
    each process reads back ONLY its rows (its addressable shards), scores them with a verifiable
      host reward, computes group advantages locally (its rows hold whole groups)
    step batch = global arrays from per-process rows (jax.make_array_from_process_local_data)
    one jitted, donated train step (rlvr_jax.train.step, DAPO); host metrics reduced over processes
  after K steps: collective orbax save (every process writes its shards), restore into the
    sharded template, check equality, one more step from the restored state.

Process 0 writes ``<workdir>/result_<tag>.npz`` (final params gathered to host) and
``<workdir>/metrics_<tag>.json``.

Launch all processes here (a free loopback port is picked, each process gets
``XLA_FLAGS=--xla_force_host_platform_device_count=<devices>``)::

  python tools/multihost_demo.py --launch=2 --devices_per_process=4 --workdir=/tmp/mh
  python tools/multihost_demo.py --launch=1 --devices_per_process=8 --workdir=/tmp/mh  # reference

or one process by hand (``--coordinator_address=127.0.0.1:PORT --num_processes=2 --process_id=i``).
``--compare`` prints the max |difference| between the two runs' params and metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B_PROMPTS, G, T, S_PROMPT = 4, 2, 6, 6


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def launch(
  num: int, devices: int, workdir: str, steps: int, mesh: str, timeout: float, extra=()
) -> str:
  """Starts ``num`` worker processes and waits; returns the run tag. Raises on any failure."""
  os.makedirs(workdir, exist_ok=True)
  tag = f"p{num}x{devices}"
  port = _free_port()
  env = dict(os.environ)
  env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  procs = []
  for i in range(num):
    cmd = [sys.executable, os.path.abspath(__file__), f"--workdir={workdir}", f"--tag={tag}"]
    cmd += [f"--steps={steps}", f"--mesh={mesh}", *extra]
    if num > 1:
      cmd += [f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={num}"]
      cmd += [f"--process_id={i}"]
    log = open(os.path.join(workdir, f"log_{tag}_{i}.txt"), "w")
    procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
  deadline = time.time() + timeout
  codes = []
  for p, log in procs:
    try:
      codes.append(p.wait(timeout=max(1.0, deadline - time.time())))
    except subprocess.TimeoutExpired:
      for q, _ in procs:
        q.kill()
      codes.append("timeout")
    log.close()
  if any(c != 0 for c in codes):
    tails = []
    for i in range(num):
      with open(os.path.join(workdir, f"log_{tag}_{i}.txt")) as f:
        tails.append(f"--- process {i} (exit {codes[i]}):\n" + f.read()[-3000:])
    raise RuntimeError("multi-process run failed:\n" + "\n".join(tails))
  return tag


def worker(args) -> None:
  from rlvr_jax import distributed

  info = distributed.initialize(args.coordinator_address, args.num_processes, args.process_id)

  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax

  from rlvr_jax import advantages, model, sampling
  from rlvr_jax import checkpoint as ckpt_lib
  from rlvr_jax import sharding as S
  from rlvr_jax.train import sharded
  from rlvr_jax.train import step as step_lib
  from rlvr_jax.train.state import TrainBatch, init_state

  jax.config.update("jax_default_matmul_precision", "highest")
  cfg = model.ModelConfig.tiny(
    vocab_size=32,
    hidden_size=32,
    intermediate_size=64,
    num_layers=1,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
  )
  mesh = S.make_mesh(*[int(x) for x in args.mesh.split(",")])
  opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2, eps=1e-4))
  state = init_state(model.init_params(cfg, jax.random.key(0)), opt, jax.random.key(1))
  shardings = sharded.state_shardings(state, mesh=mesh, model_config=cfg, optimizer=opt)
  state = sharded.place(state, shardings)
  sample_sh = model.param_shardings(cfg, mesh, S.SAMPLE_RULES)
  train_step = sharded.sharded_train_step(
    step_lib.make_train_step(model_config=cfg, optimizer=opt, objective="dapo", on_policy=True),
    shardings,
    mesh,
  )
  strategy = sampling.Temperature(1.0)
  rows_total = B_PROMPTS * G
  mine = sharded.process_rows(rows_total, mesh)
  if (mine.stop - mine.start) % G:
    raise ValueError(f"process rows {mine} do not hold whole groups of G={G}")

  def local_rows(x):
    """This process's rows of a row-sharded global array, from its own shards only."""
    parts = {}
    for shard in x.addressable_shards:
      r = shard.index[0]
      parts[r.start or 0] = np.asarray(shard.data)
    return np.concatenate([parts[k] for k in sorted(parts)], 0)

  def rl_step(state, step):
    rng = np.random.default_rng([7, step])
    prompts = rng.integers(3, cfg.vocab_size, (B_PROMPTS, S_PROMPT)).astype(np.int32)
    pmask = np.ones_like(prompts, bool)
    pmask[::2, :2] = False
    prompts_g = sharded.place(prompts, sharded.replicated(mesh))
    pmask_g = sharded.place(pmask, sharded.replicated(mesh))
    key = sharded.place(jax.random.fold_in(jax.random.key(2), step), sharded.replicated(mesh))
    with jax.set_mesh(mesh):
      rollout = sampling.generate(
        S.reshard(state.params, sample_sh),
        prompts_g,
        pmask_g,
        config=cfg,
        num_samples=G,
        strategy=strategy,
        key=key,
        max_new_tokens=T,
        stop_tokens=(),
        pad_id=0,
        buckets=(8,),
      )
    # Rewards on the host that holds the samples: only this process's rows are read back.
    tok = local_rows(rollout.tokens)
    cmask = local_rows(rollout.completion_mask)
    reward = ((tok % 2 == 0) & cmask).sum(-1) / np.maximum(cmask.sum(-1), 1)  # verifiable, dense
    adv = np.asarray(advantages.grpo_advantages(jnp.asarray(reward.reshape(-1, G), jnp.float32)))
    adv = adv.reshape(-1)[:, None] * cmask
    tokens, positions = step_lib.sequence_inputs(
      local_rows(rollout.prompt_tokens), local_rows(rollout.prompt_mask), jnp.asarray(tok)
    )
    slogp = local_rows(rollout.sampler_logp)
    local = TrainBatch(
      tokens=np.asarray(tokens),
      positions=np.asarray(positions),
      completion_mask=cmask,
      advantages=adv.astype(np.float32),
      old_logp=slogp,
      sampler_logp=slogp,
      ref_logp=None,
      extras={},
    )
    batch = sharded.shard_local_rows(local, rows_total, mesh)
    # Global normalisers: sums over every process's rows.
    counts = sharded.process_sum(
      {"tokens": float(cmask.sum()), "seqs": float((cmask.sum(-1) > 0).sum())}
    )
    num_tokens, num_seqs = counts["tokens"], counts["seqs"]
    state, m = train_step(state, batch, num_tokens, num_seqs, jax.random.key(100 + step))
    host = {k: float(v) for k, v in m.items()}
    host.update(
      sharded.reduce_metrics(
        {"reward/mean": float(reward.mean()), "reward/max": float(reward.max())},
        weight=len(reward),
      )
    )
    return state, host

  history = []
  for step in range(args.steps):
    state, m = rl_step(state, step)
    history.append(m)
  ckpt = ckpt_lib.Checkpointer(os.path.join(args.workdir, f"ckpt_{args.tag}"), async_save=False)
  ckpt.save(args.steps, state, {"step": args.steps}, force=True)
  ckpt.wait()
  before = sharded.to_host(state)
  template = sharded.place(
    init_state(model.init_params(cfg, jax.random.key(99)), opt, jax.random.key(1)), shardings
  )
  step_restored, restored, host_state = ckpt.restore(template)
  ckpt.close()
  after = sharded.to_host(restored)
  same = all(
    np.array_equal(a, b)
    for a, b in zip(jax.tree.leaves(before.params), jax.tree.leaves(after.params), strict=True)
  )
  same_opt = all(
    np.array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(
      jax.tree.leaves(before.opt_state), jax.tree.leaves(after.opt_state), strict=True
    )
  )
  layout = all(
    x.sharding == s
    for x, s in zip(
      jax.tree.leaves(restored.params), jax.tree.leaves(shardings.params), strict=True
    )
  )
  state, m = rl_step(restored, args.steps)
  history.append(m)
  final = sharded.to_host(state.params)
  if jax.process_index() == 0:
    flat = {
      "/".join(str(k) for k in path): v for path, v in jax.tree_util.tree_leaves_with_path(final)
    }
    np.savez(os.path.join(args.workdir, f"result_{args.tag}.npz"), **flat)
    out = {
      "info": info.__dict__,
      "mesh": dict(mesh.shape),
      "process_rows": [mine.start, mine.stop],
      "metrics": history,
      "restored_step": int(step_restored),
      "restore_equal_params": bool(same),
      "restore_equal_opt_state": bool(same_opt),
      "restore_layout_ok": bool(layout),
    }
    with open(os.path.join(args.workdir, f"metrics_{args.tag}.json"), "w") as f:
      json.dump(out, f, indent=2)
  print(f"process {info.process_index}/{info.process_count}: rows {mine}, done", flush=True)


def trainer_config(
  workdir: str, steps: int, stop_after: int, prompts_per_step: int = 4, zero_variance="keep"
):
  """A tiny arithmetic RL run of the real trainer (train.loop) for the multi-process check."""
  from rlvr_jax.train import config as config_lib

  rl = dict(num_steps=steps, prompts_per_step=prompts_per_step, zero_variance=zero_variance)
  return config_lib.tiny_mesh_config(
    workdir, rl=rl, checkpoint=dict(every=1), max_steps_this_run=stop_after
  )


class _RecordingSource:
  """A prompt stream that records the global indices of the records it hands out."""

  def __init__(self, source):
    self.source, self.indices = source, []

  def take(self, n: int):
    out = self.source.take(n)
    self.indices += [r["index"] for r in out]
    return out

  def __getattr__(self, name):
    return getattr(self.source, name)


def loaded_indices(workdir: str, suffix: str, num_processes: int) -> list[list[int]]:
  """Per process, the prompt indices a ``--trainer`` run (result suffix, e.g. ``p2x4_stop0``)
  loaded from its data stream, in order."""
  out = []
  for i in range(num_processes):
    with open(os.path.join(workdir, f"trainer_data_{suffix}_{i}.json")) as f:
      out.append(json.load(f)["indices"])
  return out


def trainer_worker(args) -> None:
  """``train.sharded.MeshTrainer`` (the real host loop) on the global mesh; ``--stop_after`` > 0
  stops early (checkpointed), a second launch resumes from the collective checkpoint."""
  from rlvr_jax import distributed

  info = distributed.initialize(args.coordinator_address, args.num_processes, args.process_id)
  import jax
  import numpy as np

  from rlvr_jax import sharding as S
  from rlvr_jax.metrics import read_jsonl
  from rlvr_jax.train import sharded

  jax.config.update("jax_default_matmul_precision", "highest")
  mesh = S.make_mesh(*[int(x) for x in args.mesh.split(",")])
  workdir = os.path.join(args.workdir, f"trainer_{args.tag}")
  c = trainer_config(
    workdir, args.steps, args.stop_after, args.prompts_per_step, args.zero_variance
  )
  trainer = sharded.MeshTrainer(c, mesh=mesh, log=lambda s: print(s, flush=True))
  # Instrumentation only: which prompts (global indices) this process loaded from its stream.
  loaded = trainer.collector.source = _RecordingSource(trainer.collector.source)
  try:
    trainer.run()
    params = sharded.to_host(trainer.state.params)
  finally:
    trainer.close()
  suffix = f"{args.tag}_stop{args.stop_after}"
  with open(
    os.path.join(args.workdir, f"trainer_data_{suffix}_{jax.process_index()}.json"), "w"
  ) as f:
    json.dump({"indices": loaded.indices, "position": trainer.source.state()["position"]}, f)
  if jax.process_index() == 0:
    flat = {
      "/".join(str(k) for k in path): v for path, v in jax.tree_util.tree_leaves_with_path(params)
    }
    np.savez(os.path.join(args.workdir, f"trainer_result_{suffix}.npz"), **flat)
    with open(os.path.join(args.workdir, f"trainer_metrics_{suffix}.json"), "w") as f:
      json.dump(
        {"info": info.__dict__, "metrics": read_jsonl(os.path.join(workdir, "metrics.jsonl"))}, f
      )
  print(f"process {info.process_index}/{info.process_count}: trainer done", flush=True)


def _metric_diff(u, v) -> float:
  """|u - v| of two logged metric values; NaN is logged as null: two nulls agree, a null and a
  number differ infinitely."""
  if u is None or v is None:
    return 0.0 if u is None and v is None else float("inf")
  return abs(u - v)


def compare(workdir: str, a: str, b: str) -> dict:
  """Max |difference| of final params and per-step metrics between runs ``a`` and ``b``."""
  import numpy as np

  pa, pb = (
    np.load(os.path.join(workdir, f"result_{a}.npz")),
    np.load(os.path.join(workdir, f"result_{b}.npz")),
  )
  if sorted(pa.files) != sorted(pb.files):
    raise ValueError(f"param trees differ: {sorted(pa.files)} vs {sorted(pb.files)}")
  param_diff = max(float(np.abs(pa[k] - pb[k]).max()) for k in pa.files)
  with open(os.path.join(workdir, f"metrics_{a}.json")) as f:
    ma = json.load(f)
  with open(os.path.join(workdir, f"metrics_{b}.json")) as f:
    mb = json.load(f)
  metric_diff = max(
    _metric_diff(x[k], y[k]) for x, y in zip(ma["metrics"], mb["metrics"], strict=True) for k in x
  )
  return {"param_max_abs_diff": param_diff, "metric_max_abs_diff": metric_diff, a: ma, b: mb}


def compare_trainer(workdir: str, a: str, b: str) -> dict:
  """Max |difference| of final params and of the logged metrics (timings excluded) between two
  ``--trainer`` runs named by their result suffix (e.g. ``p2x4_stop0``)."""
  import numpy as np

  pa = np.load(os.path.join(workdir, f"trainer_result_{a}.npz"))
  pb = np.load(os.path.join(workdir, f"trainer_result_{b}.npz"))
  if sorted(pa.files) != sorted(pb.files):
    raise ValueError(f"param trees differ: {sorted(pa.files)} vs {sorted(pb.files)}")
  runs = []
  for name in (a, b):
    with open(os.path.join(workdir, f"trainer_metrics_{name}.json")) as f:
      runs.append(json.load(f))
  skip = ("time", "reward/time_s", "reward/items_per_s", "eval/time_s")
  ma, mb = runs[0]["metrics"], runs[1]["metrics"]
  if [r["step"] for r in ma] != [r["step"] for r in mb]:
    raise ValueError(f"logged steps differ: {[r['step'] for r in ma]} vs {[r['step'] for r in mb]}")
  metric_diff = max(
    _metric_diff(x[k], y[k])
    for x, y in zip(ma, mb, strict=True)
    for k in x
    if not k.startswith(skip) and k != "step"
  )
  return {
    "param_max_abs_diff": max(float(np.abs(pa[k] - pb[k]).max()) for k in pa.files),
    "metric_max_abs_diff": float(metric_diff),
    "steps": [r["step"] for r in ma],
    "info": [r["info"] for r in runs],
  }


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--launch", type=int, default=0, help="start this many processes here")
  p.add_argument("--devices_per_process", type=int, default=4)
  p.add_argument("--workdir", required=True)
  p.add_argument("--tag", default="run")
  p.add_argument("--steps", type=int, default=2)
  p.add_argument("--mesh", default="2,2,2", help="data,fsdp,tensor sizes (-1 = infer)")
  p.add_argument("--timeout", type=float, default=900)
  p.add_argument("--compare", nargs=2, metavar=("TAG_A", "TAG_B"))
  p.add_argument("--trainer", action="store_true", help="run the real host loop (MeshTrainer)")
  p.add_argument("--stop_after", type=int, default=0, help="--trainer: stop after this many steps")
  p.add_argument("--prompts_per_step", type=int, default=4, help="--trainer: P")
  p.add_argument("--zero_variance", default="keep", help="--trainer: keep, mask or refill")
  p.add_argument("--coordinator_address")
  p.add_argument("--num_processes", type=int)
  p.add_argument("--process_id", type=int)
  args = p.parse_args()
  if args.compare:
    out = compare(args.workdir, *args.compare)
    print(json.dumps({k: out[k] for k in ("param_max_abs_diff", "metric_max_abs_diff")}))
  elif args.launch:
    extra = []
    if args.trainer:
      extra = ["--trainer", f"--stop_after={args.stop_after}"]
      extra += [f"--prompts_per_step={args.prompts_per_step}"]
      extra += [f"--zero_variance={args.zero_variance}"]
    tag = launch(
      args.launch,
      args.devices_per_process,
      args.workdir,
      args.steps,
      args.mesh,
      args.timeout,
      extra,
    )
    print(tag)
  elif args.trainer:
    trainer_worker(args)
  else:
    worker(args)


if __name__ == "__main__":
  main()
