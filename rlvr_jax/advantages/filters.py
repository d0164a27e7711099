"""Rollout group filters as values: which groups carry no learning signal and are masked out of the
loss (or dropped and refilled, DAPO dynamic sampling). The rollout collector reads ``GROUP_FILTERS``
by the name in the config and contains no filter names. Every filter reads the OUTCOME (verifier
correctness), never the shaped reward (METHODS.md §2.11), and returns [P] bool, True = reject.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from rlvr_jax.advantages import common


@dataclasses.dataclass(frozen=True)
class GroupFilter:
  """A rollout filter: ``fn(outcomes [P, G], *, valid=None, **hp) -> [P] bool`` (True = reject)."""

  name: str
  fn: Callable

  @property
  def summary(self) -> str:
    return (self.fn.__doc__ or "").strip().splitlines()[0] if self.fn.__doc__ else ""


GROUP_FILTERS: dict[str, GroupFilter] = {}


def register_filter(spec: GroupFilter, *, replace: bool = False) -> GroupFilter:
  """Adds ``spec`` to ``GROUP_FILTERS`` (a taken name raises unless ``replace``)."""
  old = GROUP_FILTERS.get(spec.name)
  if old is not None and old != spec and not replace:
    raise ValueError(f"group filter {spec.name!r} is already registered")
  GROUP_FILTERS[spec.name] = spec
  return spec


DEFAULT_GROUP_FILTER = "constant_outcome"  # the config's default (METHODS.md §2.11)
register_filter(GroupFilter("constant_outcome", common.zero_variance_groups))


def pass_rate_groups(
  outcomes: jax.Array,
  *,
  valid: jax.Array | None = None,
  low: float = 0.0,
  high: float = 1.0,
  success_threshold: float = 0.5,
) -> jax.Array:
  """Groups whose pass rate is out of (low, high): all wrong or all right by default (METHODS.md
  §5.11; DAPO's rule 0 < a_p < 1).

    a_p = mean over the group's valid samples of 1[outcome > success_threshold],
    reject p if a_p <= low or a_p >= high (or if no sample is valid).

  Unlike ``constant_outcome`` it judges success, not spread: a group of varying partial credit that no
  sample passes (outcomes [0.2, 0.4, 0, 0]) is rejected here and kept by ``constant_outcome``. PRIME keeps
  a_p in [0.2, 0.8], alibaba/ROLL 0.1 < a_p < 0.95 (set ``low`` / ``high``). [P, G] -> [P] bool.
  """
  outcomes, mask = common.prepare(outcomes, valid)
  count = jnp.sum(mask, axis=-1)
  passed = jnp.sum(mask & (outcomes > success_threshold), axis=-1)
  rate = common.safe_div(passed.astype(jnp.float32), count.astype(jnp.float32))
  return (count == 0) | (rate <= low) | (rate >= high)


register_filter(GroupFilter("pass_rate", pass_rate_groups))
