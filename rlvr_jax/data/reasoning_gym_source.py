"""reasoning-gym tasks as a prompt source (``data.source="reasoning_gym"``).

reasoning-gym (``reasoning_gym`` on PyPI) is a library of procedural generators, each with its own
verifier ``score_answer(answer, entry)``. Its datasets are indexable: entry ``i`` of a dataset with
seed ``s`` is drawn from ``random.Random(s + i)``, so an entry is a pure function of
``(task, task config, s + i)``.

Splits (``data.seed`` = s, ``data.reasoning_gym.size`` = N, tasks t_1..t_k with shares N_j):
  train     entries 0..N_j-1 of each task's dataset with seed s (PromptSource shuffles them per
            epoch, like file records, so the position alone restores the stream);
  held-out  entries of each task's dataset with seed s + N (RNG seeds s + N, s + N + 1, ...: none
            is a train RNG seed), skipping every question that also occurs in train, until
            ``data.num_eval`` are collected. Held-out and train therefore share no question even
            when a small task space makes the generator repeat itself.

A record is ``{"prompt", "answer", "task", "reasoning_gym": {"task", "config", "entry"}}``; the
``reasoning_gym`` field travels to the reward workers, where
``rewards.ReasoningGymReward`` rebuilds the task's dataset from (task, config) and calls its
``score_answer(extracted answer, entry)``.

Config (``data.reasoning_gym``):
  tasks: comma-separated task names (``"chain_sum"``, ``"chain_sum,leg_counting"``); the train
    set is split evenly between them.
  task_config: per-task keyword arguments of the task's config dataclass, keyed by task name
    (``{"chain_sum": {"min_terms": 2, "max_terms": 2}}``); ``seed`` and ``size`` are set here.
    Entries of registry tasks not in ``tasks`` are ignored (the command line cannot delete a key).
  task_config_json: the same as a JSON object, merged over ``task_config`` field by field; the
    command line can set it for any task
    (``--config.data.reasoning_gym.task_config_json='{"leg_counting": {"max_animals": 3}}'``).
  size: N, the number of train entries.
  answer_format: "answer_tag" (the instruction asks for ``<answer>...</answer>`` and the reward
    scores the last such tag, reasoning-gym's convention) or "raw" (the whole completion, stripped:
    for tiny models that answer right after the prompt).
  prompt_template: ``str.format`` template over the entry: ``{question}``, ``{answer}`` and
    ``{metadata[...]}`` (e.g. ``"{metadata[expression]}="`` for a character model).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json

ANSWER_FORMATS = ("answer_tag", "raw")
ANSWER_INSTRUCTION = "Give only the final answer between <answer> and </answer> tags."
_RESERVED = ("seed", "size")


class InvalidConfig(ValueError):
  """A bad ``data.reasoning_gym`` value; ``field`` is the dotted config field."""

  def __init__(self, field: str, message: str):
    super().__init__(f"{field}: {message}")
    self.field, self.message = field, message


@functools.cache
def registry() -> dict:
  """reasoning-gym's task registry: name -> (dataset class, config class)."""
  import reasoning_gym  # noqa: F401  (importing registers every task)
  from reasoning_gym.factory import DATASETS

  return DATASETS


def task_names(rg_cfg) -> list[str]:
  """The task names of ``data.reasoning_gym.tasks`` (comma-separated string or a sequence)."""
  raw = rg_cfg.tasks
  names = raw.split(",") if isinstance(raw, str) else list(raw)
  return [n.strip() for n in names if n.strip()]


def task_configs(rg_cfg) -> dict[str, dict]:
  """Task name -> config kwargs: ``task_config`` with ``task_config_json`` merged over it."""
  base = rg_cfg.get("task_config") or {}
  out = {k: dict(v.to_dict() if hasattr(v, "to_dict") else v) for k, v in base.items()}
  text = rg_cfg.get("task_config_json") or ""
  if text.strip():
    try:
      extra = json.loads(text)
    except json.JSONDecodeError as e:
      raise InvalidConfig("data.reasoning_gym.task_config_json", f"invalid JSON: {e}") from e
    if not isinstance(extra, dict) or not all(isinstance(v, dict) for v in extra.values()):
      raise InvalidConfig(
        "data.reasoning_gym.task_config_json", 'expected {"task": {"field": value, ...}, ...}'
      )
    for name, kwargs in extra.items():
      out[name] = {**out.get(name, {}), **kwargs}
  return out


def task_kwargs(rg_cfg, name: str) -> dict:
  """The config keyword arguments of task ``name`` (empty when none are given)."""
  return dict(task_configs(rg_cfg).get(name) or {})


def _unknown(name: str, known) -> str:
  close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
  hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
  return f"unknown reasoning-gym task {name!r}; {hint}valid tasks: {', '.join(sorted(known))}"


def check_config(data_cfg) -> None:
  """Raises ``InvalidConfig`` naming the field for unknown tasks (with the closest valid names and
  the full list), bad task config keys or values (as the task's own ``validate`` reports them),
  and bad sizes / formats. Builds no dataset entries."""
  rg = data_cfg.reasoning_gym
  field = "data.reasoning_gym"
  names = task_names(rg)
  if not names:
    raise InvalidConfig(f"{field}.tasks", "empty; give one or more reasoning-gym task names")
  known = registry()
  for name in names:
    if name not in known:
      raise InvalidConfig(f"{field}.tasks", _unknown(name, known))
  if len(set(names)) != len(names):
    raise InvalidConfig(f"{field}.tasks", f"a task is listed twice: {names}")
  for name in task_configs(rg):  # a typo here would silently drop the task's settings
    if name not in known:
      raise InvalidConfig(f"{field}.task_config.{name}", _unknown(name, known))
  for name in names:
    kwargs = task_kwargs(rg, name)
    config_cls = known[name][1]
    fields = {f.name for f in dataclasses.fields(config_cls)}
    for key in kwargs:
      where = f"{field}.task_config.{name}.{key}"
      if key in _RESERVED:
        raise InvalidConfig(where, f"set by data.seed / {field}.size, not per task")
      if key not in fields:
        raise InvalidConfig(where, f"not a field of {config_cls.__name__}: {sorted(fields)}")
    try:
      config = config_cls(**kwargs)
      if hasattr(config, "validate"):
        config.validate()
    except Exception as e:  # noqa: BLE001  (the library raises AssertionError / ValueError)
      raise InvalidConfig(f"{field}.task_config.{name}", f"rejected by {name}: {e!r}") from e
  if rg.size < len(names):
    raise InvalidConfig(f"{field}.size", f"must be >= the number of tasks, got {rg.size}")
  if rg.answer_format not in ANSWER_FORMATS:
    raise InvalidConfig(f"{field}.answer_format", f"{rg.answer_format!r} not in {ANSWER_FORMATS}")


def make_dataset(name: str, kwargs: dict, *, seed: int, size: int):
  """A reasoning-gym dataset of task ``name`` with config ``kwargs``, seed and size."""
  return registry()[name][0](config=registry()[name][1](**kwargs, seed=seed, size=size))


def _record(entry: dict, name: str, kwargs: dict, rg_cfg) -> dict:
  try:
    prompt = rg_cfg.prompt_template.format(**entry)
  except (KeyError, IndexError, AttributeError) as e:
    raise InvalidConfig(
      "data.reasoning_gym.prompt_template",
      f"{rg_cfg.prompt_template!r} needs {e!r}, which a {name} entry does not have (fields: "
      f"question, answer, metadata[{', '.join(sorted(entry['metadata']))}])",
    ) from e
  if rg_cfg.answer_format == "answer_tag":
    prompt = f"{prompt}\n{ANSWER_INSTRUCTION}"
  return {
    "prompt": prompt,
    "answer": str(entry["answer"]),
    "task": name,
    "reasoning_gym": {"task": name, "config": kwargs, "entry": entry},
  }


def _shares(total: int, k: int) -> list[int]:
  return [total // k + (j < total % k) for j in range(k)]


def build_records(data_cfg) -> tuple[list[dict], list[dict]]:
  """(train records, held-out records) for ``data.reasoning_gym``; see the module docstring."""
  check_config(data_cfg)
  rg = data_cfg.reasoning_gym
  names = task_names(rg)
  seed, size = int(data_cfg.seed), int(rg.size)
  train, heldout = [], []
  for name, n_train, n_eval in zip(
    names, _shares(size, len(names)), _shares(int(data_cfg.num_eval), len(names)), strict=True
  ):
    kwargs = task_kwargs(rg, name)
    ds = make_dataset(name, kwargs, seed=seed, size=n_train)
    records = [_record(ds[i], name, kwargs, rg) for i in range(n_train)]
    seen = {r["reasoning_gym"]["entry"]["question"] for r in records}
    train += records
    # Held-out: RNG seeds from seed + size on (disjoint from every train RNG seed), new questions
    # only; 20 draws per wanted problem bounds the search in small problem spaces.
    budget = max(20 * n_eval, 100)
    ds = make_dataset(name, kwargs, seed=seed + size, size=budget)
    got = 0
    for i in range(budget):
      entry = ds[i]
      if got == n_eval:
        break
      if entry["question"] in seen:
        continue
      seen.add(entry["question"])
      heldout.append(_record(entry, name, kwargs, rg))
      got += 1
    if got == 0:
      raise InvalidConfig(
        "data.reasoning_gym.task_config",
        f"task {name}: no held-out question outside the {n_train} train entries in {budget} "
        "draws; the task's problem space is too small for this size (lower "
        "data.reasoning_gym.size or widen the task config)",
      )
  return train, heldout
