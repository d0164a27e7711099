"""Programs/s of the code sandbox: the current one against an older commit's, in interleaved rounds.

  .venv/bin/python tools/bench_sandbox.py                       # against fa72efb, 6 rounds
  .venv/bin/python tools/bench_sandbox.py --old_commit fa72efb --rounds 8 --programs 16

The old ``code_sandbox.py`` and ``_sandbox_harness.py`` are read from git (``git show``) into a
temporary package, so both run in this process on the same inputs. Each round runs ``--programs``
programs (a short function + 5 assert tests, or with ``--format stdio`` a script reading stdin; one
sandbox process each; ``--threads`` at a time)
with the old sandbox, then with the new one (the order alternates between rounds), so a change in
machine load hits both alike. Prints programs/s per round and the new/old ratio (median and range).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from rlvr_jax.rewards import code_sandbox  # noqa: E402


def load_old(commit: str):
  """The old sandbox module from ``commit``, importable next to the current package."""
  directory = tempfile.mkdtemp(prefix="old_sandbox_")
  for name in ("code_sandbox.py", "_sandbox_harness.py"):
    source = subprocess.run(
      ["git", "-C", REPO, "show", f"{commit}:rlvr_jax/rewards/{name}"],
      check=True,
      capture_output=True,
      text=True,
    ).stdout
    source = source.replace("from rlvr_jax.rewards._sandbox_harness", "from old_sandbox_harness")
    with open(os.path.join(directory, "old_" + name.lstrip("_")), "w") as f:
      f.write(source)
  sys.path.insert(0, directory)
  spec = importlib.util.spec_from_file_location(
    "old_code_sandbox", os.path.join(directory, "old_code_sandbox.py")
  )
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up
  spec.loader.exec_module(module)
  return module


def programs(num: int, fmt: str) -> list[tuple[str, list[str] | str]]:
  """(program, 5 assert tests) or, for ``stdio``, (program, its stdin)."""
  out = []
  for i in range(num):
    k = i % 4
    if fmt == "stdio":
      out.append((f"x = int(input())\nprint(x * {k + 1} + {k})\n", f"{i}\n"))
      continue
    code = f"def f(x):\n  return x * {k + 1} + {k}\n"
    out.append((code, [f"assert f({j}) == {j * (k + 1) + (k if i % 3 else 0)}" for j in range(5)]))
  return out


def run_one(module, program, limits):
  """Tests passed (asserts) or 1 if the output is right (stdio)."""
  code, arg = program
  if isinstance(arg, str):
    result = module.run_python(code, stdin=arg, limits=limits)
    x = int(arg)
    k = x % 4
    return int(result.stdout.strip() == str(x * (k + 1) + k))
  return sum(module.run_python(code, tests=arg, limits=limits).test_passed)


def run_round(module, batch, threads: int, limits) -> tuple[float, int]:
  """(programs/s, tests passed) for one round."""
  start = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    results = list(pool.map(lambda p: run_one(module, p, limits(module)), batch))
  elapsed = time.perf_counter() - start
  return len(batch) / elapsed, sum(results)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--old_commit", default="fa72efb")
  parser.add_argument("--rounds", type=int, default=6)
  parser.add_argument("--programs", type=int, default=16)
  parser.add_argument("--threads", type=int, default=1)
  parser.add_argument("--format", choices=["asserts", "stdio"], default="asserts")
  args = parser.parse_args()

  old = load_old(args.old_commit)
  new = code_sandbox
  limits = lambda m: m.SandboxLimits(timeout_s=10.0, cpu_s=5)  # noqa: E731
  batch = programs(args.programs, args.format)
  caps = new.sandbox_capabilities()
  print(
    f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()}-core "
    f"{platform.machine()}, python {platform.python_version()}, load average "
    f"{os.getloadavg()[0]:.1f} at start"
  )
  print(f"# new sandbox: missing protections {list(caps['missing'])}; old: {args.old_commit}")
  for module in (old, new):  # warm-up (capability probes, page cache)
    run_round(module, batch[:2], 1, limits)
  print("| round | order | old programs/s | new programs/s | new/old | load avg |")
  print("|---|---|---|---|---|---|")
  ratios, passed = [], set()
  for r in range(args.rounds):
    order = (old, new) if r % 2 == 0 else (new, old)
    rates = {}
    for module in order:
      rate, num_passed = run_round(module, batch, args.threads, limits)
      rates[module is new] = rate
      passed.add((module is new, num_passed))
    ratios.append(rates[True] / rates[False])
    print(
      f"| {r} | {'old first' if order[0] is old else 'new first'} | {rates[False]:.2f} | "
      f"{rates[True]:.2f} | {ratios[-1]:.2f} | {os.getloadavg()[0]:.1f} |",
      flush=True,
    )
  print(
    f"\nnew/old programs/s: median {statistics.median(ratios):.2f} "
    f"(range {min(ratios):.2f}-{max(ratios):.2f}) over {len(ratios)} rounds, {args.programs} "
    f"programs per round ({'5 assert tests each' if args.format == 'asserts' else 'stdin/stdout'})"
    f", {args.threads} thread(s)"
  )
  print(f"tests passed per round (old/new must agree): {sorted(passed)}")


if __name__ == "__main__":
  main()
