"""The trainer compiles once: no XLA compilation during later RL steps of a run, nor when a run is
resumed (a new Trainer in the same process), because every jitted function is built once from the
method values and hashable static configuration (no hand-keyed caches)."""

import jax
from jax._src import dispatch

from rlvr_jax.train import config as config_lib
from rlvr_jax.train import loop
from rlvr_jax.train import step as step_lib

_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


def test_no_compilation_after_the_first_step_nor_over_a_resume(tmp_path):
  events = []  # XLA compilations and persistent-cache loads (tests/conftest.py's cache)

  def listener(name, secs, **kw):
    if name == dispatch.BACKEND_COMPILE_EVENT:
      events.append(name)

  def cache_listener(name, **kw):
    if name == _CACHE_HIT_EVENT:
      events.append(name)

  # A learning rate no other test uses: this run's step is compiled here (or loaded from the
  # persistent compilation cache, after an earlier run of this test), not found in a jit cache.
  c = config_lib.tiny_config(
    tmp_path, rl=dict(num_steps=4, advantage="rloo"), optim=dict(learning_rate=1.2345e-3),
    checkpoint=dict(async_save=False),
  )  # fmt: skip
  jax.monitoring.register_event_duration_secs_listener(listener)
  jax.monitoring.register_event_listener(cache_listener)
  try:
    trainer = loop.Trainer(c)
    try:
      assert trainer.restore_or_start() == 0
      size0 = step_lib.train_step._cache_size()
      trainer.rl_step(0)
      after_first = len(events)
      assert after_first > 0 and step_lib.train_step._cache_size() == size0 + 1
      trainer.rl_step(1)
      trainer.rl_step(2)
      assert len(events) == after_first, "steps 2 and 3 compiled again"
      trainer.save(3)
    finally:
      trainer.close()
    resumed = loop.Trainer(c)
    try:
      assert resumed.restore_or_start() == 3
      before = len(events)
      resumed.rl_step(3)
      assert len(events) == before, "the resumed run compiled again"
      assert step_lib.train_step._cache_size() == size0 + 1
    finally:
      resumed.close()
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
    jax.monitoring.unregister_event_listener(cache_listener)
