"""Deterministic prompt streams with a resumable position, and prompt formatting.

A ``PromptSource`` hands out records by a global index: ``take(n)`` returns records
``position, ..., position + n - 1`` and advances ``position``. Record ``i`` is a pure function of
``(seed, i)`` (procedural tasks: ``tasks.make_example``; files: a per-epoch seeded permutation), so
the position alone (an int in the checkpoint) restores the stream exactly.

Per-process loading (``PromptSource.shard(index, count)``): every global batch ``take(n)`` is split
into ``count`` contiguous slices (``shard_span``) and shard ``index`` materialises only its slice,
while the position still advances by the whole ``n``; the shards' slices, concatenated in shard
order, are the unsharded stream's batch, and the one position restores every shard exactly.
"""

from __future__ import annotations

import numpy as np

from rlvr_jax.data import files, tasks


class PromptSource:
  """A train or held-out stream of prompt records.

  Args:
    records: a fixed list of records (files), or None for a procedural task.
    task: the ``tasks.TaskSpec`` when ``records`` is None.
    seed: stream seed.
    split: "train" or "heldout" (procedural tasks).
    shuffle: shuffle fixed records each epoch.
  """

  def __init__(self, *, records=None, task=None, seed: int = 0, split: str = "train", shuffle=True):
    if (records is None) == (task is None):
      raise ValueError("PromptSource needs exactly one of records= or task=")
    self.records, self.task, self.seed, self.split, self.shuffle = (
      records,
      task,
      seed,
      split,
      shuffle,
    )
    self.position = 0
    self.shard_index, self.shard_count = 0, 1
    self._perm_epoch, self._perm = -1, None

  def __getitem__(self, i: int) -> dict:
    if self.task is not None:
      return tasks.make_example(self.task, i, seed=self.seed, split=self.split)
    n = len(self.records)
    epoch, j = divmod(i, n)
    if not self.shuffle:
      return self.records[j]
    if epoch != self._perm_epoch:
      self._perm = np.random.default_rng([self.seed, epoch]).permutation(n)
      self._perm_epoch = epoch
    return self.records[int(self._perm[j])]

  def shard(self, index: int, count: int) -> PromptSource:
    """A copy of this stream (same records, seed and position) that materialises only its
    ``shard_span(n, index, count)`` slice of each global batch of ``n``; see the module docstring.
    """
    if count < 1 or not 0 <= index < count:
      raise ValueError(f"shard index {index} must be in [0, count={count}) with count >= 1")
    if self.shard_count != 1:
      raise ValueError(f"this stream is already shard {self.shard_index} of {self.shard_count}")
    out = PromptSource(
      records=self.records, task=self.task, seed=self.seed, split=self.split, shuffle=self.shuffle
    )
    out.position, out.shard_index, out.shard_count = self.position, index, count
    return out

  def span(self, n: int) -> tuple[int, int]:
    """Offsets ``[lo, hi)`` of this shard's records within a global batch of ``n``."""
    return shard_span(n, self.shard_index, self.shard_count)

  def take(self, n: int) -> list[dict]:
    """This shard's records of the next global batch of ``n`` (all ``n`` when unsharded), each
    with its global ``index``; advances the position by ``n``."""
    lo, hi = self.span(n)
    out = [{**self[i], "index": i} for i in range(self.position + lo, self.position + hi)]
    self.position += n
    return out

  def state(self) -> dict:
    return {"position": int(self.position)}

  def restore(self, state: dict) -> None:
    self.position = int(state["position"])


def shard_span(n: int, index: int, count: int) -> tuple[int, int]:
  """Contiguous even split of ``n`` items over ``count`` shards: shard ``index`` gets
  ``[index * n // count, (index + 1) * n // count)`` (sizes differ by at most one)."""
  if count < 1 or not 0 <= index < count:
    raise ValueError(f"shard index {index} must be in [0, count={count}) with count >= 1")
  return index * n // count, (index + 1) * n // count


def build_sources(data_cfg) -> tuple[PromptSource, list[dict]]:
  """(train stream, held-out records) from the ``config.data`` block.

  ``data.source`` is "task" (built-in procedural task), "files" (``data.path`` with
  ``data.prompt_template`` and ``data.answer_field``; held-out rows from ``data.eval_path``, or a
  content-hash split of ``data.path`` with ``data.task.heldout_fraction``), "reasoning_gym"
  (``data.reasoning_gym``: reasoning-gym tasks, see ``reasoning_gym_source``) or "humaneval"
  (``data.humaneval``: the HumanEval problems, see ``humaneval``).
  """
  if data_cfg.source in ("reasoning_gym", "humaneval"):
    if data_cfg.source == "reasoning_gym":
      from rlvr_jax.data import reasoning_gym_source

      records, heldout = reasoning_gym_source.build_records(data_cfg)
    else:
      from rlvr_jax.data import humaneval

      records, heldout = humaneval.build_sources(data_cfg)
    return PromptSource(records=records, seed=data_cfg.seed), heldout[: data_cfg.num_eval]
  if data_cfg.source == "task":
    spec = task_spec(data_cfg)
    train = PromptSource(task=spec, seed=data_cfg.seed, split="train")
    heldout = tasks.heldout_set(spec, data_cfg.num_eval, seed=data_cfg.seed + 1)
    return train, heldout
  load = lambda p: files.load_records(
    p, prompt_template=data_cfg.prompt_template, answer_field=data_cfg.answer_field
  )
  records = load(data_cfg.path)
  if data_cfg.eval_path:
    heldout = load(data_cfg.eval_path)
  else:
    frac = data_cfg.task.heldout_fraction
    is_held = [tasks.split_of(r["prompt"], frac) == "heldout" for r in records]
    heldout = [r for r, h in zip(records, is_held, strict=True) if h]
    records = [r for r, h in zip(records, is_held, strict=True) if not h]
    if not records or not heldout:
      raise files.DataError(f"{data_cfg.path}: too few rows to split train / held-out")
  return PromptSource(records=records, seed=data_cfg.seed), heldout[: data_cfg.num_eval]


def task_spec(data_cfg) -> tasks.TaskSpec:
  t = data_cfg.task
  spec = tasks.TaskSpec(
    name=t.name,
    style=t.style,
    ops=t.ops,
    min_value=t.min_value,
    max_value=t.max_value,
    num_terms=t.num_terms,
    heldout_fraction=t.heldout_fraction,
    zero_pad=bool(t.get("zero_pad", False)),
    paraphrase=bool(t.get("paraphrase", False)),
  )
  spec.validate()
  return spec


def format_prompts(
  records, tokenizer, *, chat_template: bool, system_prompt: str = ""
) -> list[str]:
  """Prompt texts, through the tokenizer's chat template for instruct models."""
  if not chat_template:
    return [r["prompt"] for r in records]
  out = []
  for r in records:
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": r["prompt"]})
    out.append(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
  return out


def encode_prompts(texts, tokenizer, *, add_special_tokens: bool, bucket: int = 16):
  """Left-padded ids [P, S_prompt] and mask, S_prompt rounded up to a multiple of ``bucket``.

  Rounding bounds the number of distinct prompt shapes, hence recompilations.
  """
  ids, mask = tokenizer.encode_batch(list(texts), add_special_tokens=add_special_tokens)
  ids, mask = np.asarray(ids, np.int32), np.asarray(mask, bool)
  width = -(-ids.shape[1] // bucket) * bucket
  if width > ids.shape[1]:
    pad = width - ids.shape[1]
    ids = np.concatenate([np.full((ids.shape[0], pad), tokenizer.pad_id, np.int32), ids], 1)
    mask = np.concatenate([np.zeros((mask.shape[0], pad), bool), mask], 1)
  return ids, mask
