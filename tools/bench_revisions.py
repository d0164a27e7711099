"""One call (the bench's update or ``generate``) at several git revisions, separate processes
alternated: the A/B of a code change.

  .venv/bin/python tools/bench_revisions.py HEAD~1 HEAD              # update, SmolLM2 shapes
  .venv/bin/python tools/bench_revisions.py --what generate HEAD~2 WORKTREE
  .venv/bin/python tools/bench_revisions.py HEAD@32 HEAD@512          # log-prob token tiles
  .venv/bin/python tools/bench_revisions.py --model tiny --rounds 1 --calls 1 WORKTREE   # check

A variant is ``REV[@CHUNK]``: a git revision (``WORKTREE``: the working tree as it is) and, for
the update, the log-prob token tile (``rl.logprob_chunk``; default 32, the SmolLM2
experiments'). Each revision is checked out once into a temporary ``git worktree``. Each round
starts one child process per variant in the order given, with malloc huge pages on as ``python
-m rlvr_jax.main`` runs. The child runs this checkout's call builders
(``tools/bench_hugepages.py``: GRPO update of 4 prompts x 4 samples, 2 micro-batches, prompts
shared per group; or ``generate`` of those rows, 64 tokens) on the revision's ``rlvr_jax``, on a
randomly initialised model, and times ``--calls`` calls after a compiling one. The table gives
per variant the median of each process and, per round, the ratio first variant / this one.
Session 12's numbers in docs/benchmarks.md came from this procedure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_CHUNK = 32


def parse_variant(text: str) -> tuple[str, int]:
  """``REV[@CHUNK]`` -> (rev, chunk)."""
  rev, _, chunk = text.partition("@")
  if not rev:
    raise ValueError(f"variant {text!r}: no revision")
  try:
    return rev, int(chunk) if chunk else DEFAULT_CHUNK
  except ValueError:
    raise ValueError(f"variant {text!r}: the part after @ must be a token count") from None


def child(root: str, what: str, model_name: str, dtype: str, chunk: int, calls: int) -> list:
  """The call times of ``bench_hugepages.child`` (this checkout's call builders) run on the
  ``rlvr_jax`` of the tree at ``root``."""
  sys.path.insert(0, root)
  sys.path.insert(1, HERE)
  import bench_hugepages as hp

  shape = {"chunk_size": chunk} if what == "update" else {}
  return hp.child(what, model_name, dtype, calls, **shape)["times"]


def worktree_path(rev: str, folder: str) -> str:
  return os.path.join(folder, rev.replace("/", "_").replace("~", "-").replace("^", "-"))


def checkout(rev: str, folder: str) -> str:
  """The directory holding ``rev``'s tree: the working tree for WORKTREE, else a worktree."""
  if rev == "WORKTREE":
    return ROOT
  path = worktree_path(rev, folder)
  if not os.path.isdir(path):
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-q", path, rev], check=True)
  return path


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("variants", nargs="*", help="REV[@CHUNK] ...")
  parser.add_argument("--what", default="update", choices=("update", "generate"))
  parser.add_argument("--model", default="smollm2", choices=("smollm2", "tiny"))
  parser.add_argument("--dtype", default="bfloat16")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--calls", type=int, default=3, help="timed calls per child process")
  parser.add_argument("--child", nargs=2, metavar=("ROOT", "CHUNK"), help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    root, chunk = args.child
    print(json.dumps(child(root, args.what, args.model, args.dtype, int(chunk), args.calls)))
    return
  if not args.variants:
    parser.error("give at least one variant REV[@CHUNK]")
  variants = [parse_variant(v) for v in args.variants]
  from rlvr_jax import host_memory

  folder = tempfile.mkdtemp(prefix="bench_revisions_")
  print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load "
        f"{os.getloadavg()[0]:.2f}, {args.what}, {args.model}, {args.dtype}")  # fmt: skip
  try:
    roots = {rev: checkout(rev, folder) for rev, _ in variants}
    env = dict(os.environ, GLIBC_TUNABLES=host_memory.TUNABLE)
    env[host_memory.SETTING] = host_memory.DEFAULT  # the child applies its jax half
    medians = {v: [] for v in args.variants}
    for _ in range(args.rounds):
      for text, (rev, chunk) in zip(args.variants, variants, strict=True):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", roots[rev], str(chunk)]
        cmd += ["--what", args.what, "--model", args.model, "--dtype", args.dtype]
        out = subprocess.run(
          cmd + ["--calls", str(args.calls)], capture_output=True, text=True, env=env, check=False
        )
        if out.returncode != 0:
          raise RuntimeError(f"{text} failed:\n{out.stderr[-3000:]}")
        medians[text].append(statistics.median(json.loads(out.stdout.strip().splitlines()[-1])))
    first = medians[args.variants[0]]
    print("| variant | median s per process | first / this per round |")
    print("|---|---|---|")
    for text, ms in medians.items():
      ratios = " ".join(f"{a / b:.3f}" for a, b in zip(first, ms, strict=True))
      print(f"| {text} | {', '.join(f'{m:.3f}' for m in ms)} | {ratios} |")
  finally:
    for rev, _ in variants:
      path = worktree_path(rev, folder)
      if os.path.isdir(path):
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", path], check=False)
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
  main()
