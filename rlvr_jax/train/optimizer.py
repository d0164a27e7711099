"""The optax optimiser from the ``config.optim`` block: AdamW, global-norm clipping, schedules.

  chain(clip_by_global_norm(grad_clip), adamw(schedule, b1, b2, eps, weight_decay))

Schedules (``optim.schedule``): "constant", "cosine" (warmup then cosine decay to
``lr * final_lr_fraction`` over ``decay_steps`` optimiser updates), "linear" (warmup then linear
decay). ``decay_steps`` counts optimiser updates, i.e. RL steps x updates per rollout batch.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
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

  def fused_apply(self, grads, state, params, grad_norm):
    """One step of ``make_optimizer``'s chain, applied: ``(params', state', update_norm)``.

    The same math and the same state tree as ``update`` followed by ``optax.apply_updates``: the
    clip rescales g by max_norm / ||g|| when ||g|| >= max_norm; m' = (1-b1) g + b1 m,
    v' = (1-b2) g^2 + b2 v, p' = p - lr(k) (m' / (1 - b1^t)) / (sqrt(v' / (1 - b2^t)) + eps)
    [- lr wd p]. Written so that XLA:CPU, which fuses no multi-output loops, passes over the
    parameter-sized trees as few times as it can:
    - the clip is one scalar factor multiplied inside the loops of m' and v' (optax divides by
      ||g|| per element and then multiplies, within an ulp of this; a divide XLA does not repeat
      in two consumers, so it wrote g / ||g|| out as a tree of its own);
    - the clip takes the caller's ``grad_norm`` instead of computing it again (inside the step's
      ``lax.cond`` no common-subexpression elimination reaches it);
    - the update is not materialised, and ``update_norm`` is the norm of the change applied,
      ``||p' - p||`` (read from p' and p; it differs from ||u|| only by the rounding of p + u).
    Measured on SmolLM2: docs/benchmarks.md.
    """
    *_, (adam, decay_state, sched) = state
    clip = float(self.grad_clip)
    count = optax.safe_increment(adam.count)
    lr = make_schedule(self, self.decay_steps or 0)(sched.count)
    b1, b2, eps, wd = float(self.b1), float(self.b2), float(self.eps), float(self.weight_decay)
    bc1 = (1 - b1**count).astype(jnp.float32)
    bc2 = (1 - b2**count).astype(jnp.float32)

    # optax.clip_by_global_norm computes (g / ||g||) * max_norm per element; here one scalar
    # factor (within an ulp of it), so that the clip is a multiply XLA repeats inside the fusions
    # of m' and v' instead of a divide it writes out as a third parameter-sized tree.
    scale = jnp.where(grad_norm < clip, 1.0, clip / grad_norm).astype(jnp.float32)

    def clipped(g):
      return g * scale.astype(g.dtype) if clip > 0 else g

    mu = jax.tree.map(lambda g, m: (1 - b1) * clipped(g) + b1 * m, grads, adam.mu)
    nu = jax.tree.map(lambda g, v: (1 - b2) * clipped(g) ** 2 + b2 * v, grads, adam.nu)

    def step(p, m, v):
      u = (m / bc1.astype(m.dtype)) / (jnp.sqrt(v / bc2.astype(v.dtype)) + eps)
      if wd:
        u = u + wd * p
      return (p + (-lr) * u).astype(p.dtype)

    new_params = jax.tree.map(step, params, mu, nu)
    update_norm = optax.global_norm(jax.tree.map(jnp.subtract, new_params, params))
    adam = optax.ScaleByAdamState(count=count, mu=mu, nu=nu)
    sched = optax.ScaleByScheduleState(count=optax.safe_increment(sched.count))
    return new_params, (*state[:-1], (adam, decay_state, sched)), update_norm
