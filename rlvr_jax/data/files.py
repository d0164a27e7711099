"""Prompt records from local JSONL / parquet files (or hub names when a network exists).

Each row becomes ``{"prompt": template.format(**row), "answer": str(row[answer_field]), ...row}``.
Rows are validated on load: a malformed row raises ``DataError`` naming the file, the row number
(1-based, = the line number for JSONL) and the field.
"""

from __future__ import annotations

import json
import os
import string

import datasets


class DataError(ValueError):
  """A malformed data file or row; the message names the file, row and field."""


def template_fields(template: str) -> list[str]:
  """Field names a ``str.format`` template reads (``"Q: {question}"`` -> ``["question"]``)."""
  try:
    names = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
  except ValueError as e:
    raise DataError(f"data.prompt_template={template!r} is not a valid format string: {e}") from e
  if any(not n or not n.isidentifier() for n in names):
    raise DataError(
      f"data.prompt_template={template!r}: fields must be plain names like {{question}}"
    )
  return names


def _check_jsonl(path: str) -> None:
  """Find the first line that is not a JSON object (datasets' own error does not name it)."""
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        obj = json.loads(line)
      except json.JSONDecodeError as e:
        raise DataError(f"{path}: row {lineno}: not valid JSON ({e.msg})") from None
      if not isinstance(obj, dict):
        raise DataError(f"{path}: row {lineno}: expected a JSON object, got {type(obj).__name__}")


def _load_one(path: str, split: str) -> datasets.Dataset:
  if path.endswith((".jsonl", ".json")):
    if not os.path.exists(path):
      raise DataError(f"{path}: file not found")
    _check_jsonl(path)
    return datasets.load_dataset("json", data_files=path, split="train")
  if path.endswith(".parquet"):
    if not os.path.exists(path):
      raise DataError(f"{path}: file not found")
    return datasets.load_dataset("parquet", data_files=path, split="train")
  return datasets.load_dataset(path, split=split)  # a hub name (needs a network)


def _blank_row_lines(path: str) -> list[int]:
  """1-based line number of each non-blank JSONL line (datasets skips blank lines)."""
  if not path.endswith((".jsonl", ".json")):
    return []
  with open(path, encoding="utf-8") as f:
    return [i for i, line in enumerate(f, start=1) if line.strip()]


def load_records(
  paths: str | list[str], *, prompt_template: str, answer_field: str, split: str = "train"
) -> list[dict]:
  """Load and validate rows from one or several files.

  Args:
    paths: a path or list of paths (``.jsonl``/``.json``/``.parquet``) or a hub dataset name.
    prompt_template: ``str.format`` template over row fields, e.g. ``"{question}"``.
    answer_field: the row field holding the reference answer.
    split: split name, for hub datasets.

  Returns:
    A list of dicts with ``prompt``, ``answer`` and the row's own fields.
  """
  if isinstance(paths, str):
    paths = [p for p in paths.split(",") if p]
  if not paths:
    raise DataError("data.path is empty")
  fields = template_fields(prompt_template)
  records = []
  for path in paths:
    ds = _load_one(path, split)
    lines = _blank_row_lines(path)
    for i, row in enumerate(ds):
      rownum = lines[i] if lines else i + 1
      for f in [*fields, answer_field]:
        if f not in row or row[f] is None:
          raise DataError(f"{path}: row {rownum}: missing field {f!r}")
        if isinstance(row[f], str) and not row[f].strip():
          raise DataError(f"{path}: row {rownum}: field {f!r} is empty")
      record = dict(row)
      record["prompt"] = prompt_template.format(**{f: row[f] for f in fields})
      record["answer"] = str(row[answer_field])
      records.append(record)
  if not records:
    raise DataError(f"{paths}: no rows")
  return records
