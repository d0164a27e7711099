"""The trainer's placement hooks: where arrays live and how processes share the host work.

``train.loop.Trainer`` and ``train.rollout.Collector`` take a ``Layout`` and call only its public
methods, at these points of the host loop:

  Trainer.__init__    ``setup(state, ...)`` once, then ``place_state``, ``place_base`` (the
                      frozen base of a LoRA run), ``wrap_train_step``, ``shard_source`` (the
                      train prompt stream); ``is_primary`` (who logs)
  every jitted call   runs inside ``context()``
  restore / warm start ``place_state`` on the restored or warm-started state
  rollout             ``sampling_params`` (params -> sampling layout), ``gather_prompts`` (this
                      process's prompts -> the whole batch), ``gather_rollout`` (device rollout and
                      scoring passes -> what the host loop reads), ``local_groups`` (the groups whose
                      rewards this process computes), ``gather_rewards`` (per-process reward results
                      -> every row's)
  each minibatch      ``place_batch`` (a host ``TrainBatch`` -> the step's input layout)

``Layout`` itself is one device in one process: every hook is the identity. ``train.sharded.
MeshLayout`` places the state on a (data, fsdp, tensor) mesh, in one process or many.
"""

from __future__ import annotations

import contextlib
from typing import Any

from rlvr_jax.data.source import shard_span


class Layout:
  """One device, one process (the default ``Trainer`` layout): every hook is the identity.

  Attributes:
    process_index, process_count: this process and the number of processes of the run.
  """

  process_index: int = 0
  process_count: int = 1

  @property
  def is_primary(self) -> bool:
    """Process 0 logs, writes summaries and plots into the run directory."""
    return self.process_index == 0

  def barrier(self, name: str) -> None:
    """Waits until every process of the run gets here (e.g. after process 0 changed files)."""
    if self.process_count > 1:
      from jax.experimental import multihost_utils

      multihost_utils.sync_global_devices(name)

  def context(self):
    """Context manager the trainer runs every jitted call under (e.g. ``jax.set_mesh``)."""
    return contextlib.nullcontext()

  def setup(self, state, *, model_config, optimizer, lora=None, base=None) -> None:
    """Called once with the freshly initialised (host) state, before any other placement hook.
    A LoRA run passes its ``lora.LoraConfig`` (``state.params`` are then the adapters) and its
    frozen ``base`` params (possibly int8: ``lora.quantize_int8``)."""
    del state, model_config, optimizer, lora, base

  def place_state(self, state):
    """The train state in the training layout."""
    return state

  def place_base(self, base):
    """The frozen base params of a LoRA run in the training layout (an input of every train
    step, never donated)."""
    return base

  def wrap_train_step(self, train_step):
    """The jitted ``train_step(state, batch, num_tokens, num_seqs, key, **kwargs)`` to call
    (``base=`` in a LoRA run)."""
    return train_step

  @property
  def context_size(self) -> int:
    """The size of the ``context`` mesh axis the update's sequences are split over (1: none)."""
    return 1

  @property
  def row_multiple(self) -> int:
    """Batch rows split evenly over the devices when their number is a multiple of this."""
    return 1

  def place_batch(self, batch):
    """One minibatch (``TrainBatch`` of [B_mb, ...] arrays, the same on every process) placed
    for the train step."""
    return batch

  def sampling_params(self, params):
    """Params (or ``None``) in the sampling layout."""
    return params

  def shard_source(self, source):
    """The train prompt stream this process reads: its ``shard(process_index, process_count)``."""
    if self.process_count == 1:
      return source
    return source.shard(self.process_index, self.process_count)

  def local_groups(self, num_groups: int) -> tuple[int, int]:
    """Groups ``[g0, g1)`` of a batch of ``num_groups`` prompts that this process loads and
    rewards: the same contiguous split as ``shard_source`` (``data.source.shard_span``)."""
    return shard_span(num_groups, self.process_index, self.process_count)

  def gather_prompts(self, prompt_tokens, prompt_mask, prompt_ids, *, pad_id: int):
    """This process's left-padded prompts [P_local, S_local] (+ mask, [P_local] ids) -> the whole
    batch's [P, S], S the widest process's width, in process order."""
    del pad_id
    return prompt_tokens, prompt_mask, prompt_ids

  def gather_rollout(self, tree: Any) -> Any:
    """A rollout (or scoring-pass outputs) as the host loop reads them: every row, this process."""
    return tree

  def gather_rewards(self, future, num_groups: int, group_size: int):
    """A future of this process's ``RewardResult`` (rows of ``local_groups(num_groups)``) -> a
    future of every row's result (collective in ``result()`` with several processes)."""
    del num_groups, group_size
    return future
