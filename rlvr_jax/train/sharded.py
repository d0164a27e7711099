"""Training on a device mesh, in one process or many: placement, batches, metrics, the trainer.

Layouts (``rlvr_jax.sharding``): the train state lives in the *training* layout (``TRAIN_RULES``:
weights split over ``fsdp`` x ``tensor``, optimiser moments like their parameters, scalars
replicated); step batches are split by rows over ``data`` x ``fsdp`` and, on a mesh with a
``context`` axis, their token rows [B, S] also along the sequence (``shard_sequences``: context
parallelism with ``model.attention="ring"``); the sampler gets the params resharded to the
*sampling* layout (``SAMPLE_RULES``: weights over ``tensor`` only, sequences unsplit).

Multi-process (``rlvr_jax.distributed``): every process runs the same program on the same global
mesh. Arrays are built from host data with ``jax.make_array_from_callback`` (every process holds
the same value, each places its own shards: params at start-up) or
``jax.make_array_from_process_local_data`` (each process holds only its rows: its share of a step
batch, ``process_rows``). Host metrics are reduced across processes with ``reduce_metrics``, rows
gathered with ``allgather_rows``; orbax checkpoints of the sharded state are written collectively
(each process writes its own shards).

``MeshLayout`` implements the trainer's placement hooks (``train.layout.Layout``) on a mesh;
``MeshTrainer`` is ``train.loop.Trainer`` composed with it: same host loop, state in the training
layout, minibatches sharded over the data axes, params resharded to the sampling layout for the
rollout, every jitted call under ``jax.set_mesh``, each process loading its share of the prompts.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rlvr_jax import model as model_lib
from rlvr_jax import sharding as sharding_lib
from rlvr_jax.data.source import shard_span
from rlvr_jax.model import lora as lora_lib
from rlvr_jax.train import loop
from rlvr_jax.train.layout import Layout
from rlvr_jax.train.state import TrainBatch, TrainState


def _is_key(x) -> bool:
  return isinstance(x, jax.Array) and jax.numpy.issubdtype(x.dtype, jax.dtypes.prng_key)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def state_shardings(
  state: TrainState,
  *,
  mesh: Mesh,
  model_config,
  optimizer: optax.GradientTransformation,
  rules: sharding_lib.Rules = sharding_lib.TRAIN_RULES,
  lora=None,
) -> TrainState:
  """A ``TrainState`` of ``NamedSharding``s: params (and ``extra['ref_params']``) by the logical
  axes of the model under ``rules``, every parameter-shaped part of the optimiser state (Adam
  moments, ...) like its parameter (``optax.tree_map_params``), everything else replicated.
  ``lora`` (a ``lora.LoraConfig``): ``state.params`` are its adapters, placed by
  ``lora.lora_shardings`` (A like the weight's input dims, B like its output dims, the rank
  replicated)."""
  rep = replicated(mesh)
  if lora is not None:
    params = lora_lib.lora_shardings(model_config, lora, mesh, rules)
  else:
    params = model_lib.param_shardings(model_config, mesh, rules)
  opt = optax.tree_map_params(
    optimizer,
    lambda _, sh: sh,
    state.opt_state,
    params,
    transform_non_params=lambda _: rep,
  )
  extra = {
    k: (params if k == "ref_params" else jax.tree.map(lambda _: rep, v))
    for k, v in state.extra.items()
  }
  return TrainState(step=rep, params=params, opt_state=opt, key=rep, num_skipped=rep, extra=extra)


def place(tree: Any, shardings: Any) -> Any:
  """Puts a tree whose value every process holds in full onto (possibly multi-process) shardings.

  Each process copies only the slices its own devices hold (``jax.make_array_from_callback``),
  so it works for meshes spanning hosts; typed PRNG keys go through their key data.
  """

  def one(x, sh):
    if _is_key(x):
      data = one(jax.random.key_data(x), sh)
      return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    if isinstance(x, jax.Array) and x.sharding == sh:  # e.g. restored by orbax: already placed
      return x
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sh, lambda idx: host[idx])

  return jax.tree.map(one, tree, shardings)


def row_sharding(
  mesh: Mesh, shape, rules: sharding_lib.Rules = sharding_lib.TRAIN_RULES
) -> NamedSharding:
  """Rows of a [B, ...] array over the ``batch`` rule (mesh axes not dividing B are dropped)."""
  return sharding_lib.batch_sharding(mesh, rules, ndim=len(shape), shape=tuple(shape))


def shard_rows(tree: Any, mesh: Mesh, rules: sharding_lib.Rules = sharding_lib.TRAIN_RULES) -> Any:
  """A tree of [B, ...] host arrays that every process holds in full -> rows split over the data
  axes (``None`` leaves stay ``None``)."""
  return jax.tree.map(lambda x: place(x, row_sharding(mesh, np.shape(x), rules)), tree)


def sequence_sharding(
  mesh: Mesh, shape, rules: sharding_lib.Rules = sharding_lib.TRAIN_RULES
) -> NamedSharding:
  """[B, S] token rows: B over the ``batch`` rule, S over the ``seq`` rule (``context``)."""
  return sharding_lib.logical_to_sharding(("batch", "seq"), mesh, rules, shape=tuple(shape))


def pad_sequences(batch: TrainBatch, multiple: int) -> TrainBatch:
  """``batch`` with its token rows left-padded to a width S' that ``multiple`` divides.

  The new columns are prompt padding (token 0, position -1: segment 0, never attended to and
  predicting nothing), so the completion stays the last T columns and the loss, gradients and
  metrics are those of the unpadded rows. Unchanged when ``multiple`` divides S already."""
  s = batch.tokens.shape[1]
  pad = -s % multiple
  if pad == 0:
    return batch
  widths = ((0, 0), (pad, 0))
  tokens = np.pad(np.asarray(batch.tokens), widths, constant_values=0)
  positions = np.pad(np.asarray(batch.positions), widths, constant_values=-1)
  return dataclasses.replace(batch, tokens=tokens, positions=positions)


def shard_sequences(batch: TrainBatch, mesh: Mesh) -> TrainBatch:
  """A ``TrainBatch`` that every process holds in full, on a mesh with a ``context`` axis of
  size R: the token rows left-padded to a multiple of R (``pad_sequences``: the ring splits S
  into R equal chunks) and placed [B, S] over (data x fsdp, context); every [B, T] / [B] array
  row-sharded as by ``shard_rows``. The trainer's packed rows are never split this way
  (``config.check_context``)."""
  if batch.packed is not None:
    raise ValueError("shard_sequences: packed rows cannot be split along the sequence")
  batch = pad_sequences(batch, sharding_lib.context_size(mesh))
  tokens, positions = batch.tokens, batch.positions
  rest = shard_rows(dataclasses.replace(batch, tokens=None, positions=None), mesh)
  seq = sequence_sharding(mesh, np.shape(tokens))
  return dataclasses.replace(rest, tokens=place(tokens, seq), positions=place(positions, seq))


def process_rows(num_rows: int, mesh: Mesh, rules=sharding_lib.TRAIN_RULES) -> slice:
  """The contiguous rows of a [num_rows, ...] batch whose shards live on this process's devices.

  With one process: all rows. Raises if this process's rows are not contiguous (a mesh whose
  device order interleaves processes along the data axes).
  """
  sh = row_sharding(mesh, (num_rows, 1), rules)
  starts, stops = [], []
  for idx in sh.addressable_devices_indices_map((num_rows, 1)).values():
    r = idx[0]
    starts.append(r.start or 0)
    stops.append(num_rows if r.stop is None else r.stop)
  lo, hi = min(starts), max(stops)
  covered = np.zeros(num_rows, bool)
  for a, b in zip(starts, stops, strict=True):
    covered[a:b] = True
  if not covered[lo:hi].all():
    raise ValueError(f"rows of process {jax.process_index()} are not contiguous in {num_rows}")
  return slice(lo, hi)


def shard_local_rows(
  local_tree: Any, global_rows: int, mesh: Mesh, rules=sharding_lib.TRAIN_RULES
) -> Any:
  """Global row-sharded arrays from this process's rows (``process_rows``) of each leaf.

  ``jax.make_array_from_process_local_data``: no process ever holds the whole batch.
  """

  def one(x):
    x = np.asarray(x)
    shape = (global_rows, *x.shape[1:])
    return jax.make_array_from_process_local_data(row_sharding(mesh, shape, rules), x, shape)

  return jax.tree.map(one, local_tree)


def to_host(tree: Any) -> Any:
  """Global arrays -> full numpy arrays on every process (an all-gather across processes).

  Typed PRNG keys come back as their uint32 key data."""
  from jax.experimental import multihost_utils

  def one(x):
    if _is_key(x):
      x = jax.random.key_data(x)
    if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
      return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))

  return jax.tree.map(one, tree)


def reduce_metrics(metrics: dict[str, float], weight: float = 1.0) -> dict[str, float]:
  """Combines per-process host metrics: weighted mean, or min/max for keys ending in /min, /max.

  ``weight`` is this process's share (e.g. its number of samples; NaN values are excluded). Every
  process must pass the same keys. One all-gather of a [K, 2] array; every process gets the same
  dict (``combine_process_metrics``). Single process: unchanged values (as floats).
  """
  keys = sorted(metrics)
  if jax.process_count() == 1:
    return {k: float(metrics[k]) for k in keys}
  from jax.experimental import multihost_utils

  values = np.array([float(metrics[k]) for k in keys], np.float64)
  local = np.stack([values, np.full_like(values, float(weight))], -1)
  return combine_process_metrics(keys, np.asarray(multihost_utils.process_allgather(local)))


def combine_process_metrics(keys, table: np.ndarray) -> dict[str, float]:
  """``table`` [P, K, 2] of (value, weight) per process and key -> one value per key.

  mean-type key:  sum_p w_p v_p / sum_p w_p  over processes with finite v_p (NaN if none)
  ``*/min``, ``*/max``:  min / max over finite v_p
  """
  table = np.asarray(table, np.float64)
  if table.ndim != 3 or table.shape[1:] != (len(keys), 2):
    raise ValueError(f"table {table.shape} must be [P, K={len(keys)}, 2]")
  out = {}
  for i, k in enumerate(keys):
    v, w = table[:, i, 0], table[:, i, 1]
    finite = np.isfinite(v)
    if not finite.any():
      out[k] = float("nan")
    elif k.endswith("/min"):
      out[k] = float(v[finite].min())
    elif k.endswith("/max"):
      out[k] = float(v[finite].max())
    else:
      wf = np.where(finite, w, 0.0)
      out[k] = (
        float(np.sum(np.where(finite, v, 0.0) * wf) / wf.sum()) if wf.sum() > 0 else float("nan")
      )
  return out


def process_sum(values: dict[str, float]) -> dict[str, float]:
  """Sums host scalars over processes (e.g. token counts of each process's rows); one all-gather."""
  keys = sorted(values)
  if jax.process_count() == 1:
    return {k: float(values[k]) for k in keys}
  from jax.experimental import multihost_utils

  local = np.array([float(values[k]) for k in keys], np.float64)
  table = np.asarray(multihost_utils.process_allgather(local))  # [P, K]
  return {k: float(table[:, i].sum()) for i, k in enumerate(keys)}


def base_shardings(base, model_config, mesh: Mesh, rules=sharding_lib.TRAIN_RULES):
  """Shardings of a LoRA run's frozen base: the params' (``param_shardings``), or for an int8
  base (``lora.quantize_int8``) the int8 values like their weight and the scales like the weight's
  output dims (``lora.quantized_logical_axes``)."""
  layers = base["layers"]
  names = [n for n, w in layers.items() if lora_lib.is_quantized(w)]
  if "lm_head" in base and lora_lib.is_quantized(base["lm_head"]):
    names.append("lm_head")
  if not names:
    return model_lib.param_shardings(model_config, mesh, rules)
  axes = lora_lib.quantized_logical_axes(model_config, names)
  return sharding_lib.tree_shardings(axes, base, mesh, rules)


def sharded_train_step(train_step, shardings: TrainState, mesh: Mesh):
  """Wraps a jitted ``train_step(state, batch, num_tokens, num_seqs, key, **kwargs)``
  (``train.step``; ``base=`` of a LoRA step) so the returned state keeps the training layout
  (``out_shardings``; inputs keep their own), the state stays donated (never the base), and the
  step is traced under ``jax.set_mesh(mesh)``."""
  rep = replicated(mesh)
  step = jax.jit(train_step, donate_argnums=(0,), out_shardings=(shardings, rep))

  @functools.wraps(train_step)
  def run(state, batch, num_tokens, num_seqs, key, **kwargs):
    with jax.set_mesh(mesh):
      return step(state, batch, num_tokens, num_seqs, key, **kwargs)

  return run


def allgather_rows(local: np.ndarray, counts: list[int]) -> np.ndarray:
  """Every process's [counts[i], ...] rows concatenated in process order, on every process.

  One all-gather of the rows zero-padded to ``max(counts)`` (processes may hold different numbers
  of rows). Collective: every process must call it, in the same order. Dtypes wider than 32 bits
  come back as their 32-bit kind (JAX without x64).
  """
  from jax.experimental import multihost_utils

  local = np.asarray(local)
  mine = counts[jax.process_index()]
  if local.shape[0] != mine:
    raise ValueError(f"process {jax.process_index()} has {local.shape[0]} rows, counts say {mine}")
  pad = np.zeros((max(counts) - mine, *local.shape[1:]), local.dtype)
  table = np.asarray(multihost_utils.process_allgather(np.concatenate([local, pad], 0)))
  return np.concatenate([table[i, :c] for i, c in enumerate(counts)], 0)


class _GatheredRewards:
  """Future of a ``RewardResult`` for all rows, from this process's future for its own rows.

  ``result()`` is collective (every process must call it, in the same order).
  """

  def __init__(self, future, counts: list[int], offset: int):
    self.future, self.counts, self.offset = future, counts, offset

  def result(self):
    r = self.future.result()
    gather = lambda x: allgather_rows(np.asarray(x, np.float32), self.counts)
    # Numeric info columns (e.g. ``correct``) are gathered; others (strings) cannot be and are
    # dropped.
    info = {k: gather(v) for k, v in sorted(r.info.items()) if np.asarray(v).dtype.kind in "biuf"}
    token = None if r.token_rewards is None else gather(r.token_rewards)
    failures = [dataclasses.replace(f, index=f.index + self.offset) for f in r.failures]
    metrics = reduce_metrics(r.metrics, weight=float(len(r.rewards)))
    rewards = gather(r.rewards)
    return dataclasses.replace(
      r, rewards=rewards, info=info, token_rewards=token, failures=failures, metrics=metrics
    )


class MeshLayout(Layout):
  """``train.layout.Layout`` on a (data, fsdp, tensor[, context]) mesh, in one process or many.

  The train state in the training layout (``state_shardings``), each minibatch's rows over the
  data axes (``shard_rows``; with a ``context`` axis the token rows also along the sequence,
  ``shard_sequences``), the sampler's params resharded to the sampling layout, every jitted
  call under ``jax.set_mesh``. With several processes each process loads only its contiguous
  share of every prompt batch (``shard_source`` / ``local_groups``); the tokenized prompts (small
  [P, S] int arrays) are all-gathered into the global batch, the rollout and scoring passes
  (small [B, T] arrays) are gathered to every host (``to_host``), each process computes the
  rewards of its own groups in its own reward workers, and the results are all-gathered, so the
  host loop (advantages, dynamic sampling, data position, metrics) runs identically on every
  process. With ``make_mesh``'s process-major device order the groups a process loads are the
  groups whose rows its devices hold (``process_rows``).
  """

  def __init__(self, mesh: Mesh):
    self.mesh = mesh
    self.process_index, self.process_count = jax.process_index(), jax.process_count()
    self.state_shardings: TrainState | None = None
    self.sample_shardings = None
    self.base_shardings = None

  def context(self):
    return jax.set_mesh(self.mesh)

  def setup(self, state, *, model_config, optimizer, lora=None, base=None) -> None:
    self.state_shardings = state_shardings(
      state, mesh=self.mesh, model_config=model_config, optimizer=optimizer, lora=lora
    )
    self.sample_shardings = model_lib.param_shardings(
      model_config, self.mesh, sharding_lib.SAMPLE_RULES
    )
    if base is not None:
      self.base_shardings = base_shardings(base, model_config, self.mesh)

  def _shardings(self) -> TrainState:
    if self.state_shardings is None:
      raise RuntimeError("MeshLayout.setup(state, ...) must be called before placing anything")
    return self.state_shardings

  def _sample_shardings(self):
    self._shardings()  # raises before setup
    return self.sample_shardings

  def place_state(self, state):
    with jax.set_mesh(self.mesh):
      return place(state, self._shardings())

  def place_base(self, base):
    if self.base_shardings is None:
      raise RuntimeError("MeshLayout.setup(state, ..., base=base) must be called first")
    with jax.set_mesh(self.mesh):
      return place(base, self.base_shardings)

  def wrap_train_step(self, train_step):
    return sharded_train_step(train_step, self._shardings(), self.mesh)

  @property
  def context_size(self) -> int:
    return sharding_lib.context_size(self.mesh)

  @property
  def row_multiple(self) -> int:
    axes = dict(sharding_lib.TRAIN_RULES)["batch"]  # the axes ``shard_rows`` splits rows over
    return math.prod(int(self.mesh.shape.get(a, 1)) for a in axes)

  def place_batch(self, batch):
    if self.context_size > 1:
      return shard_sequences(batch, self.mesh)
    return shard_rows(batch, self.mesh)

  def sampling_params(self, params):
    if params is None:
      return None
    return sharding_lib.reshard(params, self._sample_shardings())

  def _counts(self, num: int) -> list[int]:
    spans = [shard_span(num, i, self.process_count) for i in range(self.process_count)]
    return [hi - lo for lo, hi in spans]

  def gather_prompts(self, prompt_tokens, prompt_mask, prompt_ids, *, pad_id: int):
    if self.process_count == 1:
      return prompt_tokens, prompt_mask, prompt_ids
    from jax.experimental import multihost_utils

    tokens, mask = np.asarray(prompt_tokens, np.int32), np.asarray(prompt_mask, bool)
    # [num_processes, 2]: every process's number of prompts and padded width.
    meta = np.asarray(multihost_utils.process_allgather(np.array(tokens.shape, np.int32)))
    counts = [int(n) for n in meta[:, 0]]
    pad = int(meta[:, 1].max()) - tokens.shape[1]  # left padding to the widest process's width
    tokens = np.pad(tokens, ((0, 0), (pad, 0)), constant_values=pad_id)
    mask = np.pad(mask, ((0, 0), (pad, 0)), constant_values=False)
    ids = np.asarray(prompt_ids, np.int32)[:, None]
    packed = allgather_rows(np.concatenate([tokens, mask.astype(np.int32), ids], 1), counts)
    s = tokens.shape[1]
    return packed[:, :s], packed[:, s : 2 * s].astype(bool), packed[:, 2 * s]

  def gather_rollout(self, tree):
    return tree if self.process_count == 1 else to_host(tree)

  def gather_rewards(self, future, num_groups: int, group_size: int):
    if self.process_count == 1:
      return future
    counts = [n * group_size for n in self._counts(num_groups)]
    g0, _ = self.local_groups(num_groups)
    return _GatheredRewards(future, counts, g0 * group_size)


class MeshTrainer(loop.Trainer):
  """``train.loop.Trainer`` with a ``MeshLayout``: the same host loop with the state in the
  training layout, minibatches row-sharded, rollouts sampled with params in the sampling layout.

  With several processes (``rlvr_jax.distributed``) every process runs the same host loop, loads
  and rewards its own share of the prompts, writes checkpoints collectively into
  ``config.workdir``, and only process 0 logs there (the others write their metrics to
  ``<workdir>/process_<i>``).
  """

  def __init__(self, config, *, mesh: Mesh, log=print):
    super().__init__(config, log=log, layout=MeshLayout(mesh))


def parse_mesh(text: str) -> tuple[int, ...] | None:
  """``"data,fsdp,tensor"`` or ``"data,fsdp,tensor,context"`` sizes (one may be -1) -> a tuple;
  ``""`` -> None (no mesh). A context size > 1 is context parallelism
  (``model.attention="ring"``)."""
  if not text.strip():
    return None
  try:
    sizes = tuple(int(x) for x in text.split(","))
  except ValueError as e:
    raise ValueError(
      f"--mesh={text!r}: expected three integers 'data,fsdp,tensor' or four "
      "'data,fsdp,tensor,context'"
    ) from e
  if len(sizes) not in (3, 4):
    raise ValueError(
      f"--mesh={text!r}: expected three sizes 'data,fsdp,tensor' or four "
      f"'data,fsdp,tensor,context', got {len(sizes)}"
    )
  return sizes


def train(config, *, mesh_sizes=None, log=print) -> dict:
  """``train.loop.train`` on a mesh: ``mesh_sizes`` (data, fsdp, tensor[, context]; -1 = infer)
  over all devices of all processes. ``None`` with one process: the plain single-device ``Trainer``;
  ``None`` with several processes: FSDP over every device, ``(1, -1, 1)``."""
  if mesh_sizes is None and jax.process_count() == 1:
    return loop.train(config, log=log)
  mesh = sharding_lib.make_mesh(*(mesh_sizes or (1, -1, 1)))
  trainer = MeshTrainer(config, mesh=mesh, log=log)
  try:
    return trainer.run()
  finally:
    trainer.close()
