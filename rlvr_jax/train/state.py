"""The train state and the step batch, as frozen pytree dataclasses.

``TrainState`` holds everything that changes across RL steps and must survive a restart: params,
optimiser state, the RL step counter, the run's PRNG key, and ``extra`` (a dict of arrays for
stateful methods: ``"estimator"``, an estimator's state, e.g. a quantile tracker, and ``"objective"``,
an objective's, e.g. an adaptive entropy coefficient; their specs say what it is). All of it
goes into the checkpoint.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from rlvr_jax.types import pytree_dataclass


@pytree_dataclass
class TrainState:
  """Attributes:
  step: int32 [] number of RL steps (rollout batches) done.
  params: model params pytree.
  opt_state: optax state.
  key: typed PRNG key of the run (sampling keys are ``fold_in(key, step)``).
  num_skipped: int32 [] optimiser updates skipped because the loss or gradients were non-finite.
  extra: dict of arrays carried across steps by stateful estimators (may be empty).
  """

  step: jax.Array
  params: Any
  opt_state: Any
  key: jax.Array
  num_skipped: jax.Array
  extra: Any

  def replace(self, **changes) -> TrainState:
    return dataclasses.replace(self, **changes)


def init_state(params, optimizer, key, extra=None) -> TrainState:
  """A fresh state, committed to the default device like a restored checkpoint's arrays: the
  compiled programs' cache key includes the placement, so a resumed run reuses them."""
  state = TrainState(
    step=jnp.zeros((), jnp.int32),
    params=params,
    opt_state=optimizer.init(params),
    key=key,
    num_skipped=jnp.zeros((), jnp.int32),
    extra={} if extra is None else extra,
  )
  return jax.device_put(state, jax.local_devices()[0])


@pytree_dataclass
class TrainBatch:
  """One step batch (all micro-batches of one optimiser update), B rows.

  Attributes:
    tokens: [B, S] int32 prompt (left-padded, S_prompt wide) followed by the completion (T wide).
    positions: [B, S] int32 token positions; -1 on prompt padding.
    completion_mask: [B, T] bool loss mask.
    advantages: [B, T] float32.
    old_logp: [B, T] float32 proximal-policy log-probs (ignored when the step is on-policy).
    sampler_logp: [B, T] float32 sampler log-probs of the completion tokens.
    ref_logp: [B, T] float32 reference log-probs, or None.
    extras: dict of extra [B, T] per-token inputs objectives ask for by keyword (e.g. proxy_logp).
    aux: dict of [B] per-row inputs of the auxiliary loss (``losses.AUX_READS``), or None.
    packed: a ``rlvr_jax.train.packing.PackedLayout`` (the model runs on the packed rows, and
      the hidden states are gathered back to this [B, T] layout), or None (the model runs on
      ``tokens``).
  """

  tokens: jax.Array
  positions: jax.Array
  completion_mask: jax.Array
  advantages: jax.Array
  old_logp: jax.Array
  sampler_logp: jax.Array
  ref_logp: Any
  extras: Any
  aux: Any = None
  packed: Any = None
