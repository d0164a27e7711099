"""The environment worker process: a fresh interpreter that hosts the environments of many episodes.

Started by :class:`rlvr_jax.envs.pool.EnvPool` as
``python -c "from rlvr_jax.envs._worker import main; main()" <fd>`` (never a fork of the trainer),
like the reward workers. Each episode's environment lives here, keyed by episode id.

Each episode also has its own Python ``random`` and NumPy global RNG state: GEM's games draw from
the global ``random`` module, so the state is seeded from the episode seed at reset, and swapped in
before and out after every call on that episode. Episodes sharing a worker thus neither disturb
each other nor depend on how they were scheduled, and replaying an episode's actions (after a
worker replacement) reproduces its state.

Messages in:  ("init", sys_path, memory_limit_bytes); ("units", [(uid, kind, episode, payload)]);
              ("stop",). Kinds: "reset" (spec, seed), "step" action, "restore" (spec, seed,
              actions), "close" None, "clear" None (drop every episode).
Messages out: ("ready",) once; per unit ("ok", uid, value, seconds) or
              ("err", uid, cause, message, seconds).
"""

from __future__ import annotations

import random
import time

import numpy as np

from rlvr_jax.envs import protocol, registry
from rlvr_jax.rewards._worker import describe, start_worker


def _seed_globals(seed) -> None:
  random.seed(seed)
  np.random.seed(None if seed is None else int(seed) % (1 << 32))


class _Episode:
  def __init__(self, spec, seed):
    self.name = registry.as_spec(spec).name
    _seed_globals(seed)  # constructors draw too (GEM's call reset() in __init__)
    self.env = registry.make_env(spec)
    _seed_globals(seed)
    self.py_state, self.np_state = random.getstate(), np.random.get_state()

  def call(self, fn, *args, **kwargs):
    """Runs ``fn`` with this episode's RNG states swapped into the global generators."""
    random.setstate(self.py_state)
    np.random.set_state(self.np_state)
    try:
      return fn(*args, **kwargs)
    finally:
      self.py_state, self.np_state = random.getstate(), np.random.get_state()

  def close(self):
    close = getattr(self.env, "close", None)
    if callable(close):
      try:
        close()
      except Exception:  # noqa: BLE001  (a failing close must not fail the next episode)
        pass


def _start(episodes: dict, episode: int, spec, seed) -> tuple[_Episode, protocol.ResetResult]:
  _drop(episodes, episode)
  ep = _Episode(spec, seed)
  episodes[episode] = ep
  return ep, protocol.check_reset(ep.name, ep.call(ep.env.reset, seed=seed))


def _drop(episodes: dict, episode: int) -> None:
  ep = episodes.pop(episode, None)
  if ep is not None:
    ep.close()


def _run(episodes: dict, kind: str, episode: int, payload):
  if kind == "reset":
    return _start(episodes, episode, *payload)[1]
  if kind == "step":
    ep = episodes.get(episode)
    if ep is None:
      raise RuntimeError(f"episode {episode} has no environment in this worker (not reset?)")
    return protocol.check_step(ep.name, ep.call(ep.env.step, payload))
  if kind == "restore":
    spec, seed, actions = payload
    ep, _ = _start(episodes, episode, spec, seed)
    for action in actions:
      protocol.check_step(ep.name, ep.call(ep.env.step, action))
    return None
  if kind == "close":
    return _drop(episodes, episode)
  if kind == "clear":
    for key in list(episodes):
      _drop(episodes, key)
    return None
  raise ValueError(f"unknown unit kind {kind!r}")


def _serve(conn) -> None:
  episodes: dict[int, _Episode] = {}
  while True:
    try:
      msg = conn.recv()
    except (EOFError, OSError):
      return
    if msg[0] == "stop":
      for key in list(episodes):
        _drop(episodes, key)
      return
    for uid, kind, episode, payload in msg[1]:
      start = time.perf_counter()
      try:
        conn.send(("ok", uid, _run(episodes, kind, episode, payload), time.perf_counter() - start))
        continue
      except protocol.MalformedStepError as e:
        cause, text = "malformed", describe(e)
      except MemoryError as e:
        cause, text = "memory", describe(e)
      except BaseException as e:  # noqa: BLE001  (SystemExit from env code fails the episode only)
        cause, text = "exception", describe(e)
      episodes.pop(episode, None)  # a failed episode's env is not used again
      conn.send(("err", uid, cause, text, time.perf_counter() - start))


def main() -> None:
  _serve(start_worker())
