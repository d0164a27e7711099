"""The optax optimiser from the ``config.optim`` block: AdamW, global-norm clipping, schedules.

  chain(clip_by_global_norm(grad_clip), adamw(schedule, b1, b2, eps, weight_decay))

Schedules (``optim.schedule``): "constant", "cosine" (warmup then cosine decay to
``lr * final_lr_fraction`` over ``decay_steps`` optimiser updates), "linear" (warmup then linear
decay). ``decay_steps`` counts optimiser updates, i.e. RL steps x updates per rollout batch.
"""

from __future__ import annotations

import dataclasses
import functools

import optax

SCHEDULES = ("constant", "cosine", "linear")


def make_schedule(optim_cfg, decay_steps: int):
  lr, warmup = float(optim_cfg.learning_rate), int(optim_cfg.warmup_steps)
  final = lr * float(optim_cfg.final_lr_fraction)
  if optim_cfg.schedule == "constant":
    if warmup == 0:
      return optax.constant_schedule(lr)
    return optax.join_schedules(
      [optax.linear_schedule(0.0, lr, warmup), optax.constant_schedule(lr)], [warmup]
    )
  decay = max(decay_steps - warmup, 1)
  if optim_cfg.schedule == "cosine":
    return optax.warmup_cosine_decay_schedule(0.0, lr, max(warmup, 0), warmup + decay, final)
  if optim_cfg.schedule == "linear":
    return optax.join_schedules(
      [optax.linear_schedule(0.0, lr, warmup), optax.linear_schedule(lr, final, decay)], [warmup]
    )
  raise ValueError(f"optim.schedule={optim_cfg.schedule!r}: expected one of {SCHEDULES}")


def make_optimizer(optim_cfg, *, decay_steps: int) -> optax.GradientTransformation:
  """AdamW with global-norm gradient clipping (``grad_clip <= 0`` disables clipping)."""
  parts = []
  if optim_cfg.grad_clip > 0:
    parts.append(optax.clip_by_global_norm(float(optim_cfg.grad_clip)))
  parts.append(
    optax.adamw(
      make_schedule(optim_cfg, decay_steps),
      b1=float(optim_cfg.b1),
      b2=float(optim_cfg.b2),
      eps=float(optim_cfg.eps),
      weight_decay=float(optim_cfg.weight_decay),
    )
  )
  return optax.chain(*parts)


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
  """The ``config.optim`` block as hashable values, usable where an optax transformation is:
  ``init`` / ``update`` delegate to ``make_optimizer``'s chain (built once per spec). It is part
  of the train step's static configuration (``train.step.StepConfig``), so equal blocks share one
  compiled step (several runs in one process, a resumed run) without a hand-kept cache.
  ``decay_steps`` is None for a constant schedule (whose length does not matter)."""

  learning_rate: float
  schedule: str
  warmup_steps: int
  final_lr_fraction: float
  b1: float
  b2: float
  eps: float
  weight_decay: float
  grad_clip: float
  decay_steps: int | None = None

  @classmethod
  def from_config(cls, optim_cfg, *, decay_steps: int) -> OptimizerSpec:
    names = [f.name for f in dataclasses.fields(cls) if f.name != "decay_steps"]
    values = {n: getattr(optim_cfg, n) for n in names}
    return cls(**values, decay_steps=None if optim_cfg.schedule == "constant" else decay_steps)

  @functools.cached_property
  def transformation(self) -> optax.GradientTransformation:
    return make_optimizer(self, decay_steps=self.decay_steps or 0)

  def init(self, params):
    return self.transformation.init(params)

  def update(self, updates, state, params=None):
    return self.transformation.update(updates, state, params)
