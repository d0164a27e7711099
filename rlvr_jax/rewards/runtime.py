"""A process pool that runs reward functions with per-item timeouts and never hangs or lies.

Design:
  * Workers are fresh interpreters (``subprocess``, like the ``spawn`` start method; never
    ``fork``, which would copy a parent holding JAX/XLA threads and locks), connected by a socket.
    Unlike multiprocessing's spawn/forkserver children they never re-import the trainer's
    ``__main__`` (which would load jax into every worker). A worker ignores SIGINT, disables
    core dumps and caps its own address space (``RLIMIT_AS``), so a 10 GB allocation raises
    ``MemoryError`` inside the worker instead of taking the host down.
  * Items are sent to workers in chunks (one pipe message per chunk, one small message back per
    item), so per-item overhead is a few tens of microseconds. The parent starts each item's clock
    when the previous result of that worker arrives and kills the worker (SIGKILL) when an item runs
    past ``timeout_s``; a dead worker (segfault, ``os._exit``, OOM kill) is noticed when its
    socket reaches EOF. The item is recorded as failed with its cause, the worker is replaced, and the
    rest of its chunk is re-queued.
  * All scheduling happens on one background thread, so ``submit`` is safe from any thread and
    returns a ``concurrent.futures.Future`` that resolves to a :class:`RewardResult`.
  * Reward functions are pickled with ``cloudpickle``: importable ones by reference (the
    worker imports their module), ones defined in ``__main__`` (a notebook cell, a script, a
    ``python -c``), lambdas and closures by value, as Ray and Dask send tasks. Their items run
    under the same timeouts and isolation.
  * Failed items get ``failure_value`` (default NaN, which the advantage estimators exclude);
    failures are never silent: each is listed with its cause and counted in the metrics.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import math
import multiprocessing
import multiprocessing.connection
import os
import pickle
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import Any

import cloudpickle
import numpy as np

from rlvr_jax.rewards import _worker as _worker_mod
from rlvr_jax.rewards import protocol, worker_process
from rlvr_jax.rewards._worker import describe as _describe
from rlvr_jax.rewards.protocol import ItemTimeout  # noqa: F401  (re-exported)
from rlvr_jax.rewards.worker_process import exit_description

# "invalid": the reward returned a wrong type, length or a non-finite value for the row.
CAUSES = ("timeout", "crash", "exception", "memory", "invalid")


@dataclasses.dataclass(frozen=True)
class RewardFailure:
  """One failed unit: its row index, cause (timeout / crash / exception / memory / invalid) and
  message."""

  index: int
  cause: str
  message: str
  elapsed_s: float


@dataclasses.dataclass
class RewardResult:
  """Rewards [B] float32 in row order (``failure_value`` where failed), plus diagnostics."""

  rewards: np.ndarray
  failures: list[RewardFailure]
  metrics: dict[str, float]
  info: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
  token_rewards: np.ndarray | None = None

  @property
  def failed(self) -> np.ndarray:
    mask = np.zeros(self.rewards.shape[0], dtype=bool)
    for f in self.failures:
      mask[f.index] = True
    return mask


def _to_host(name: str, value: Any) -> Any:
  """Arrays (numpy or jax) become plain lists, so workers never unpickle device arrays."""
  if name == "group_size":
    return None if value is None else int(value)
  if hasattr(value, "__array__") and not isinstance(value, list | tuple):
    return np.asarray(value).tolist()
  return value


_WORKER_CMD = "from rlvr_jax.rewards._worker import main; main()"


class _Worker(worker_process.WorkerProcess):
  """A reward worker (a fresh interpreter, see ``_worker.py``)."""

  def __init__(self, memory_limit_bytes: int | None, item_budget_s: float | None = None):
    super().__init__(_WORKER_CMD, memory_limit_bytes, _worker_env(item_budget_s))
    self.spawned = time.monotonic()
    self.loaded = False


def dumps_reward(reward_fn: Any) -> bytes:
  """The bytes a worker unpickles: ``cloudpickle`` sends functions and classes defined in
  ``__main__`` (notebook cells, scripts), lambdas and closures by value, and everything importable
  by reference, so a worker never re-runs the caller's ``__main__``. Plain ``pickle.loads``
  reads the result (cloudpickle is importable in the workers: same environment)."""
  try:
    return cloudpickle.dumps(reward_fn, protocol=pickle.HIGHEST_PROTOCOL)
  except Exception as e:
    raise TypeError(
      f"reward_fn must be picklable by cloudpickle (it may not hold locks, open files, sockets "
      f"or device arrays): {_describe(e)}"
    ) from e


def _worker_env(item_budget_s: float | None) -> dict[str, str]:
  """The worker's environment: ours, plus its per-item budget (the runtime's ``timeout_s``), which
  rewards with limits of their own (the code sandbox) stay inside instead of being killed."""
  env = dict(os.environ)
  env.pop(_worker_mod.BUDGET_ENV, None)
  if item_budget_s is not None:
    env[_worker_mod.BUDGET_ENV] = repr(float(item_budget_s))
  return env


class RewardRuntime(worker_process.ScheduledPool):
  """Pool of reward worker processes with per-item wall-clock timeouts.

  Args:
    num_workers: worker processes.
    timeout_s: wall-clock limit per item (per group / batch for ``granularity="group"/"batch"``,
      multiplied by the unit's number of rows).
    failure_value: value given to failed items (default NaN: excluded from advantages).
    memory_limit_bytes: ``RLIMIT_AS`` of each worker (None: unlimited).
    max_chunk: most items sent to a worker in one message.
    load_timeout_s: limit for unpickling the reward function (its imports) in a fresh worker.
  """

  def __init__(
    self,
    num_workers: int = 2,
    *,
    timeout_s: float = 10.0,
    failure_value: float = np.nan,
    memory_limit_bytes: int | None = 4 << 30,
    max_chunk: int = 32,
    load_timeout_s: float = 120.0,
  ):
    if num_workers < 1:
      raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    if timeout_s <= 0:
      raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    self.num_workers = num_workers
    self.timeout_s = float(timeout_s)
    self.failure_value = float(failure_value)
    self.memory_limit_bytes = memory_limit_bytes
    self.max_chunk = max_chunk
    self.load_timeout_s = load_timeout_s
    self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="reward-runtime")
    self._workers: list[_Worker] = []
    self._spare: _Worker | None = None
    self._start_failures = 0
    self._lock = threading.Lock()
    self._job_counter = 0
    self.worker_restarts = 0
    self._closed = False
    # Start the workers now (on the scheduler thread), so the first step does not pay for it.
    self._executor.submit(self._ensure_workers).result()

  # --- public API -------------------------------------------------------------------------------

  def submit(
    self,
    reward_fn: Any,
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    granularity: str = "item",
    **fields: Any,
  ) -> concurrent.futures.Future:
    """Starts scoring a batch; returns a Future of :class:`RewardResult`.

    ``reward_fn`` is an :class:`ItemReward` (scored per item in workers, combined here) or a plain
    ``reward_fn(prompts, completions, **fields)`` (any function cloudpickle can send: module
    level, ``__main__``, a lambda or a closure): with ``granularity="item"`` it is
    called on one-row batches, with ``"group"`` on whole groups (needs ``group_size``), with
    ``"batch"`` once on the whole batch; a failure then fails every row of that unit.
    """
    self._check_open()
    prompts, completions = list(prompts), list(completions)
    fields = {k: _to_host(k, v) for k, v in fields.items()}
    num_rows, group_size = protocol.check_batch(prompts, completions, fields)
    if granularity not in ("item", "group", "batch"):
      raise ValueError(f"granularity must be 'item', 'group' or 'batch', got {granularity!r}")
    if granularity == "group" and group_size is None:
      raise ValueError("granularity='group' needs group_size=")
    item_fn = protocol.as_item_reward(reward_fn) if granularity == "item" else reward_fn
    fn_bytes = dumps_reward(item_fn)
    with self._lock:
      self._job_counter += 1
      job_id = self._job_counter
    args = (job_id, item_fn, fn_bytes, prompts, completions, fields, granularity, num_rows)
    return self._executor.submit(self._run_job, *args)

  def run(self, reward_fn: Any, prompts, completions, **kwargs) -> RewardResult:
    """Blocking ``submit(...).result()``."""
    return self.submit(reward_fn, prompts, completions, **kwargs).result()

  # --- scheduling (runs on the single executor thread) -------------------------------------------

  def _new_worker(self) -> _Worker:
    """A started worker. One spare is kept warm, so replacing a killed worker costs no start-up."""
    spare, self._spare = self._spare, _Worker(self.memory_limit_bytes, self.timeout_s)
    if spare is not None and spare.is_alive():
      return spare
    return _Worker(self.memory_limit_bytes, self.timeout_s)

  def _ensure_workers(self) -> None:
    self._workers = [w for w in self._workers if w.is_alive()]
    while len(self._workers) < self.num_workers:
      self._workers.append(self._new_worker())

  def _stop_workers(self) -> None:
    if self._spare is not None:
      self._workers.append(self._spare)
      self._spare = None
    worker_process.stop_all(self._workers)
    self._workers = []

  def _ready(self, worker: _Worker) -> bool:
    """Whether the worker finished starting (non-blocking); a worker that died starting is
    replaced, and repeated start-up deaths raise (a broken environment, not a bad item)."""
    if worker.ready:
      return True
    if not worker.conn.poll():
      return False
    try:
      worker.ready = worker.conn.recv() == ("ready",)
      self._start_failures = 0
      return worker.ready
    except (EOFError, OSError):
      worker.proc.wait()
      self._start_failures += 1
      if self._start_failures > 3:
        raise RuntimeError(
          f"reward workers die while starting ({exit_description(worker.proc.returncode)})"
        ) from None
      self._replace(worker)
      return False

  def _replace(self, worker: _Worker) -> None:
    worker.kill()
    self._workers[self._workers.index(worker)] = self._new_worker()
    self.worker_restarts += 1

  def _units(self, prompts, completions, fields, granularity, num_rows):
    """(payloads, rows per unit) for the requested granularity."""
    if granularity == "item":
      payloads = [
        ("item", prompts[b], completions[b], protocol.row_fields(fields, b))
        for b in range(num_rows)
      ]
      return payloads, 1
    size = num_rows if granularity == "batch" else int(fields["group_size"])
    payloads = []
    for start in range(0, num_rows, size):
      rows = slice(start, start + size)
      sub = {k: (v if k == "group_size" else list(v[rows])) for k, v in fields.items()}
      payloads.append(("call", prompts[rows], completions[rows], sub))
    return payloads, size

  def _execute(self, job_id: int, fn_bytes: bytes, payloads: list, unit_timeout: float):
    """Runs all units; returns (values, failures) with values[i] None where unit i failed."""
    try:
      return self._execute_units(job_id, fn_bytes, payloads, unit_timeout)
    except BaseException:
      # Busy workers still hold units of the abandoned job: replace them so no stale result
      # reaches the next job.
      for w in list(self._workers):
        if w.units:
          w.units.clear()
          self._replace(w)
      raise

  def _execute_units(self, job_id, fn_bytes, payloads, unit_timeout):
    main_spec = None  # by-value pickling (dumps_reward): workers never import __main__
    num_units = len(payloads)
    values: list[Any] = [None] * num_units
    failures: dict[int, RewardFailure] = {}
    done = 0
    chunk = max(1, min(self.max_chunk, math.ceil(num_units / (4 * self.num_workers))))
    pending = collections.deque(
      list(range(s, min(s + chunk, num_units))) for s in range(0, num_units, chunk)
    )

    def fail_current(worker, cause, message):
      nonlocal done
      index = worker.units.popleft()
      failures[index] = RewardFailure(index, cause, message, time.monotonic() - worker.started)
      done += 1
      if worker.units:
        pending.appendleft(list(worker.units))
        worker.units.clear()
      self._replace(worker)

    self._ensure_workers()
    while done < num_units:
      for slot in range(len(self._workers)):
        if self._workers[slot].units or not pending:
          continue
        if not self._workers[slot].is_alive():
          self._replace(self._workers[slot])
        w = self._workers[slot]
        if not self._ready(w):
          continue  # still starting: never block the scheduler on a send it cannot read yet
        units = pending.popleft()
        try:
          w.conn.send(("job", job_id, fn_bytes, main_spec, [(i, payloads[i]) for i in units]))
        except OSError:  # died since the liveness check: requeue, a fresh worker takes it
          pending.appendleft(units)
          self._replace(w)
          continue
        w.units.extend(units)
        w.started = time.monotonic()
        w.deadline, w.loaded = w.started + self.load_timeout_s, False
      busy = [w for w in self._workers if w.units]
      starting = [w for w in self._workers if not w.units and not w.ready] if pending else []
      deadlines = [w.deadline for w in busy] + [w.spawned + self.load_timeout_s for w in starting]
      if not deadlines:
        continue
      wait_s = max(0.0, min(deadlines) - time.monotonic())
      # A dying worker closes its socket, so its connection becomes readable (EOF).
      handles = [w.conn for w in busy + starting]
      ready = set(multiprocessing.connection.wait(handles, timeout=wait_s))
      for w in starting:
        if w.conn not in ready and time.monotonic() > w.spawned + self.load_timeout_s:
          raise RuntimeError(f"a reward worker did not start within {self.load_timeout_s}s")
      for w in busy:
        if w.conn in ready:
          eof = False
          try:
            while w.units and w.conn.poll():
              msg = w.conn.recv()
              now = time.monotonic()
              if msg[0] == "loadfail":
                raise RuntimeError(
                  f"reward_fn could not be loaded in a worker process (is every module it "
                  f"imports importable there, with the same sys.path?): {msg[1]}"
                )
              if msg[0] == "loaded":
                w.loaded = True
              else:
                index = w.units.popleft()
                if msg[0] == "ok":
                  values[index] = msg[2]
                else:
                  failures[index] = RewardFailure(index, msg[2], msg[3], msg[4])
                done += 1
              w.started, w.deadline = now, now + unit_timeout
          except (EOFError, OSError):
            eof = True
          if w.units and eof:
            try:
              w.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
              pass  # closed its socket but lives on: killed by _replace
            fail_current(w, "crash", exit_description(w.proc.returncode))
        elif w.units and time.monotonic() >= w.deadline:
          what = "item" if w.loaded else "loading reward_fn"
          fail_current(
            w, "timeout", f"{what} exceeded {w.deadline - w.started:.3g}s; worker killed"
          )
    return values, [failures[i] for i in sorted(failures)]

  def _run_job(self, job_id, item_fn, fn_bytes, prompts, completions, fields, granularity, n):
    start = time.monotonic()
    restarts_before = self.worker_restarts
    payloads, rows_per_unit = self._units(prompts, completions, fields, granularity, n)
    values, unit_failures = self._execute(
      job_id, fn_bytes, payloads, self.timeout_s * rows_per_unit
    )
    if granularity == "item":
      failures = unit_failures
      output = item_fn.combine(values, **fields)
    else:
      failures = [
        dataclasses.replace(f, index=f.index * rows_per_unit + r)
        for f in unit_failures
        for r in range(rows_per_unit)
      ]
      flat = np.full(n, np.nan, dtype=np.float32)
      for u, v in enumerate(values):
        if v is not None:
          flat[u * rows_per_unit : (u + 1) * rows_per_unit] = v
      output = protocol.RewardOutput(rewards=flat)
    rewards = np.asarray(output.rewards, dtype=np.float32).reshape(-1)
    if rewards.shape != (n,):
      raise ValueError(f"combine returned rewards of shape {rewards.shape}, expected ({n},)")
    failures = _with_output_failures(failures, output, rewards)
    failed = np.zeros(n, dtype=bool)
    for f in failures:
      failed[f.index] = True
    metrics = _metrics(rewards, failed, failures, output, time.monotonic() - start)
    metrics["reward/worker_restarts"] = float(self.worker_restarts - restarts_before)
    rewards = np.where(failed, np.float32(self.failure_value), rewards).astype(np.float32)
    return RewardResult(rewards, failures, metrics, dict(output.info), output.token_rewards)


def _with_output_failures(failures, output, rewards) -> list[RewardFailure]:
  """``failures`` plus the rows that ``combine`` reported failed (``RewardOutput.failures``) and
  the rows whose reward is NaN / inf with no recorded failure (cause "invalid"): a reward that
  returns garbage is counted and listed, never silently trained on or dropped."""
  seen = {f.index for f in failures}
  extra = []
  for row, (cause, message) in sorted(output.failures.items()):
    if row not in seen:
      extra.append(RewardFailure(int(row), cause, message, 0.0))
      seen.add(row)
  for row in np.flatnonzero(~np.isfinite(rewards)):
    if int(row) not in seen:
      extra.append(RewardFailure(int(row), "invalid", "reward is NaN or infinite", 0.0))
  return sorted(failures + extra, key=lambda f: f.index) if extra else failures


def _metrics(rewards, failed, failures, output, elapsed_s) -> dict[str, float]:
  ok = rewards[~failed & np.isfinite(rewards)]
  metrics = {
    "reward/mean": float(ok.mean()) if ok.size else math.nan,
    "reward/std": float(ok.std()) if ok.size else math.nan,
    "reward/min": float(ok.min()) if ok.size else math.nan,
    "reward/max": float(ok.max()) if ok.size else math.nan,
    "reward/fail_frac": float(failed.mean()) if failed.size else 0.0,
    "reward/time_s": elapsed_s,
    "reward/items_per_s": rewards.shape[0] / max(elapsed_s, 1e-9),
  }
  for cause in CAUSES:
    metrics[f"reward/fail/{cause}"] = float(sum(f.cause == cause for f in failures))
  correct = output.info.get("correct")
  if correct is not None:
    correct = np.asarray(correct, dtype=np.float32)
    valid = correct[np.isfinite(correct) & ~failed]
    metrics["reward/accuracy"] = float(valid.mean()) if valid.size else math.nan
  metrics.update(output.metrics)
  return metrics
