"""Orbax checkpointing of any state pytree plus a JSON dict of host state.

``Checkpointer(directory, keep=N)`` wraps ``orbax.checkpoint.CheckpointManager``:

- ``save(step, state, host_state)`` writes the array pytree (params, optimiser state, step, RNG
  key, advantage-estimator state, ...) and a JSON dict (data position, run metadata) as one
  checkpoint; orbax writes into a temporary directory and renames it when complete, and we only
  ever restore a step whose ``commit_success.txt`` marker exists, so a run killed mid-save resumes
  from the last *complete* checkpoint. Incomplete step directories are deleted on open.
- ``restore(template)`` returns ``(step, state, host_state)`` of the latest complete checkpoint,
  or None. ``template`` is a freshly initialised state of the same structure: it gives shapes,
  dtypes and shardings, and typed PRNG keys in it are re-wrapped from their saved key data.

Imports nothing from ``train/``.
"""

from __future__ import annotations

import os
import shutil

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

_MARKERS = ("commit_success.txt", "_CHECKPOINT_METADATA")


def _is_key(x) -> bool:
  return isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _to_savable(tree):
  """Typed PRNG keys -> their uint32 key data (orbax stores plain arrays)."""
  return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


def _abstract(template):
  def one(x):
    if _is_key(x):
      x = jax.random.key_data(x)
    if isinstance(x, jax.Array):
      return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    return ocp.utils.to_shape_dtype_struct(x)

  return jax.tree.map(one, template)


def _rewrap(template, restored):
  return jax.tree.map(
    lambda t, r: jax.random.wrap_key_data(r, impl=jax.random.key_impl(t)) if _is_key(t) else r,
    template,
    restored,
  )


class Checkpointer:
  """Keep-last-N orbax checkpoints of ``(state pytree, host JSON dict)``.

  Args:
    directory: checkpoint root (created if missing).
    keep: number of most recent complete checkpoints to keep.
    async_save: let saves run in the background (``wait()`` blocks until they are on disk).
  """

  def __init__(self, directory: str, *, keep: int = 3, async_save: bool = True):
    if keep < 1:
      raise ValueError(f"checkpoint.keep={keep}: need at least 1")
    self.directory = os.path.abspath(directory)
    os.makedirs(self.directory, exist_ok=True)
    self._drop_incomplete()
    self._manager = ocp.CheckpointManager(
      self.directory,
      options=ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=True, enable_async_checkpointing=async_save
      ),
    )

  def _drop_incomplete(self) -> None:
    """Remove step directories a killed save left behind (no completion marker)."""
    for name in os.listdir(self.directory):
      path = os.path.join(self.directory, name)
      if not os.path.isdir(path):
        continue
      if ".orbax-checkpoint-tmp" in name or (
        name.isdigit() and not any(os.path.exists(os.path.join(path, m)) for m in _MARKERS)
      ):
        shutil.rmtree(path, ignore_errors=True)

  def complete_steps(self) -> list[int]:
    out = []
    for s in self._manager.all_steps():
      path = os.path.join(self.directory, str(s))
      if any(os.path.exists(os.path.join(path, m)) for m in _MARKERS):
        out.append(int(s))
    return sorted(out)

  def latest_step(self) -> int | None:
    steps = self.complete_steps()
    return steps[-1] if steps else None

  def save(self, step: int, state, host_state: dict, *, force: bool = False) -> None:
    self._manager.save(
      int(step),
      args=ocp.args.Composite(
        state=ocp.args.StandardSave(_to_savable(state)), host=ocp.args.JsonSave(host_state)
      ),
      force=force,
    )

  def restore(self, template, step: int | None = None):
    """``(step, state, host_state)`` of ``step`` (default: latest complete), or None if none."""
    step = self.latest_step() if step is None else step
    if step is None:
      return None
    out = self._manager.restore(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(_abstract(template)), host=ocp.args.JsonRestore()
      ),
    )
    return step, _rewrap(template, out.state), dict(out.host)

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()
