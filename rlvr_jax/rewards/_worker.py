"""The reward worker process: a fresh interpreter started by :class:`RewardRuntime`.

Started as ``python -c "from rlvr_jax.rewards._worker import main; main()" <fd>``; talks to the
parent over a socket (a ``multiprocessing.connection.Connection``). Unlike multiprocessing's
spawn/forkserver children it does not re-import the parent's ``__main__`` (a trainer script that
imports jax would otherwise load jax in every worker), except when a reward function is defined
there, and then only once, on demand.

Messages in:  ("init", sys_path, memory_limit_bytes)
              ("job", job_id, fn_bytes, main_spec, [(index, payload), ...])
              ("stop",)
Messages out: ("ready",) once after init; ("loaded",) | ("loadfail", message) per job
              ("ok", index, value, seconds) | ("err", index, cause, message, seconds)
"""

from __future__ import annotations

import dataclasses
import multiprocessing.connection
import os
import pickle
import resource
import runpy
import signal
import sys
import time
import types
from typing import Any

import numpy as np

from rlvr_jax.rewards.protocol import ItemTimeout


def describe(exc: BaseException) -> str:
  try:
    text = f"{type(exc).__name__}: {exc}"
  except BaseException:  # noqa: BLE001  (str() of exotic objects can itself fail)
    text = type(exc).__name__
  return text[:2000]


def run_unit(fn: Any, payload: tuple) -> Any:
  kind = payload[0]
  if kind == "item":
    _, prompt, completion, row = payload
    return fn.score_item(prompt, completion, **row)
  _, prompts, completions, fields = payload
  values = np.asarray(fn(prompts, completions, **fields), dtype=np.float32).reshape(-1)
  if values.shape[0] != len(completions):
    raise ValueError(f"reward_fn returned {values.shape[0]} values for {len(completions)} rows")
  return values.tolist()


_main_loaded = False

# --- item budget and warm-up (see RewardRuntime: the budget is its per-item timeout) -------------

BUDGET_ENV = "RLVR_REWARD_ITEM_BUDGET_S"
BUDGET_MARGIN_S = 0.5  # our clock and the parent's start at different times; replies take time
_item_deadline: float | None = None


def _start_item_clock() -> None:
  """Starts the current item's budget (the runtime's per-item timeout minus a margin)."""
  global _item_deadline
  budget = os.environ.get(BUDGET_ENV)
  if budget:
    budget_s = float(budget)
    _item_deadline = time.monotonic() + budget_s - min(BUDGET_MARGIN_S, 0.2 * budget_s)


def item_seconds_left() -> float | None:
  """Seconds left before the runtime would kill this worker for the current item (None outside a
  worker). Long-running rewards (the code sandbox) cut their own limits to this."""
  return None if _item_deadline is None else _item_deadline - time.monotonic()


def warm_up(fn: Any, _depth: int = 0) -> None:
  """Calls ``warmup()`` on the reward and on rewards nested in its fields (``CombinedReward``), so
  heavy imports happen before the first item's clock starts, not inside its budget."""
  if _depth > 4:
    return
  hook = getattr(fn, "warmup", None)
  if callable(hook):
    hook()
  nested = []
  if dataclasses.is_dataclass(fn) and not isinstance(fn, type):
    nested = [getattr(fn, f.name) for f in dataclasses.fields(fn)]
  for value in nested:
    for item in value.values() if isinstance(value, dict) else [value]:
      if hasattr(item, "score_item") or hasattr(item, "warmup"):
        warm_up(item, _depth + 1)


def _load_main(main_spec: tuple[str, str] | None) -> None:
  """Makes the parent's ``__main__`` importable as ``__main__`` here (as multiprocessing does)."""
  global _main_loaded
  if main_spec is None or _main_loaded:
    return
  _main_loaded = True
  kind, target = main_spec
  if kind == "path":
    namespace = runpy.run_path(target, run_name="__mp_main__")
  else:
    namespace = runpy.run_module(target, run_name="__mp_main__", alter_sys=True)
  module = types.ModuleType("__mp_main__")
  module.__dict__.update(namespace)
  sys.modules["__main__"] = sys.modules["__mp_main__"] = module


def _serve(conn) -> None:
  cached_job, fn = None, None
  while True:
    try:
      msg = conn.recv()
    except (EOFError, OSError):
      return
    if msg[0] == "stop":
      return
    _, job_id, fn_bytes, main_spec, units = msg
    if cached_job != job_id:
      try:
        _load_main(main_spec)
        fn = pickle.loads(fn_bytes)
        warm_up(fn)
      except BaseException as e:  # noqa: BLE001  (a configuration error: the whole job fails)
        conn.send(("loadfail", describe(e)))
        continue
      cached_job = job_id
    conn.send(("loaded",))
    for index, payload in units:
      _start_item_clock()
      start = time.perf_counter()
      try:
        conn.send(("ok", index, run_unit(fn, payload), time.perf_counter() - start))
        continue
      except ItemTimeout as e:
        reply = ("err", index, "timeout", describe(e), time.perf_counter() - start)
      except MemoryError as e:
        reply = ("err", index, "memory", describe(e), time.perf_counter() - start)
      except BaseException as e:  # noqa: BLE001  (SystemExit from reward code is an item failure)
        reply = ("err", index, "exception", describe(e), time.perf_counter() - start)
      conn.send(reply)


def main() -> None:
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the trainer; it stops us
  resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
  conn = multiprocessing.connection.Connection(int(sys.argv[1]))
  _, sys_path, memory_limit_bytes = conn.recv()
  sys.path[:] = sys_path
  if memory_limit_bytes:
    resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
  conn.send(("ready",))
  _serve(conn)
