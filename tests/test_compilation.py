"""Who owns compiled code: a run's steps free their executables with the run, and JAX's persistent
compilation cache is on for the trainer, in the folder its setting names."""

import gc
import os
import weakref

import jax
import jax.numpy as jnp
import optax
import pytest
from conftest import memory_mappings

from rlvr_jax import compilation, model
from rlvr_jax.train import step as step_lib


@pytest.fixture
def jax_cache_settings():
  """Restores JAX's process-wide cache settings after the test."""
  saved = (jax.config.jax_compilation_cache_dir, jax.config.jax_compilation_cache_max_size)
  yield
  compilation.configure_cache(saved[0] or "off")
  jax.config.update("jax_compilation_cache_max_size", saved[1])


def test_cache_folder_follows_the_setting(tmp_path, monkeypatch, jax_cache_settings):
  monkeypatch.setenv("RLVR_JAX_CACHE_DIR", str(tmp_path / "env"))
  jax.config.update("jax_compilation_cache_dir", None)
  assert compilation.configure_cache("auto") == str(tmp_path / "env")
  assert jax.config.jax_compilation_cache_dir == str(tmp_path / "env")
  assert (tmp_path / "env").is_dir()
  # A folder set by the user (JAX_COMPILATION_CACHE_DIR, jax.config) wins over 'auto' ...
  jax.config.update("jax_compilation_cache_dir", str(tmp_path / "user"))
  assert compilation.configure_cache("auto") == str(tmp_path / "user")
  # ... an explicit folder or 'off' over it.
  assert compilation.configure_cache(str(tmp_path / "mine")) == str(tmp_path / "mine")
  assert jax.config.jax_compilation_cache_dir == str(tmp_path / "mine")
  assert compilation.configure_cache("off") is None
  assert jax.config.jax_compilation_cache_dir is None


def test_default_folder_without_the_variable(monkeypatch, tmp_path):
  monkeypatch.delenv("RLVR_JAX_CACHE_DIR", raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  assert compilation.default_dir() == str(tmp_path / "rlvr_jax" / "xla")
  monkeypatch.delenv("XDG_CACHE_HOME")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert compilation.default_dir() == str(tmp_path / "home" / ".cache" / "rlvr_jax" / "xla")


def _program(x, *, scale):
  return jnp.sum(jnp.tanh(x @ x.T * scale) ** 2)


@pytest.mark.skipif(memory_mappings() is None, reason="counts /proc/self/maps (Linux)")
def test_owned_jit_gives_its_executables_back():
  """Ten programs through a module-level-style jit stay mapped; through ``owned_jit``, dropped
  after use, they do not (the count the kernel limits: tests/conftest.py)."""
  x = jnp.ones((16, 16))
  kept = jax.jit(_program, static_argnames=("scale",))
  kept(x, scale=0.0).block_until_ready()
  step_lib.owned_jit(_program, static_argnames=("scale",))(x, scale=0.0).block_until_ready()
  gc.collect()
  start = memory_mappings()
  for i in range(1, 11):
    kept(x, scale=float(i)).block_until_ready()
  gc.collect()
  kept_growth = memory_mappings() - start
  start = memory_mappings()
  for i in range(11, 21):
    owned = step_lib.owned_jit(_program, static_argnames=("scale",))
    assert float(owned(x, scale=float(i))) == pytest.approx(float(kept(x, scale=float(i))))
    del owned
  gc.collect()
  owned_growth = memory_mappings() - start - kept_growth  # kept(...) above compiled 10 more
  assert kept_growth >= 20, kept_growth  # the measurement can see executables
  assert owned_growth <= kept_growth // 5, (owned_growth, kept_growth)


def test_a_train_step_is_freed_with_its_callable():
  cfg = model.ModelConfig.tiny(
    vocab_size=16, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=1,
    num_kv_heads=1, head_dim=16,
  )  # fmt: skip
  opt = optax.sgd(0.1)
  step = step_lib.make_train_step(model_config=cfg, optimizer=opt, objective="grpo")
  score = step_lib.make_score_fn(model_config=cfg)
  refs = [weakref.ref(step.func), weakref.ref(score.func)]
  # Two builds of one configuration are two owners (each compiles once while it lives).
  again = step_lib.make_train_step(model_config=cfg, optimizer=opt, objective="grpo")
  assert again.func is not step.func and again.keywords == step.keywords
  del step, score, again
  gc.collect()
  assert all(r() is None for r in refs)


def test_a_new_folder_takes_effect_after_a_compilation(tmp_path, jax_cache_settings):
  """JAX opens its cache folder at the first compilation; a later setting still moves it."""
  min_time = jax.config.jax_persistent_cache_min_compile_time_secs
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  try:
    for i, name in enumerate(("first", "second")):
      compilation.configure_cache(str(tmp_path / name))
      jax.jit(lambda x, i=i: jnp.sin(x) * (i + 7.5))(jnp.ones(3)).block_until_ready()
      assert os.listdir(tmp_path / name), name
  finally:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_time)
