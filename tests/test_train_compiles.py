"""The trainer compiles once: no XLA compilation during later RL steps of a run, because every
jitted function is built once from the method values and hashable static configuration (no
hand-keyed caches); and a resumed run (a new Trainer in the same process, after the first one gave
back its compiled steps) loads its programs from the persistent compilation cache instead of
compiling them."""

import os

import jax
from jax._src import dispatch

from rlvr_jax import compilation
from rlvr_jax.train import config as config_lib
from rlvr_jax.train import loop

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
  # persistent compilation cache, after an earlier run of this test). Every program is cached,
  # however fast it compiled, so that the resumed run has nothing left to compile.
  c = config_lib.tiny_config(
    tmp_path, rl=dict(num_steps=4, advantage="rloo"), optim=dict(learning_rate=1.2345e-3),
    checkpoint=dict(async_save=False), compilation=dict(cache_dir=str(tmp_path / "xla")),
  )  # fmt: skip
  min_time = jax.config.jax_persistent_cache_min_compile_time_secs
  previous_dir = jax.config.jax_compilation_cache_dir
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.monitoring.register_event_duration_secs_listener(listener)
  jax.monitoring.register_event_listener(cache_listener)
  try:
    live = len(jax.live_arrays())
    trainer = loop.Trainer(c)
    try:
      assert trainer.restore_or_start() == 0
      trainer.rl_step(0)
      after_first = len(events)
      steps = [s for s in (trainer.plain_train_step, trainer.shared_train_step) if s is not None]
      assert after_first > 0 and sum(s.func._cache_size() for s in steps) == 1
      trainer.rl_step(1)
      trainer.rl_step(2)
      assert len(events) == after_first, "steps 2 and 3 compiled again"
      trainer.save(3)
    finally:
      trainer.close()
    assert trainer.state is None and trainer.plain_train_step is None  # given back ...
    assert len(jax.live_arrays()) <= live  # ... with every device buffer of the run
    assert os.listdir(tmp_path / "xla")  # the run wrote its programs to the cache
    resumed = loop.Trainer(c)
    try:
      assert resumed.restore_or_start() == 3
      events.clear()
      resumed.rl_step(3)
      # Every program it needed beyond the sampler's (module-level, still in memory) was
      # obtained (the backend event) by loading it from the cache (the cache-hit event).
      obtained = events.count(dispatch.BACKEND_COMPILE_EVENT)
      assert obtained > 0 and events.count(_CACHE_HIT_EVENT) == obtained, events
    finally:
      resumed.close()
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
    jax.monitoring.unregister_event_listener(cache_listener)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_time)
    compilation.configure_cache(previous_dir or "off")
