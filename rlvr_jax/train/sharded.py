"""Training on a device mesh, in one process or many: placement, batches, metrics, the trainer.

Layouts (``rlvr_jax.sharding``): the train state lives in the *training* layout (``TRAIN_RULES``:
weights split over ``fsdp`` x ``tensor``, optimiser moments like their parameters, scalars
replicated); step batches are split by rows over ``data`` x ``fsdp``; the sampler gets the params
resharded to the *sampling* layout (``SAMPLE_RULES``: weights over ``tensor`` only).

Multi-process (``rlvr_jax.distributed``): every process runs the same program on the same global
mesh. Arrays are built from host data with ``jax.make_array_from_callback`` (every process holds
the same value, each places its own shards: params at start-up) or
``jax.make_array_from_process_local_data`` (each process holds only its rows: its share of a step
batch, ``process_rows``). Host metrics are reduced across processes with ``reduce_metrics``; orbax
checkpoints of the sharded state are written collectively (each process writes its own shards).

``MeshTrainer`` is ``train.loop.Trainer`` on a mesh: same host loop, state placed in the training
layout, minibatches sharded over the data axes, params resharded to the sampling layout for the
rollout, every jitted call traced under ``jax.set_mesh``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rlvr_jax import model as model_lib
from rlvr_jax import sharding as sharding_lib
from rlvr_jax.train.state import TrainState


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
) -> TrainState:
  """A ``TrainState`` of ``NamedSharding``s: params (and ``extra['ref_params']``) by the logical
  axes of the model under ``rules``, every parameter-shaped part of the optimiser state (Adam
  moments, ...) like its parameter (``optax.tree_map_params``), everything else replicated."""
  rep = replicated(mesh)
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
    if isinstance(x, jax.Array) and x.is_fully_addressable and x.sharding == sh:
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


def sharded_train_step(train_step, shardings: TrainState, mesh: Mesh):
  """Wraps a jitted ``train_step(state, batch, num_tokens, num_seqs, key)`` (``train.step``) so
  the returned state keeps the training layout (``out_shardings``; inputs keep their own), the
  state stays donated, and the step is traced under ``jax.set_mesh(mesh)``."""
  rep = replicated(mesh)
  step = jax.jit(train_step, donate_argnums=(0,), out_shardings=(shardings, rep))

  @functools.wraps(train_step)
  def run(state, batch, num_tokens, num_seqs, key):
    with jax.set_mesh(mesh):
      return step(state, batch, num_tokens, num_seqs, key)

  return run


def group_range(num_groups: int, group_size: int, mesh: Mesh) -> tuple[int, int]:
  """Groups ``[g0, g1)`` whose rewards this process computes.

  The groups whose rows live on this process's devices (``process_rows``) when they hold whole
  groups; otherwise an even split of the groups over the processes.
  """
  n, pid = jax.process_count(), jax.process_index()
  if n == 1:
    return 0, num_groups
  try:
    rows = process_rows(num_groups * group_size, mesh)
  except ValueError:
    rows = None
  if rows is not None and rows.start % group_size == 0 and rows.stop % group_size == 0:
    return rows.start // group_size, rows.stop // group_size
  return pid * num_groups // n, (pid + 1) * num_groups // n


def _allgather_rows(local: np.ndarray, counts: list[int]) -> np.ndarray:
  """Concatenates every process's [n_i, ...] rows in process order (padded all-gather)."""
  from jax.experimental import multihost_utils

  width = max(counts)
  pad = np.full((width - local.shape[0], *local.shape[1:]), np.nan, np.float64)
  table = multihost_utils.process_allgather(np.concatenate([local.astype(np.float64), pad], 0))
  return np.concatenate([np.asarray(table)[i, :c] for i, c in enumerate(counts)], 0)


class _GatheredRewards:
  """Future of a ``RewardResult`` for all rows, from this process's future for its own rows.

  ``result()`` is collective (every process must call it, in the same order).
  """

  def __init__(self, future, counts: list[int], offset: int):
    self.future, self.counts, self.offset = future, counts, offset

  def result(self):
    r = self.future.result()
    rewards = _allgather_rows(np.asarray(r.rewards), self.counts).astype(np.float32)
    # Numeric info columns (e.g. ``correct``) are gathered; others (strings) cannot be and are
    # dropped.
    info = {
      k: _allgather_rows(np.asarray(v, np.float64), self.counts).astype(np.float32)
      for k, v in sorted(r.info.items())
      if np.asarray(v).dtype.kind in "biuf"
    }
    token = None
    if r.token_rewards is not None:
      token = _allgather_rows(np.asarray(r.token_rewards), self.counts).astype(np.float32)
    failures = [dataclasses.replace(f, index=f.index + self.offset) for f in r.failures]
    metrics = reduce_metrics(r.metrics, weight=float(len(r.rewards)))
    return dataclasses.replace(
      r, rewards=rewards, info=info, token_rewards=token, failures=failures, metrics=metrics
    )


def _multiprocess_collector(collector, mesh: Mesh):
  """Turns a ``train.rollout.Collector`` into its multi-process variant (in place).

  Rollouts and scoring passes are gathered to every host (small [B, T] arrays) so the host loop
  runs identically everywhere; each process computes the rewards of its own groups
  (``group_range``) in its own reward workers, and the results are all-gathered.
  """
  base = type(collector)

  class MultiProcessCollector(base):
    def sample(self, params, records, **kwargs):
      texts, ro = super().sample(params, records, **kwargs)
      return texts, to_host(ro)

    def _scores(self, params, ref_params, rollout, *, need_old):
      return to_host(super()._scores(params, ref_params, rollout, need_old=need_old))

    def submit_rewards(self, texts, records, rollout, num_samples):
      num_groups = len(records)
      g0, g1 = group_range(num_groups, num_samples, mesh)
      b, rows = num_groups * num_samples, slice(g0 * num_samples, g1 * num_samples)
      local = jax.tree.map(lambda x: x[rows] if np.ndim(x) and np.shape(x)[0] == b else x, rollout)
      _, future = super().submit_rewards(texts[g0:g1], records[g0:g1], local, num_samples)
      from jax.experimental import multihost_utils

      spans = np.asarray(multihost_utils.process_allgather(np.array([g0, g1], np.int64)))
      counts = [int(hi - lo) * num_samples for lo, hi in spans.reshape(-1, 2)]
      # Every row's text (the host loop may use them, e.g. COPO's answer ids): decoding is cheap.
      completions = self.tokenizer.decode_batch(
        np.asarray(rollout.tokens), np.asarray(rollout.completion_mask)
      )
      return completions, _GatheredRewards(future, counts, rows.start)

  collector.__class__ = MultiProcessCollector
  return collector


class MeshTrainer:
  """Factory for a ``train.loop.Trainer`` on a mesh (see the module docstring).

  ``MeshTrainer(config, mesh=mesh)`` returns a Trainer subclass instance whose state is in the
  training layout, whose minibatches are row-sharded, and whose rollouts sample with params in the
  sampling layout. With several processes (``rlvr_jax.distributed``) every process runs the same
  host loop on host copies of the (small) rollout arrays, computes the rewards of its own groups,
  writes checkpoints collectively into ``config.workdir``, and only process 0 logs there (the
  others write their metrics to ``<workdir>/process_<i>``).
  """

  def __new__(cls, config, *, mesh: Mesh, log=print):
    import os

    from rlvr_jax.train import loop

    primary = jax.process_index() == 0

    class _Trainer(loop.Trainer):
      def __init__(self):
        super().__init__(config, log=log if primary else (lambda s: None))
        self.mesh = mesh
        if not primary:  # checkpoints stay shared; logs, summaries, plots go elsewhere
          c = config.copy_and_resolve_references()
          c.workdir = os.path.join(config.workdir, f"process_{jax.process_index()}")
          c.logging.progress = False
          os.makedirs(c.workdir, exist_ok=True)
          self.c = c
        self.shardings = state_shardings(
          self.state, mesh=mesh, model_config=self.model_config, optimizer=self.optimizer
        )
        self.sample_shardings = model_lib.param_shardings(
          self.model_config, mesh, sharding_lib.SAMPLE_RULES
        )
        with jax.set_mesh(mesh):
          self.state = place(self.state, self.shardings)
        self.train_step = sharded_train_step(self.train_step, self.shardings, mesh)
        if jax.process_count() > 1:
          _multiprocess_collector(self.collector, mesh)
        self.collector = _SamplingLayout(self.collector, self.sample_shardings, mesh)

      def _minibatch(self, batch, rows):
        tb, num_tokens, num_seqs = super()._minibatch(batch, rows)
        return shard_rows(tb, mesh), num_tokens, num_seqs

      def restore_or_start(self):
        with jax.set_mesh(mesh):
          out = super().restore_or_start()
          self.state = place(self.state, self.shardings)  # after a warm start, too
        return out

      def rl_step(self, step):
        with jax.set_mesh(mesh):
          return super().rl_step(step)

      def evaluate(self):
        with jax.set_mesh(mesh):
          return super().evaluate()

    return _Trainer()


@dataclasses.dataclass
class _SamplingLayout:
  """Wraps a ``train.rollout.Collector``: params (and reference params) are resharded to the
  sampling layout before sampling and scoring; every other attribute is the collector's."""

  inner: Any
  shardings: Any
  mesh: Mesh

  def __getattr__(self, name):
    return getattr(self.inner, name)

  def _to_sample(self, params):
    return None if params is None else sharding_lib.reshard(params, self.shardings)

  def collect(self, params, *, ref_params=None, **kwargs):
    with jax.set_mesh(self.mesh):
      return self.inner.collect(
        self._to_sample(params), ref_params=self._to_sample(ref_params), **kwargs
      )

  def sample(self, params, records, **kwargs):
    with jax.set_mesh(self.mesh):
      return self.inner.sample(self._to_sample(params), records, **kwargs)


def parse_mesh(text: str) -> tuple[int, int, int] | None:
  """``"data,fsdp,tensor"`` sizes (one may be -1) -> a tuple; ``""`` -> None (no mesh)."""
  if not text.strip():
    return None
  try:
    sizes = tuple(int(x) for x in text.split(","))
  except ValueError as e:
    raise ValueError(f"--mesh={text!r}: expected three integers 'data,fsdp,tensor'") from e
  if len(sizes) != 3:
    raise ValueError(f"--mesh={text!r}: expected three sizes 'data,fsdp,tensor', got {len(sizes)}")
  return sizes


def train(config, *, mesh_sizes=None, log=print) -> dict:
  """``train.loop.train`` on a mesh: ``mesh_sizes`` (data, fsdp, tensor; -1 = infer) over all
  devices of all processes. ``None`` with one process: the plain single-device ``Trainer``;
  ``None`` with several processes: FSDP over every device, ``(1, -1, 1)``."""
  from rlvr_jax.train import loop

  if mesh_sizes is None and jax.process_count() == 1:
    return loop.train(config, log=log)
  mesh = sharding_lib.make_mesh(*(mesh_sizes or (1, -1, 1)))
  trainer = MeshTrainer(config, mesh=mesh, log=log)
  try:
    return trainer.run()
  finally:
    trainer.close()
