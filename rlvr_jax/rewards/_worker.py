"""The reward worker process: a fresh interpreter started by :class:`RewardRuntime`.

Started as ``python -c "from rlvr_jax.rewards._worker import main; main()" <fd>``; talks to the
parent over a socket (a ``multiprocessing.connection.Connection``). Unlike multiprocessing's
spawn/forkserver children it never re-imports the parent's ``__main__`` (a trainer script that
imports jax would otherwise load jax in every worker): reward functions defined there arrive by
value (``cloudpickle``, see ``runtime.dumps_reward``).

Messages in:  ("init", sys_path, memory_limit_bytes)
              ("job", job_id, fn_bytes, None, [(index, payload), ...])
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
import signal
import sys
import time
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
    return _check_score(fn, fn.score_item(prompt, completion, **row))
  _, prompts, completions, fields = payload
  values = np.asarray(fn(prompts, completions, **fields), dtype=np.float32).reshape(-1)
  if values.shape[0] != len(completions):
    raise ValueError(f"reward_fn returned {values.shape[0]} values for {len(completions)} rows")
  return values.tolist()


def _check_score(fn: Any, score: Any) -> Any:
  """``score_item`` must return a dict (the protocol); anything else fails the item here, with
  a message, instead of breaking ``combine`` for the whole batch in the caller."""
  if not isinstance(score, dict):
    raise TypeError(f"{type(fn).__name__}.score_item returned {type(score).__name__}, not a dict")
  return score


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


def _serve(conn) -> None:
  cached_job, fn = None, None
  while True:
    try:
      msg = conn.recv()
    except (EOFError, OSError):
      return
    if msg[0] == "stop":
      return
    _, job_id, fn_bytes, _, units = msg
    if cached_job != job_id:
      try:
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
