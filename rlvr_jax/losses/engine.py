"""The shared engine behind every ``*_objective``: corrections, regularisers, metrics.

An objective = a per-token policy surrogate (``losses.surrogates``), optional constant token weights and
selections (``losses.selection``, in the order mismatch correction -> STEER -> selection), one aggregation
with global normalisers (``losses.aggregation``), plus the common KL and entropy terms. The recipes in
``losses.recipes`` only choose the pieces and their defaults.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax import regularizers
from rlvr_jax.losses.aggregation import (
  aggregate,
  as_mask,
  check_group_size,
  check_tokens,
  log_ratio,
  masked_sum,
  max_metric,
  mean_metric,
  min_metric,
  replicated,
  safe_div,
  token_advantages,
)
from rlvr_jax.losses.selection import MISMATCH_MODES, mismatch_weights, opsm_mask

sg = jax.lax.stop_gradient


@dataclasses.dataclass(frozen=True)
class CommonOptions:
  """Keyword options every objective accepts besides its recipe hyperparameters.

  Attributes:
    kl_coef: beta of the reference-KL loss term (token mean over the policy's token set, N_tok).
      Needs ``ref_logp``. May be a traced scalar.
    kl_value, kl_grad: estimators for the KL value and gradient (``regularizers.kl_penalty``);
      the default (k3 value, k2 gradient) has the correct on-policy reverse-KL gradient.
    kl_clamp: clamp on the KL value (the fraction of clamped tokens is logged as ``kl/clamp_frac``).
    entropy_coef: c_H of the entropy bonus -c_H sum m H / N_tok; needs a differentiable
      ``entropy``. May be traced (adaptive coefficient).
    mismatch: sampler/trainer correction mode (``losses.mismatch_weights``), needs
      ``sampler_logp``; ``mismatch_low`` / ``mismatch_high`` are its bounds.
    opsm_threshold: if set, off-policy sequence masking (``losses.opsm_mask``).
    group_size: G; if set, ``grad_frac/groups`` (groups with a token that carries gradient) is
      logged and G must divide B.
    seq_norm_constant: C of ``seq_mean_token_sum_norm`` (e.g. the maximum response length).
  """

  kl_coef: Any = 0.0
  kl_value: str = "k3"
  kl_grad: str = "k2"
  kl_clamp: float | None = 10.0
  entropy_coef: Any = 0.0
  mismatch: str = "none"
  mismatch_low: float | None = None
  mismatch_high: float | None = 2.0
  opsm_threshold: float | None = None
  group_size: int | None = None
  seq_norm_constant: float | None = None


def common_options(name: str, options: dict) -> CommonOptions:
  """Validates the ``**options`` of objective ``name``; unknown keys raise a TypeError."""
  known = {f.name for f in dataclasses.fields(CommonOptions)}
  unknown = sorted(set(options) - known)
  if unknown:
    raise TypeError(f"{name}() got unexpected keyword arguments {unknown}")
  return CommonOptions(**options)


class Batch(NamedTuple):
  """The uniform inputs of an objective (see ``losses`` module docstring for shapes)."""

  logp: jax.Array
  old_logp: jax.Array
  advantages: jax.Array
  completion_mask: jax.Array
  num_tokens: Any
  num_seqs: Any
  ref_logp: jax.Array | None = None
  sampler_logp: jax.Array | None = None
  entropy: jax.Array | None = None
  mean_log_softmax: jax.Array | None = None


def make_batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp=None,
               sampler_logp=None, entropy=None, mean_log_softmax=None) -> Batch:  # fmt: skip
  """Checks the shapes and returns a Batch of float32 [B, T] arrays with every masked entry set
  to 0, so padding (or NaN / -inf written there by a sampler or a failed reward) can never reach a
  value or a gradient (a `where` alone does not stop a NaN gradient, 0 * NaN = NaN)."""
  shape = check_batch(
    Batch(logp, old_logp, advantages, completion_mask, num_tokens, num_seqs, ref_logp,
          sampler_logp, entropy, mean_log_softmax)
  )  # fmt: skip
  valid = as_mask(completion_mask) > 0
  clean = lambda x: None if x is None else jnp.where(valid, jnp.asarray(x, jnp.float32), 0.0)
  return Batch(
    clean(logp), clean(old_logp), clean(token_advantages(advantages, shape)), completion_mask,
    num_tokens, num_seqs, clean(ref_logp), clean(sampler_logp), clean(entropy),
    clean(mean_log_softmax),
  )  # fmt: skip


def clean_input(batch: Batch, x: jax.Array, name: str) -> jax.Array:
  """An extra per-token input ([B, T], or [B] broadcast) checked and zeroed off the mask."""
  shape = check_tokens(logp=batch.logp, **{name: x}) if jnp.ndim(x) == 2 else jnp.shape(batch.logp)
  x = token_advantages(x, shape, name) if jnp.ndim(x) == 1 else jnp.asarray(x, jnp.float32)
  return jnp.where(as_mask(batch.completion_mask) > 0, x, 0.0)


def _active(coef) -> bool:
  """A coefficient is active unless it is a Python / concrete zero (tracers count as active)."""
  if isinstance(coef, jax.core.Tracer):
    return True
  return bool(np.any(np.asarray(coef) != 0))


def check_batch(batch: Batch) -> tuple[int, int]:
  shape = check_tokens(
    logp=batch.logp,
    old_logp=batch.old_logp,
    completion_mask=batch.completion_mask,
    ref_logp=batch.ref_logp,
    sampler_logp=batch.sampler_logp,
    entropy=batch.entropy,
    mean_log_softmax=batch.mean_log_softmax,
  )
  token_advantages(batch.advantages, shape)
  for name in ("num_tokens", "num_seqs"):
    if jnp.ndim(getattr(batch, name)) != 0:
      raise ValueError(f"{name} must be a scalar, got shape {jnp.shape(getattr(batch, name))}")
  return shape


def require(value, what: str, objective: str):
  if value is None:
    raise ValueError(f"{objective} needs {what}")
  return value


def run_objective(
  name: str,
  policy_fn: Callable[[jax.Array], tuple[jax.Array, dict]],
  batch: Batch,
  *,
  mode: str,
  opts: CommonOptions,
  token_weights: jax.Array | None = None,
  policy_num_tokens: Any = None,
  extra_metrics: dict | None = None,
) -> tuple[jax.Array, dict]:
  """Composes one objective and returns ``(loss, metrics)``.

  Args:
    name: the objective's name (for error messages).
    policy_fn: ``logp -> (per-token loss [B, T], clip info)``.
    batch: the uniform inputs.
    mode: aggregation mode of the policy term.
    opts: common options.
    token_weights: [B, T] constant weights (STEER, selections), applied after the mismatch weight.
    policy_num_tokens: N_tok of the policy term when it differs (``normalize_by='selected'``).
    extra_metrics: recipe-specific ``(value, weight)`` metrics.
  """
  shape = check_batch(batch)
  m = as_mask(batch.completion_mask)
  logp = jnp.asarray(batch.logp, jnp.float32)
  weights = jnp.ones(shape, jnp.float32) if token_weights is None else sg(token_weights)
  metrics = dict(extra_metrics or {})
  # 1. Sampler/trainer mismatch correction (constant weights, applied after clipping).
  if batch.sampler_logp is not None:
    gap = jnp.abs(sg(logp) - batch.sampler_logp)
    metrics["mismatch/abs_logp_diff/mean"] = mean_metric(gap, m)
    metrics["mismatch/abs_logp_diff/max"] = max_metric(gap, m)
    if opts.mismatch != "none":
      w = mismatch_weights(
        batch.old_logp, batch.sampler_logp, m, mode=opts.mismatch, low=opts.mismatch_low,
        high=opts.mismatch_high,
      )  # fmt: skip
      metrics["mismatch/weight_mean"] = mean_metric(w, m)
      metrics["mismatch/weight_sq_mean"] = mean_metric(w * w, m)
      metrics["mismatch/masked_frac"] = mean_metric((w == 0).astype(jnp.float32), m)
      weights = weights * w
    if opts.opsm_threshold is not None:
      keep = opsm_mask(
        logp, batch.sampler_logp, batch.advantages, m, threshold=opts.opsm_threshold
      ).astype(jnp.float32)
      metrics["mismatch/opsm_masked_frac"] = mean_metric(1.0 - keep, m)
      weights = weights * keep
  elif opts.mismatch != "none" or opts.opsm_threshold is not None:
    raise ValueError(f"{name}: mismatch={opts.mismatch!r} / opsm needs sampler_logp")
  if opts.mismatch not in MISMATCH_MODES:
    raise ValueError(f"mismatch={opts.mismatch!r} is not one of {MISMATCH_MODES}")

  # 2. Policy term.
  per_token, info = policy_fn(logp)
  policy = aggregate(
    per_token * weights,
    m,
    mode=mode,
    num_tokens=batch.num_tokens if policy_num_tokens is None else policy_num_tokens,
    num_seqs=batch.num_seqs,
    seq_norm_constant=opts.seq_norm_constant,
  )
  total = policy
  local_tokens = jnp.sum(m)
  loss_metric = lambda x: (jnp.asarray(x * batch.num_tokens, jnp.float32), local_tokens)
  metrics["loss/policy"] = loss_metric(policy)

  # 3. Regularisers, each a token mean over the policy's token set with N_tok.
  if batch.ref_logp is not None:
    for est in ("k1", "k2", "k3"):
      value = regularizers.kl_estimate(sg(logp), batch.ref_logp, estimator=est)
      metrics[f"kl/{est}"] = mean_metric(value, m)
  if _active(opts.kl_coef):
    ref_logp = require(batch.ref_logp, "ref_logp for kl_coef != 0", name)
    kl, clamped = regularizers.kl_penalty(
      logp, ref_logp, value=opts.kl_value, grad=opts.kl_grad, clamp=opts.kl_clamp,
      old_logp=batch.old_logp,
    )  # fmt: skip
    kl_loss = opts.kl_coef * safe_div(masked_sum(kl, m), batch.num_tokens)
    metrics["kl/clamp_frac"] = mean_metric(clamped.astype(jnp.float32), m)
    metrics["loss/kl"] = loss_metric(kl_loss)
    total = total + kl_loss
  if batch.entropy is not None:
    metrics["entropy/mean"] = mean_metric(sg(batch.entropy), m)
  if _active(opts.entropy_coef):
    entropy = require(batch.entropy, "a differentiable entropy for entropy_coef != 0", name)
    ent_loss = regularizers.entropy_bonus(
      entropy, m, coef=opts.entropy_coef, num_tokens=batch.num_tokens
    )
    metrics["loss/entropy"] = loss_metric(ent_loss)
    total = total + ent_loss
  metrics["loss/total"] = loss_metric(total)
  metrics.update(_policy_metrics(policy_fn, logp, batch, m, weights, info, opts))
  return total, metrics


def _policy_metrics(policy_fn, logp, batch, m, weights, info, opts) -> dict:
  """Ratio, clip fractions, KL to the old policy and the fraction of tokens carrying gradient."""
  delta = log_ratio(sg(logp), batch.old_logp)
  ratio = jnp.exp(delta)
  out = {
    "ratio/mean": mean_metric(ratio, m),
    "ratio/min": min_metric(ratio, m),
    "ratio/max": max_metric(ratio, m),
    "kl_old/k1": mean_metric(-delta, m),
    "kl_old/k3": mean_metric(jnp.exp(delta) - 1.0 - delta, m),
    "advantage/mean": mean_metric(token_advantages(batch.advantages, m.shape), m),
  }
  for side in ("low", "high", "dual"):
    out[f"clip_frac/{side}"] = mean_metric(info[side].astype(jnp.float32), m)
  # d(sum_t m l w)/d logp, evaluated at sg(logp): nonzero exactly where a token carries gradient
  # of the policy term (elementwise work only; the recipe's clipping / selection decide it).
  _, vjp = jax.vjp(lambda lp: policy_fn(lp)[0] * weights, sg(logp))
  carries = (vjp(m)[0] != 0) & (m > 0)
  out["grad_frac/tokens"] = mean_metric(carries.astype(jnp.float32), m)
  if opts.group_size is not None:
    groups = check_group_size(m.shape[0], opts.group_size)
    per_group = lambda x: jnp.any(replicated(x).reshape(groups, -1) > 0, axis=-1).astype(
      jnp.float32
    )
    valid_groups = per_group(m)
    out["grad_frac/groups"] = mean_metric(per_group(carries) * valid_groups, valid_groups)
  return out
