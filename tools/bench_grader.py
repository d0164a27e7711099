"""Score the math grader table with our reward and with math-verify alone; agreement per family.

Table: docs/benchmarks.md, "Math grader agreement (`tools/bench_grader.py`)".

  .venv/bin/python tools/bench_grader.py                   # markdown table + disagreements
  .venv/bin/python tools/bench_grader.py --baseline_file /tmp/old_math_reward.py
  .venv/bin/python tools/bench_grader.py --json-out /tmp/grader.json   # + environment record

The table is tests/data/math_grader_table.py: (completion, reference, verdict) rows a careful
grader decided. Scorers:
  ours         ``rewards.MathReward()`` (default options) run through ``RewardRuntime`` worker
               processes, as the trainer runs it; a row is "accepted" when ``info["correct"]``
               is 1.
  ours+ln      the same with ``fallback="last_number"``.
  math-verify  math-verify alone, as its README shows: ``verify(parse(gold), parse(completion))``
               with the default extraction configs (its own extraction finds the final answer
               in the whole completion); the reference is wrapped in ``$...$`` like ours.
  mv-on-ours   math-verify's parse + verify of the answer *our* extraction finds (wrapped in
               ``$...$``; none or malformed = reject): the comparison alone, extraction fixed.
  baseline     optional: ``MathReward()`` from another copy of math_reward.py (e.g. an older
               commit's), in-process.
Agreement = rows whose verdict the scorer reproduces / rows. It counts, it does not time (the
header gives the whole scoring's wall time).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)
sys.path.insert(0, os.path.join(_ROOT, "tools"))

import harness  # noqa: E402

from rlvr_jax import rewards  # noqa: E402
from rlvr_jax.rewards.math_extract import find_final_answer  # noqa: E402


def load_table(path: str):
  spec = importlib.util.spec_from_file_location("math_grader_table", path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up there
  spec.loader.exec_module(module)
  return module.load()


def math_verify_alone(completion: str, reference: str) -> bool:
  import math_verify  # noqa: PLC0415

  gold = math_verify.parse(reference if "$" in reference else f"${reference}$")
  pred = math_verify.parse(completion)
  return bool(gold) and bool(pred) and bool(math_verify.verify(gold, pred))


def math_verify_on_extracted(completion: str, reference: str) -> bool:
  """math-verify on the answer our extraction finds (isolates the comparison from extraction)."""
  import math_verify  # noqa: PLC0415

  found = find_final_answer(completion)
  if found.text is None or found.malformed:
    return False
  gold = math_verify.parse(reference if "$" in reference else f"${reference}$")
  pred = math_verify.parse(f"${found.text}$")
  return bool(gold) and bool(pred) and bool(math_verify.verify(gold, pred))


def through_runtime(reward, rows, workers: int) -> list[bool]:
  with rewards.RewardRuntime(num_workers=workers, timeout_s=30.0) as runtime:
    result = runtime.run(
      reward, ["q"] * len(rows), [r.completion for r in rows], answer=[r.reference for r in rows]
    )
  if result.failures:
    raise RuntimeError(f"reward failures: {result.failures}")
  return [bool(c == 1.0) for c in result.info["correct"]]


def baseline_verdicts(path: str, rows) -> list[bool]:
  spec = importlib.util.spec_from_file_location("baseline_math_reward", path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  reward = module.MathReward()
  return [bool(reward.score_item("q", r.completion, answer=r.reference)["correct"]) for r in rows]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument(
    "--table", default=os.path.join(_ROOT, "tests", "data", "math_grader_table.py")
  )
  parser.add_argument("--workers", type=int, default=2)
  parser.add_argument("--baseline_file", default=None, help="another math_reward.py to compare")
  harness.add_common_args(parser)
  args = parser.parse_args()

  rows = load_table(args.table)

  def score():
    scorers = {
      "ours": through_runtime(rewards.MathReward(), rows, args.workers),
      "ours+ln": through_runtime(rewards.MathReward(fallback="last_number"), rows, args.workers),
    }
    if args.baseline_file:
      scorers["baseline"] = baseline_verdicts(args.baseline_file, rows)
    scorers["math-verify"] = [math_verify_alone(r.completion, r.reference) for r in rows]
    scorers["mv-on-ours"] = [math_verify_on_extracted(r.completion, r.reference) for r in rows]
    return scorers

  elapsed, scorers = harness.timed(score, block=False)

  families = list(dict.fromkeys(r.family for r in rows))
  env = harness.environment(packages=("math-verify",), devices="none")
  print(harness.header(env, f"{len(rows)} rows, {elapsed:.0f} s"))
  names = list(scorers)
  print("| family | rows | accept | " + " | ".join(names) + " |")
  print("|---|---|---|" + "---|" * len(names))
  table = []
  for family in [*families, None]:
    idx = [i for i, r in enumerate(rows) if family is None or r.family == family]
    cells = []
    for name in names:
      agree = sum(scorers[name][i] == rows[i].verdict for i in idx)
      cells.append(f"{agree}/{len(idx)}")
    accept = sum(rows[i].verdict for i in idx)
    label = "**all**" if family is None else family
    print(f"| {label} | {len(idx)} | {accept} | " + " | ".join(cells) + " |")
    table.append({"family": family or "all", "rows": len(idx), "accept": accept,
                  "agree": dict(zip(names, cells, strict=True))})  # fmt: skip

  for name in names:
    wrong = [i for i, r in enumerate(rows) if scorers[name][i] != r.verdict]
    counts = collections.Counter(
      "false accept" if scorers[name][i] else "false reject" for i in wrong
    )
    print(f"\n{name}: {len(wrong)} disagreements ({dict(counts)})")
    for i in wrong:
      r = rows[i]
      print(f"  [{r.family}] want {r.verdict}: {r.completion!r} vs {r.reference!r} ({r.why})")
  if args.json_out:
    wrong = {n: [i for i, r in enumerate(rows) if scorers[n][i] != r.verdict] for n in names}
    harness.write_json(args.json_out, {"settings": vars(args), "elapsed_s": elapsed,
                                       "table": table, "disagreements": wrong}, env)  # fmt: skip


if __name__ == "__main__":
  main()
