"""The reward standard-deviation prompt filter in the trainer (RLPR, arXiv 2506.18254; METHODS.md
§5.7): ``config.rl.std_filter``.

A continuous reward (RLPR's debiased answer probability, any model reward) is almost never exactly
constant over a group, so the outcome filters of ``rl.group_filter`` do not drop the groups that
carry little signal. This one keeps a running EMA of the mean group standard deviation of the
final (combined) reward and, from batch ``start_step`` on, masks out of the loss and its
normalisers every group whose std is below ``beta`` x EMA (``advantages.rlpr_std_filter``).

Section::

  enabled      off by default
  beta         threshold as a fraction of the EMA (0.5 in the paper)
  decay        EMA decay per batch (0.99)
  start_step   first RL step at which groups are dropped (1-based; the EMA warms up before)

The EMA and the count of batches seen live in ``TrainState.extra['std_filter']``, so they are
checkpointed with the run and a resumed run filters exactly as an uninterrupted one. The filter
runs after the collector's advantages: per-group estimators give the kept groups the same
advantages either way; estimators with batch-wide statistics computed them over all groups.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import ConfigDict

from rlvr_jax import advantages

STATE_KEY = "std_filter"


def std_filter_section() -> ConfigDict:
  return ConfigDict(dict(enabled=False, beta=0.5, decay=0.99, start_step=11))


def validate_std_filter(c, error) -> None:
  """Raises ``error(field, message)`` for a bad ``config.rl.std_filter``."""
  f = c.rl.std_filter
  if not f.beta >= 0:
    raise error("rl.std_filter.beta", f"must be >= 0, got {f.beta}")
  if not 0.0 <= f.decay < 1.0:
    raise error("rl.std_filter.decay", f"must be in [0, 1), got {f.decay}")
  if f.start_step < 1:
    raise error("rl.std_filter.start_step", f"must be >= 1 (1-based), got {f.start_step}")


def init_std_filter_extra(c) -> dict:
  """The filter's entry of ``TrainState.extra`` (empty when the filter is off)."""
  return {STATE_KEY: advantages.std_filter_init()} if c.rl.std_filter.enabled else {}


@jax.jit
def _keep(rewards, valid, state, beta, decay, start_step):
  return advantages.rlpr_std_filter(
    rewards, state, valid=valid, beta=beta, decay=decay, start_step=start_step
  )


def apply_std_filter(batch, state, cfg):
  """(batch with the dropped groups' rows masked and the filter's ``groups/std_filter_*`` metrics
  added, new filter state) for one rollout batch (``rollout.RolloutBatch``: rewards [P, G], NaN =
  failed; completion_mask [P * G, T])."""
  rewards = np.asarray(batch.rewards, np.float32)
  P, G = rewards.shape
  keep, state, metrics = _keep(
    jnp.asarray(rewards), jnp.asarray(np.isfinite(rewards)), state,
    jnp.float32(cfg.beta), jnp.float32(cfg.decay), jnp.int32(cfg.start_step),
  )  # fmt: skip
  keep = np.asarray(keep)
  mask = np.asarray(batch.completion_mask) & np.repeat(keep, G)[:, None]
  out = {k.replace("std_filter/", "groups/std_filter_"): float(v) for k, v in metrics.items()}
  out["groups/std_filter_dropped"] = float(P - keep.sum())
  return dataclasses.replace(batch, completion_mask=mask, metrics={**batch.metrics, **out}), state
