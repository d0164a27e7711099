"""The parent side of a worker process, shared by the reward runtime and the environment pool.

A worker is a fresh interpreter (``python -c <command> <fd>``, never a fork of the trainer, which
holds JAX/XLA threads and locks) connected to the parent by a socket pair. Its first message from
the parent is ``("init", sys_path, memory_limit_bytes)`` (``_worker.start_worker`` reads it); its
last is ``("stop",)``. What runs in between, and how it is scheduled, is the owner's business
(``runtime.RewardRuntime``, ``envs.pool.EnvPool``).
"""

from __future__ import annotations

import collections
import concurrent.futures
import math
import multiprocessing.connection
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping


class WorkerProcess:
  """A started worker interpreter, its connection, and the units it is running (ids, in order)."""

  def __init__(
    self, command: str, memory_limit_bytes: int | None, env: Mapping[str, str] | None = None
  ):
    parent_sock, child_sock = socket.socketpair()
    env = dict(os.environ if env is None else env)
    # So the child finds rlvr_jax before it receives the parent's exact sys.path.
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    try:
      self.proc = subprocess.Popen(
        [sys.executable, "-c", command, str(child_sock.fileno())],
        pass_fds=(child_sock.fileno(),),
        stdin=subprocess.DEVNULL,
        env=env,
      )
    finally:
      child_sock.close()
    self.conn = multiprocessing.connection.Connection(parent_sock.detach())
    self.conn.send(("init", list(sys.path), memory_limit_bytes))
    self.ready = False  # set when the worker's ("ready",) arrives
    self.units: collections.deque[int] = collections.deque()
    self.started, self.deadline = 0.0, math.inf

  def is_alive(self) -> bool:
    return self.proc.poll() is None

  def kill(self) -> None:
    if self.is_alive():
      self.proc.kill()
    try:
      self.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
      pass
    self.conn.close()


def stop_all(workers: list[WorkerProcess]) -> None:
  """Asks every worker to stop, gives them 2 s together, then kills what is left."""
  for w in workers:
    try:
      w.conn.send(("stop",))
    except OSError:
      pass
  for w in workers:
    try:
      w.proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
      pass
    w.kill()


def exit_description(exitcode: int | None) -> str:
  """How a worker ended, in words (a signal by name; SIGKILL hints at the OOM killer)."""
  if exitcode is None:
    return "worker died (exit code unknown)"
  if exitcode < 0:
    try:
      name = signal.Signals(-exitcode).name
    except ValueError:
      name = f"signal {-exitcode}"
    hint = " (killed: possibly out of memory)" if exitcode == -signal.SIGKILL else ""
    return f"worker killed by {name}{hint}"
  return f"worker exited with code {exitcode}"


class ScheduledPool:
  """Lifecycle of a pool whose workers are only touched on one scheduler thread.

  Subclasses set ``self._executor`` (a one-thread ``ThreadPoolExecutor``) and ``self._closed``,
  define ``_stop_workers`` (run on that thread by ``close``) and call ``_check_open`` before
  accepting work.
  """

  _executor: concurrent.futures.ThreadPoolExecutor
  _closed: bool

  def _stop_workers(self) -> None:
    raise NotImplementedError

  def _check_open(self) -> None:
    if self._closed:
      raise RuntimeError(f"{type(self).__name__} is closed")

  def close(self) -> None:
    if self._closed:
      return
    self._closed = True
    self._executor.submit(self._stop_workers).result()
    self._executor.shutdown(wait=True)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
