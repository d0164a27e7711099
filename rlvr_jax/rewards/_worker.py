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

import multiprocessing.connection
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
      except BaseException as e:  # noqa: BLE001  (a configuration error: the whole job fails)
        conn.send(("loadfail", describe(e)))
        continue
      cached_job = job_id
    conn.send(("loaded",))
    for index, payload in units:
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
