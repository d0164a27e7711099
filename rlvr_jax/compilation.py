"""Where compiled programs live: JAX's persistent compilation cache, and releasing a run's code.

Two lifetimes, chosen so that a notebook running a hundred experiments in one process stays flat
and a rerun or a resumed run does not compile again:

* **In memory, owned by a run.** The train step and the scoring pass are jitted per run
  (``train.step.make_train_step`` / ``make_score_fn`` return their own ``jax.jit``), so their
  executables are freed with the run that built them, not kept by a module-level cache for the
  life of the process. Module-level jits remain only for functions whose static arguments are the
  model's shapes (the sampler, the decoder's forward): one executable per model, shared by runs.
  ``release()`` drops everything, those included (``jax.clear_caches``).
* **On disk, shared by processes.** JAX's persistent compilation cache, on by default for the
  trainer (``config.compilation.cache_dir``): a program compiled once is loaded from the cache by
  a later run, a resumed run, or the next run in the same notebook.

``cache_dir`` values: ``"auto"`` (the default) uses ``$RLVR_JAX_CACHE_DIR`` when set, else
``$XDG_CACHE_HOME/rlvr_jax/xla`` (``~/.cache/rlvr_jax/xla``); a path uses that folder; ``""`` or
``"off"`` turns it off. A cache folder already configured for JAX (``JAX_COMPILATION_CACHE_DIR``,
or ``jax.config.update("jax_compilation_cache_dir", ...)``) wins over ``"auto"``. The cache is
trusted code: keep it in a folder only you can write to.
"""

from __future__ import annotations

import gc
import os

import jax
from jax.experimental.compilation_cache import compilation_cache as jax_cache

# On-disk cap of the default cache (JAX evicts the least recently used files beyond it). Setting a
# size also turns on JAX's file locking, which processes sharing the folder need.
DEFAULT_MAX_BYTES = 8 << 30
OFF = ("", "off", "none", "false")


def default_dir() -> str:
  """``$RLVR_JAX_CACHE_DIR``, else ``$XDG_CACHE_HOME/rlvr_jax/xla`` (``~/.cache/...``)."""
  if os.environ.get("RLVR_JAX_CACHE_DIR"):
    return os.environ["RLVR_JAX_CACHE_DIR"]
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "rlvr_jax", "xla")


def configure_cache(cache_dir: str = "auto") -> str | None:
  """Turns JAX's persistent compilation cache on (or off) for this process; returns its folder.

  ``cache_dir``: see the module docstring. Takes effect for every later compilation of the
  process (JAX's settings are process-wide). An explicit path or ``"off"`` overrides a folder set
  earlier; ``"auto"`` keeps one set by the user.
  """
  setting = str(cache_dir).strip()
  if setting.lower() in OFF:
    if jax.config.jax_compilation_cache_dir is not None:
      _set_dir(None)
    return None
  current = jax.config.jax_compilation_cache_dir
  if setting == "auto":
    if current:
      return current
    path = default_dir()
  else:
    path = os.path.abspath(os.path.expanduser(setting))
  if path != current:
    os.makedirs(path, exist_ok=True)
    _set_dir(path)
    if jax.config.jax_compilation_cache_max_size == -1:  # unset: bound the folder's size
      jax.config.update("jax_compilation_cache_max_size", DEFAULT_MAX_BYTES)
  return path


def _set_dir(path: str | None) -> None:
  # JAX opens its cache at the first compilation and keeps that folder: reset it so the next
  # compilation opens this one.
  jax.config.update("jax_compilation_cache_dir", path)
  jax_cache.reset_cache()


def release() -> None:
  """Frees every compiled program this process holds in memory (JAX's in-memory caches, this
  package's module-level jits included) and the device buffers nothing refers to any more.

  A finished run already gives back its own steps; call this after runs that used many different
  model shapes, or before measuring the process's size. Later calls compile again (or load from
  the persistent cache)."""
  gc.collect()  # arrays and executables held only by reference cycles
  jax.clear_caches()
  gc.collect()
