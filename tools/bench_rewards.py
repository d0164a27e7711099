"""Benchmark the reward runtime: rewards/s for math completions and for short programs.

Table: docs/benchmarks.md, "Rewards runtime throughput (`tools/bench_rewards.py`)".

  .venv/bin/python tools/bench_rewards.py                      # 1,024 math, 256 programs x 5 tests
  .venv/bin/python tools/bench_rewards.py --workers 1 2 --code_format stdio

Math completions mix answer forms (integers, fractions, LaTeX that needs math-verify, wrong and
missing answers). Programs are short functions with 5 assert tests (one sandbox process per
program), or 5 stdin/stdout tests (one sandbox process per test) with ``--code_format stdio``.
Each configuration is timed after a warm-up batch (32 items), so worker start-up and imports are
excluded; the best of ``--repeats`` calls (``harness.time_calls``). ``--json-out PATH``: the
environment record and the rows as JSON.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402

from rlvr_jax import rewards  # noqa: E402


def math_batch(num: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  answers, completions = [], []
  for i in range(num):
    a, b = (int(v) for v in rng.integers(1, 50, size=2))
    kind = i % 8
    if kind == 0:
      answer, completion = str(a + b), f"We add them. \\boxed{{{a + b}}}"
    elif kind == 1:
      answer, completion = f"\\frac{{{a}}}{{{b}}}", f"so the ratio is \\boxed{{{a}/{b}}}"
    elif kind == 2:
      answer, completion = f"{a}\\sqrt{{2}}", f"\\boxed{{\\sqrt{{{2 * a * a}}}}}"
    elif kind == 3:
      answer, completion = str(a * b), f"The product is {a * b + 1}."
    elif kind == 4:
      answer, completion = f"\\frac{{{a}}}{{2}}", f"\\boxed{{{a / 2}}}"
    elif kind == 5:
      answer, completion = f"x^2+{2 * a}x+{a * a}", f"\\boxed{{(x+{a})^2}}"
    elif kind == 6:
      answer, completion = f"[{a}, {a + b})", f"the interval is \\boxed{{[{a},{a + b})}}"
    else:
      answer, completion = str(a), "I am not sure."
    answers.append(answer)
    completions.append("Let me think step by step. " * 20 + completion)
  return completions, {"answer": answers}


def code_batch(num: int, code_format: str):
  completions, tests = [], []
  for i in range(num):
    k = i % 4
    if code_format == "asserts":
      completions.append(f"```python\ndef f(x):\n  return x * {k + 1} + {k}\n```")
      tests.append([f"assert f({j}) == {j * (k + 1) + (k if i % 3 else 0)}" for j in range(5)])
    else:
      completions.append(f"```python\nx = int(input())\nprint(x * {k + 1} + {k})\n```")
      tests.append([{"input": f"{j}\n", "output": f"{j * (k + 1) + k}\n"} for j in range(5)])
  return completions, {"tests": tests}


def bench(runtime, reward, completions, fields, repeats: int) -> tuple[float, dict]:
  n = len(completions)
  runtime.run(
    reward, ["q"] * min(n, 32), completions[:32], **{k: v[:32] for k, v in fields.items()}
  )
  timing = harness.time_calls(
    lambda: runtime.run(reward, ["q"] * n, completions, **fields), warmup=0, repeats=repeats,
    block=False, keep_last=True,
  )  # fmt: skip
  return n / timing.min, timing.last.metrics


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
  parser.add_argument("--num_math", type=int, default=1024)
  parser.add_argument("--num_programs", type=int, default=256)
  parser.add_argument("--code_format", choices=["asserts", "stdio"], default="asserts")
  parser.add_argument("--repeats", type=int, default=2)
  harness.add_common_args(parser)
  args = parser.parse_args()

  math_completions, math_fields = math_batch(args.num_math)
  code_completions, code_fields = code_batch(args.num_programs, args.code_format)
  limits = rewards.SandboxLimits(timeout_s=5.0, cpu_s=5)
  caps = rewards.sandbox_capabilities()
  env = harness.environment(devices="none")
  print(harness.header(env))
  print(f"# sandbox: strong={caps['strong']}, missing protections {list(caps['missing'])}")
  print("| workload | workers | rewards/s | accuracy / pass rate | failures |")
  print("|---|---|---|---|---|")
  rows = []
  for workers in args.workers:
    with rewards.RewardRuntime(num_workers=workers, timeout_s=30.0) as runtime:
      rate, metrics = bench(
        runtime, rewards.MathReward(), math_completions, math_fields, args.repeats
      )
      print(
        f"| {args.num_math} math completions | {workers} | {rate:.0f} | "
        f"{metrics['reward/accuracy']:.3f} | {metrics['reward/fail_frac']:.3f} |",
        flush=True,
      )
      rows.append({"workload": "math", "workers": workers, "rewards_per_s": rate, **metrics})
      rate, metrics = bench(
        runtime,
        rewards.CodeReward(limits=limits, allow_weak_sandbox=not caps["strong"]),
        code_completions,
        code_fields,
        1,
      )
      print(
        f"| {args.num_programs} programs x 5 tests ({args.code_format}) | {workers} | "
        f"{rate:.1f} | {metrics['reward/mean']:.3f} | {metrics['reward/fail_frac']:.3f} |",
        flush=True,
      )
      rows.append({"workload": "code", "workers": workers, "rewards_per_s": rate, **metrics})
  if args.json_out:
    harness.write_json(args.json_out, {"settings": vars(args), "sandbox": caps, "rows": rows}, env)


if __name__ == "__main__":
  main()
