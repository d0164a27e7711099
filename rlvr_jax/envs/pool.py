"""EnvPool: the environments of a batch of episodes, in worker processes, with per-step timeouts.

Design (after ``rlvr_jax.rewards.runtime``; the worker processes' parent side is shared with it,
``rlvr_jax.rewards.worker_process``):
  * Workers are fresh interpreters (``subprocess``, never a fork of the trainer) that host the
    environments of many episodes; episode ``e`` lives on worker slot ``e % num_workers``. The
    batch's calls are sent as one message per worker; each reply restarts that worker's clock.
  * An environment that raises or returns a malformed tuple fails its episode only (the worker
    stays). One that hangs past its limit, or kills its worker (``os._exit``, segfault, OOM),
    fails its episode with cause ``timeout`` / ``crash``; the worker is replaced, and the other
    live episodes it hosted are rebuilt on the new worker by replaying their actions from their
    seeds (each episode has its own RNG state, see ``_worker.py``, so replay is exact for
    deterministic envs; one whose replay fails is failed with cause ``lost``). Nothing is lost
    silently: every failure carries its cause and message and is counted in ``failure_counts``.
  * Calls run on one scheduler thread: ``submit_reset`` / ``submit_step`` return
    ``concurrent.futures.Future`` objects, so the caller can step the episodes whose turn finished
    while the device keeps decoding the others; jobs run in submission order.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import multiprocessing.connection
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rlvr_jax.envs import protocol, registry
from rlvr_jax.envs.protocol import EnvFailure, ResetResult, StepResult
from rlvr_jax.rewards import worker_process
from rlvr_jax.rewards.worker_process import exit_description

_WORKER_CMD = "from rlvr_jax.envs._worker import main; main()"


class _Worker(worker_process.WorkerProcess):
  """An environment worker (see ``_worker.py``); ``wait_ready`` blocks until it is up."""

  def __init__(self, memory_limit_bytes: int | None, start_timeout_s: float):
    super().__init__(_WORKER_CMD, memory_limit_bytes)
    self.start_timeout_s = start_timeout_s

  def wait_ready(self) -> None:
    if self.ready:
      return
    if not self.conn.poll(self.start_timeout_s):
      self.kill()
      raise RuntimeError(f"an environment worker did not start within {self.start_timeout_s}s")
    try:
      self.ready = self.conn.recv() == ("ready",)
    except (EOFError, OSError):
      self.proc.wait()
      raise RuntimeError(
        f"environment worker died while starting ({exit_description(self.proc.returncode)})"
      ) from None


@dataclasses.dataclass
class _Episode:
  """Parent-side record of an episode: enough to rebuild it by replay."""

  spec: registry.EnvSpec
  seed: int | None
  slot: int
  actions: list[str] = dataclasses.field(default_factory=list)
  live: bool = False  # its env exists in the worker (reset succeeded)
  done: bool = False
  failure: EnvFailure | None = None


@dataclasses.dataclass
class _Unit:
  kind: str
  episode: int
  payload: Any
  timeout_s: float


class EnvPool(worker_process.ScheduledPool):
  """Environments of a batch of episodes in worker processes.

  Args:
    spec: default :class:`~rlvr_jax.envs.registry.EnvSpec` (or id string) of every episode;
      ``reset(seeds, specs=...)`` can give one per episode instead.
    num_workers: worker processes.
    timeout_s: wall-clock limit of one ``step``.
    reset_timeout_s: limit of one ``reset`` including building the env (first imports included).
    memory_limit_bytes: ``RLIMIT_AS`` of each worker (None: unlimited).
    start_timeout_s: limit for a worker interpreter to start.
  """

  def __init__(
    self,
    spec: registry.EnvSpec | str | None = None,
    *,
    num_workers: int = 2,
    timeout_s: float = 10.0,
    reset_timeout_s: float = 60.0,
    memory_limit_bytes: int | None = 4 << 30,
    start_timeout_s: float = 120.0,
  ):
    if num_workers < 1:
      raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    if timeout_s <= 0 or reset_timeout_s <= 0:
      raise ValueError(f"timeouts must be > 0, got {timeout_s}, {reset_timeout_s}")
    self.spec = None if spec is None else registry.check_spec(spec)
    self.num_workers, self.timeout_s, self.reset_timeout_s = num_workers, timeout_s, reset_timeout_s
    self.memory_limit_bytes, self.start_timeout_s = memory_limit_bytes, start_timeout_s
    self.worker_restarts = 0
    self.failure_counts: collections.Counter[str] = collections.Counter()
    self._episodes: dict[int, _Episode] = {}
    self._closed = False
    self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="env-pool")
    self._workers: list[_Worker] = []
    self._executor.submit(self._start_workers).result()

  # --- public API -------------------------------------------------------------------------------

  def submit_reset(
    self, seeds: Sequence[int | None], specs: Sequence[registry.EnvSpec | str] | None = None
  ) -> concurrent.futures.Future:
    """Starts new episodes 0..n-1 (dropping the previous ones); Future of list[ResetResult]."""
    self._check_open()
    seeds = list(seeds)
    if specs is None:
      if self.spec is None:
        raise ValueError("EnvPool.reset needs specs= (the pool was built without a spec)")
      specs = [self.spec] * len(seeds)
    elif len(specs) != len(seeds):
      raise ValueError(f"reset: {len(specs)} specs for {len(seeds)} seeds")
    specs = [registry.check_spec(s) for s in specs]
    return self._executor.submit(self._reset_job, seeds, specs)

  def reset(self, seeds, specs=None) -> list[ResetResult]:
    """Blocking ``submit_reset(...).result()``."""
    return self.submit_reset(seeds, specs).result()

  def submit_step(
    self, actions: Mapping[int, str] | Sequence[str | None]
  ) -> concurrent.futures.Future:
    """Steps episodes; Future of the results in the shape of ``actions``.

    ``actions``: {episode: action_text}, or a list with one entry per episode where None skips
    the episode (finished ones). The result is a dict, or a list with None where skipped.
    Stepping an episode that is done (terminated, truncated or failed) raises ValueError.
    """
    self._check_open()
    if isinstance(actions, Mapping):
      items = {int(e): a for e, a in actions.items()}
    else:
      items = {e: a for e, a in enumerate(actions) if a is not None}
    for e, a in items.items():
      if not isinstance(a, str):
        raise TypeError(f"action of episode {e} must be str, got {type(a).__name__}")
    as_list = None if isinstance(actions, Mapping) else len(actions)
    return self._executor.submit(self._step_job, items, as_list)

  def step(self, actions) -> dict[int, StepResult] | list[StepResult | None]:
    """Blocking ``submit_step(...).result()``."""
    return self.submit_step(actions).result()

  def metrics(self) -> dict[str, float]:
    """Failure counts by cause and worker restarts since the pool started."""
    out = {f"env/fail/{c}": float(self.failure_counts[c]) for c in protocol.CAUSES}
    out["env/worker_restarts"] = float(self.worker_restarts)
    return out

  # --- jobs (on the scheduler thread) ----------------------------------------------------------

  def _reset_job(self, seeds, specs) -> list[ResetResult]:
    self._episodes = {
      e: _Episode(spec, seed, e % self.num_workers)
      for e, (seed, spec) in enumerate(zip(seeds, specs, strict=True))
    }
    # One "clear" per worker drops the previous episodes' envs; it carries its slot as payload.
    units = [_Unit("clear", -1, slot, self.reset_timeout_s) for slot in range(self.num_workers)]
    units += [
      _Unit("reset", e, (ep.spec, ep.seed), self.reset_timeout_s)
      for e, ep in self._episodes.items()
    ]
    outcomes = self._execute(units)[self.num_workers :]
    return [protocol.failed_reset(out) if isinstance(out, EnvFailure) else out for out in outcomes]

  def _step_job(self, items: dict[int, str], as_list: int | None):
    for e in items:
      ep = self._episodes.get(e)
      if ep is None:
        raise ValueError(f"episode {e} does not exist (reset created {len(self._episodes)})")
      if ep.done or ep.failure is not None:
        state = f"failed ({ep.failure.cause})" if ep.failure is not None else "done"
        raise ValueError(f"episode {e} is {state}; it cannot be stepped")
    keys = list(items)
    outcomes = self._execute([_Unit("step", e, items[e], self.timeout_s) for e in keys])
    results = {
      e: protocol.failed_step(out) if isinstance(out, EnvFailure) else out
      for e, out in zip(keys, outcomes, strict=True)
    }
    if as_list is None:
      return results
    return [results.get(e) for e in range(as_list)]

  # --- scheduling -------------------------------------------------------------------------------

  def _spawn(self) -> _Worker:
    """A started worker (blocks until its interpreter is up; raises RuntimeError if it is not)."""
    worker = _Worker(self.memory_limit_bytes, self.start_timeout_s)
    worker.wait_ready()
    return worker

  def _start_workers(self) -> None:
    self._workers = [
      _Worker(self.memory_limit_bytes, self.start_timeout_s) for _ in range(self.num_workers)
    ]
    for w in self._workers:
      w.wait_ready()

  def _stop_workers(self) -> None:
    worker_process.stop_all(self._workers)
    self._workers = []

  def _slot(self, unit: _Unit) -> int:
    return unit.payload if unit.kind == "clear" else self._episodes[unit.episode].slot

  def _replace(self, slot: int, units: list[_Unit], pending: collections.deque) -> None:
    """New worker at ``slot``; queues replays of its other live episodes before its pending units."""
    self._workers[slot].kill()
    self._workers[slot] = self._spawn()
    self.worker_restarts += 1
    replays = []
    for e, ep in self._episodes.items():
      if ep.slot == slot and ep.live and not ep.done and ep.failure is None:
        timeout = self.reset_timeout_s + self.timeout_s * len(ep.actions)
        units.append(_Unit("restore", e, (ep.spec, ep.seed, list(ep.actions)), timeout))
        replays.append(len(units) - 1)
    pending.extendleft(reversed(replays))

  def _execute(self, units: list[_Unit]) -> list[Any]:
    try:
      return self._execute_units(units)
    except BaseException:
      # Abandoned job (a worker that cannot start, an interrupt): workers still running its units
      # are replaced so no stale reply reaches the next job; their episodes are lost.
      for slot, w in enumerate(self._workers):
        if w.units:
          w.units.clear()
          w.kill()
          try:
            self._workers[slot] = self._spawn()
          except RuntimeError:
            pass  # the dead worker stays; the next job's dispatch replaces it
          for ep in self._episodes.values():
            if ep.slot == slot and ep.failure is None:
              ep.failure, ep.live = EnvFailure("lost", "its worker was reset after an error"), False
      raise

  def _execute_units(self, units: list[_Unit]) -> list[Any]:
    """Runs units (appending replay units as needed); outcome per original unit: value or
    EnvFailure."""
    num_original = len(units)
    outcomes: list[Any] = [None] * num_original
    pending = {slot: collections.deque() for slot in range(self.num_workers)}
    for uid, unit in enumerate(units):
      pending[self._slot(unit)].append(uid)

    def finish(uid: int, value: Any) -> None:
      """Records a unit's outcome and keeps the parent's episode records (replay state) current."""
      unit = units[uid]
      ep = self._episodes.get(unit.episode)
      if isinstance(value, EnvFailure):
        if unit.kind == "restore":
          message = f"rebuilding it after a worker replacement failed: {value.message}"
          value = EnvFailure("lost", message, value.elapsed_s)
        if ep is not None and ep.failure is None:
          self.failure_counts[value.cause] += 1
          ep.failure, ep.live = value, False
      elif ep is not None and unit.kind == "reset":
        ep.live = True
      elif ep is not None and unit.kind == "step":
        ep.actions.append(unit.payload)
        ep.done = value.terminated or value.truncated
      if uid < num_original:
        outcomes[uid] = value if ep is None or ep.failure is None else ep.failure

    while any(pending.values()) or any(w.units for w in self._workers):
      for slot, queue in pending.items():
        w = self._workers[slot]
        if w.units or not queue:
          continue
        batch = []
        while queue:
          uid = queue.popleft()
          ep = self._episodes.get(units[uid].episode)
          if ep is not None and ep.failure is not None and units[uid].kind != "reset":
            finish(uid, ep.failure)  # failed since submission (e.g. its replay failed)
            continue
          batch.append(uid)
        if not batch:
          continue
        if not w.is_alive():
          queue.extendleft(reversed(batch))
          self._replace(slot, units, queue)
          continue
        message = [(uid, units[uid].kind, units[uid].episode, units[uid].payload) for uid in batch]
        try:
          w.conn.send(("units", message))
        except OSError:
          queue.extendleft(reversed(batch))
          self._replace(slot, units, queue)
          continue
        w.units.extend(batch)
        w.started = time.monotonic()
        w.deadline = w.started + units[batch[0]].timeout_s
      busy = [w for w in self._workers if w.units]
      if not busy:
        continue
      wait_s = max(0.0, min(w.deadline for w in busy) - time.monotonic())
      ready = set(multiprocessing.connection.wait([w.conn for w in busy], timeout=wait_s))
      for slot, w in enumerate(self._workers):
        if not w.units:
          continue
        if w.conn in ready:
          self._receive(slot, w, units, pending[slot], finish)
        elif time.monotonic() >= w.deadline:
          uid = w.units.popleft()
          message = f"{units[uid].kind} exceeded {units[uid].timeout_s:.3g}s; worker killed"
          self._lose_worker(
            slot,
            uid,
            EnvFailure("timeout", message, units[uid].timeout_s),
            units,
            pending[slot],
            finish,
          )
    return outcomes

  def _receive(self, slot, w, units, queue, finish) -> None:
    try:
      while w.units and w.conn.poll():
        msg = w.conn.recv()
        uid = w.units.popleft()
        if msg[0] == "ok":
          finish(uid, msg[2])
        else:
          finish(uid, EnvFailure(msg[2], msg[3], msg[4]))
        now = time.monotonic()
        if w.units:
          w.started, w.deadline = now, now + units[w.units[0]].timeout_s
    except (EOFError, OSError):
      try:
        w.proc.wait(timeout=5)
      except subprocess.TimeoutExpired:
        pass
      if w.units:
        uid = w.units.popleft()
        failure = EnvFailure(
          "crash", exit_description(w.proc.returncode), time.monotonic() - w.started
        )
        self._lose_worker(slot, uid, failure, units, queue, finish)

  def _lose_worker(self, slot, uid, failure, units, queue, finish) -> None:
    """Fails the unit that killed / hung the worker, requeues the rest, replaces the worker."""
    w = self._workers[slot]
    rest = list(w.units)
    w.units.clear()
    finish(uid, failure)
    queue.extendleft(reversed(rest))
    self._replace(slot, units, queue)
