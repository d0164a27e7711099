"""The optax optimiser from the ``config.optim`` block: AdamW, global-norm clipping, schedules.

  chain(clip_by_global_norm(grad_clip), adamw(schedule, b1, b2, eps, weight_decay))

Schedules (``optim.schedule``): "constant", "cosine" (warmup then cosine decay to
``lr * final_lr_fraction`` over ``decay_steps`` optimiser updates), "linear" (warmup then linear
decay). ``decay_steps`` counts optimiser updates, i.e. RL steps x updates per rollout batch.
"""

from __future__ import annotations

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
