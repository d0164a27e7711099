"""Meshes and logical-axis sharding rules (training: FSDP + tensor parallel; sampling: TP only).

Mesh axes: ``data`` (pure data parallel: replicas), ``fsdp`` (data parallel whose replicas also
split the parameters, arXiv 2304.11277), ``tensor`` (Megatron-style tensor parallel, arXiv
1909.08053: heads, MLP hidden and vocab split across devices), and optionally ``context``
(context / sequence parallelism: the update's token rows split along the sequence, for
``model.attention="ring"``, ``rlvr_jax.model.context_parallel``). A mesh has the ``context`` axis
only when its size is > 1, so every mesh without one is the three-axis mesh it always was.

Arrays are described by *logical* axis names (``params.param_specs`` gives them for the model);
a rule table maps each logical name to mesh axes. A mesh axis is used at most once per array, and
mesh axes that do not divide the dimension are dropped (e.g. 3 KV heads on ``tensor=2`` are
replicated), so every rule table works for every model.

Training layout (``TRAIN_RULES``): weights split over ``fsdp`` (their ``embed`` dim) and ``tensor``;
the batch over ``data`` x ``fsdp``, the sequence (``seq``) over ``context`` (no-op on a mesh
without it). Sampling layout (``SAMPLE_RULES``): weights only split over ``tensor`` (no per-step
all-gather in the decode loop), batch and KV cache over ``data`` x ``fsdp``, sequences unsplit
(decoding is per token).
``reshard`` moves a tree between layouts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
# The optional fourth axis, which ring attention (``rlvr_jax.model.context_parallel``) rings over.
CONTEXT_AXIS = "context"

Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

TRAIN_RULES: Rules = (
  ("batch", ("data", "fsdp")),
  ("seq", CONTEXT_AXIS),
  ("vocab", "tensor"),
  ("embed", "fsdp"),
  ("heads", "tensor"),
  ("kv_heads", "tensor"),
  ("mlp", "tensor"),
  ("head_dim", None),
  ("layers", None),
  ("norm", None),
)

# The sampling layout is the training layout without FSDP on the weights (their ``embed`` dim is
# replicated), so the decode loop never all-gathers weights, and without the sequence split (the
# KV cache and each decode step are per token); everything else is shared.
SAMPLE_RULES: Rules = tuple(
  (name, None if name in ("embed", "seq") else axes) for name, axes in TRAIN_RULES
)


def infer_mesh_shape(sizes: Sequence[int], num_devices: int) -> tuple[int, ...]:
  """Replaces at most one -1 in ``sizes`` so that their product is ``num_devices``."""
  sizes = [int(s) for s in sizes]
  if sum(s == -1 for s in sizes) > 1:
    raise ValueError(f"at most one mesh size may be -1, got {sizes}")
  if any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f"mesh sizes must be positive or -1, got {sizes}")
  known = math.prod(s for s in sizes if s != -1)
  if num_devices % known:
    raise ValueError(f"mesh sizes {sizes} do not divide the {num_devices} devices")
  sizes = [num_devices // known if s == -1 else s for s in sizes]
  if math.prod(sizes) != num_devices:
    raise ValueError(f"mesh sizes {sizes} use {math.prod(sizes)} of {num_devices} devices")
  return tuple(sizes)


def make_mesh(
  data: int = 1,
  fsdp: int = -1,
  tensor: int = 1,
  context: int = 1,
  *,
  devices: Sequence[jax.Device] | None = None,
) -> Mesh:
  """A ``(data, fsdp, tensor)`` mesh, or ``(data, fsdp, tensor, context)`` when ``context`` > 1,
  over all devices (or ``devices``); one size may be -1.

  Uses ``jax.make_mesh`` (device order aware of the physical topology), with Auto axis types so
  that ``jax.jit`` propagates shardings from the inputs. A context size of 1 adds no axis: the
  mesh (and every sharding, checkpoint and compiled step on it) is the three-axis one.
  """
  devices = jax.devices() if devices is None else list(devices)
  shape = infer_mesh_shape((data, fsdp, tensor, context), len(devices))
  names = MESH_AXES + (CONTEXT_AXIS,)
  if shape[-1] == 1:
    shape, names = shape[:-1], MESH_AXES
  axis_types = (jax.sharding.AxisType.Auto,) * len(names)
  return jax.make_mesh(shape, names, axis_types, devices=devices)


def context_size(mesh: Mesh | None) -> int:
  """The size of ``mesh``'s ``context`` axis (1 without one, or without a mesh)."""
  return 1 if mesh is None else int(dict(mesh.shape).get(CONTEXT_AXIS, 1))


def _rule_map(rules: Rules) -> dict[str, tuple[str, ...]]:
  out = {}
  for name, axes in rules:
    if axes is None:
      out[name] = ()
    elif isinstance(axes, str):
      out[name] = (axes,)
    else:
      out[name] = tuple(axes)
  return out


def logical_to_spec(
  axes: Sequence[str | None],
  rules: Rules,
  *,
  shape: Sequence[int] | None = None,
  mesh: Mesh | None = None,
) -> PartitionSpec:
  """PartitionSpec for an array with logical ``axes``.

  With ``shape`` and ``mesh``, mesh axes that would not divide a dimension are dropped (from the
  last one), so the spec is always valid. A mesh axis already used by an earlier dimension is
  skipped. Unknown logical names raise (a typo would otherwise silently replicate).
  """
  table = _rule_map(rules)
  if shape is not None and len(shape) != len(axes):
    raise ValueError(f"logical axes {tuple(axes)} and shape {tuple(shape)} differ in rank")
  used: set[str] = set()
  spec = []
  for dim, name in enumerate(axes):
    if name is None:
      spec.append(None)
      continue
    if name not in table:
      raise KeyError(f"logical axis {name!r} has no rule; known: {sorted(table)}")
    mesh_axes = [a for a in table[name] if a not in used]
    if mesh is not None:
      mesh_axes = [a for a in mesh_axes if a in mesh.shape]
    if shape is not None and mesh is not None:
      while mesh_axes and shape[dim] % math.prod(mesh.shape[a] for a in mesh_axes):
        mesh_axes.pop()
    used.update(mesh_axes)
    spec.append(
      None if not mesh_axes else mesh_axes[0] if len(mesh_axes) == 1 else tuple(mesh_axes)
    )
  return PartitionSpec(*spec)


def logical_to_sharding(
  axes: Sequence[str | None], mesh: Mesh, rules: Rules, *, shape: Sequence[int] | None = None
) -> NamedSharding:
  """``NamedSharding`` on ``mesh`` for an array with logical ``axes`` (see ``logical_to_spec``)."""
  return NamedSharding(mesh, logical_to_spec(axes, rules, shape=shape, mesh=mesh))


def tree_shardings(axes_tree: Any, shapes_tree: Any, mesh: Mesh, rules: Rules) -> Any:
  """Shardings for a tree of logical-axis tuples and a matching tree of arrays / shapes."""
  is_axes = lambda x: isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)
  return jax.tree.map(
    lambda axes, x: logical_to_sharding(axes, mesh, rules, shape=np.shape(x)),
    axes_tree,
    shapes_tree,
    is_leaf=is_axes,
  )


def batch_sharding(mesh: Mesh, rules: Rules = TRAIN_RULES, *, ndim: int = 2, shape=None):
  """Sharding for a [B, ...] data array: rows over the ``batch`` rule, other dims replicated."""
  axes = ("batch",) + (None,) * (ndim - 1)
  return logical_to_sharding(axes, mesh, rules, shape=shape)


def reshard(tree: Any, shardings: Any, *, donate: bool = False) -> Any:
  """Moves a tree of arrays to ``shardings`` (e.g. the training layout -> the sampling layout).

  ``jax.device_put`` between NamedShardings on the same devices is lowered to the needed
  collectives (all-gather over ``fsdp`` for train -> sample).
  """
  return jax.device_put(tree, shardings, donate=donate)


def reshard_cost(tree: Any, shardings: Any, *, repeats: int = 3) -> dict[str, float]:
  """Measures ``reshard``: best wall time (s) and bytes held per device before and after."""

  def per_device_bytes(t):
    total = 0
    for x in jax.tree.leaves(t):
      shard = x.addressable_shards[0].data
      total += shard.size * shard.dtype.itemsize
    return total

  best = math.inf
  out = tree
  for _ in range(repeats):
    start = time.perf_counter()
    out = jax.block_until_ready(reshard(tree, shardings))
    best = min(best, time.perf_counter() - start)
  return {
    "seconds": best,
    "bytes_per_device_before": float(per_device_bytes(tree)),
    "bytes_per_device_after": float(per_device_bytes(out)),
  }
