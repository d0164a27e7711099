"""Shape checks, masked reductions, loss aggregation and mergeable metrics for the losses.

Everything here is re-exported by :mod:`rlvr_jax.losses`; import it from there.

Aggregation follows METHODS.md §1.2: a micro-batch returns its *partial* loss, normalised by the
GLOBAL counts of the step batch (``num_tokens``, ``num_seqs``), so the step loss is the plain sum of
the partials over micro-batches and data-parallel shards.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp

AGGREGATION_MODES = (
  "token_mean",
  "token_sum",
  "seq_mean_token_mean",
  "seq_mean_token_sum",
  "seq_mean_token_sum_norm",
)

LOG_RATIO_CLAMP = 20.0  # |logp - old_logp| is clamped to this before exp (METHODS.md §1.1).

# ----------------------------------------------------------------------------------------------
# Shape checks (trace time; the messages name the shapes).


def check_tokens(**arrays: jax.Array | None) -> tuple[int, int]:
  """Checks that every non-None array is rank 2 and that all share one ``[B, T]`` shape.

  Returns:
    ``(B, T)``.

  Raises:
    ValueError: naming every argument with its shape when ranks or shapes disagree.
  """
  present = {k: v for k, v in arrays.items() if v is not None}
  shapes = {k: tuple(jnp.shape(v)) for k, v in present.items()}
  described = ", ".join(f"{k}{list(s)}" for k, s in shapes.items())
  for k, s in shapes.items():
    if len(s) != 2:
      raise ValueError(f"{k} must be [B, T] (rank 2), got shape {list(s)}; arguments: {described}")
  if len(set(shapes.values())) > 1:
    raise ValueError(f"per-token arrays must share one [B, T] shape, got {described}")
  return next(iter(shapes.values()))


def token_advantages(
  advantages: jax.Array, shape: tuple[int, int], name: str = "advantages"
) -> jax.Array:
  """Returns float32 ``[B, T]`` advantages from ``[B, T]`` or per-sequence ``[B]`` input."""
  advantages = jnp.asarray(advantages, jnp.float32)
  if advantages.shape == (shape[0],):
    return jnp.broadcast_to(advantages[:, None], shape)
  if advantages.shape != tuple(shape):
    raise ValueError(
      f"{name} must be [B, T] = {list(shape)} or [B] = [{shape[0]}], "
      f"got shape {list(advantages.shape)}"
    )
  return advantages


def as_mask(mask: jax.Array) -> jax.Array:
  """A float32 0/1 copy of a bool (or 0/1 numeric) mask."""
  mask = jnp.asarray(mask)
  if mask.dtype != jnp.bool_:
    mask = mask != 0
  return mask.astype(jnp.float32)


def check_group_size(num_rows: int, group_size: int) -> int:
  """Number of groups; raises if ``group_size`` does not divide the number of rows."""
  if group_size < 1 or num_rows % group_size:
    raise ValueError(f"group_size G={group_size} must divide the batch: B={num_rows} rows")
  return num_rows // group_size


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
  if value not in choices:
    raise ValueError(f"{name}={value!r} is not one of {choices}")


# ----------------------------------------------------------------------------------------------
# Safe arithmetic and masked statistics.


def safe_div(num: jax.Array, den: jax.Array) -> jax.Array:
  """num / den, and 0 where den == 0, with finite gradients (the double-where trick)."""
  den = jnp.asarray(den, jnp.float32)
  ok = den != 0
  return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


def log_ratio(logp: jax.Array, old_logp: jax.Array, clamp: float = LOG_RATIO_CLAMP) -> jax.Array:
  """delta = clip(logp - old_logp, -clamp, clamp), float32 ``[B, T]``."""
  delta = jnp.asarray(logp, jnp.float32) - jnp.asarray(old_logp, jnp.float32)
  return jnp.clip(delta, -clamp, clamp)


def masked_sum(x: jax.Array, mask: jax.Array, axis=None) -> jax.Array:
  # where (not multiply) so that inf/nan on padding cannot leak into the sum.
  return jnp.sum(jnp.where(mask > 0, x * mask, 0.0), axis=axis)


def masked_mean(x: jax.Array, mask: jax.Array, axis=None) -> jax.Array:
  """Mean of ``x`` over ``mask`` (0 where the mask is empty)."""
  return safe_div(masked_sum(x, mask, axis), jnp.sum(mask, axis=axis))


def sequence_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  """Per-row masked mean over T: ``[B, T] -> [B]`` (0 for rows without valid tokens)."""
  return masked_mean(x, mask, axis=-1)


def replicated(x: jax.Array) -> jax.Array:
  """``x`` resharded to fully replicated when it is sharded over explicit mesh axes, else ``x``.

  Sorting along, or regrouping, a dimension that is sharded over an ``Explicit`` axis is a type
  error; the arrays this is used on are small (per-token scalars of the loss).
  """
  spec = getattr(getattr(jax.typeof(x), "sharding", None), "spec", None)
  if spec is not None and any(p is not None for p in spec):
    return jax.sharding.reshard(x, jax.sharding.PartitionSpec())
  return x


def kth_largest(values: jax.Array, valid: jax.Array, k: jax.Array) -> jax.Array:
  """The k-th largest of ``values`` over ``valid`` (exact, by a sort of the flattened array).

  ``k`` may be traced. Returns -inf when ``k`` exceeds the number of valid entries (so that
  ``values >= threshold`` then selects every valid entry) or when nothing is valid.
  Under ``jax.jit`` with sharded inputs the sort runs over the global array, so the threshold is
  exact at the scope of the arrays passed in.
  """
  flat = replicated(jnp.where(valid > 0, values, -jnp.inf).astype(jnp.float32)).reshape(-1)
  ordered = -jnp.sort(-flat)
  k = jnp.asarray(k, jnp.int32)
  picked = ordered[jnp.clip(k - 1, 0, flat.shape[0] - 1)]
  return jnp.where((k >= 1) & (k <= jnp.sum(valid > 0)), picked, -jnp.inf)


def kth_smallest(values: jax.Array, valid: jax.Array, k: jax.Array) -> jax.Array:
  """The k-th smallest over ``valid``; +inf when ``k`` exceeds the valid count."""
  return -kth_largest(-values, valid, k)


# ----------------------------------------------------------------------------------------------
# Aggregation (METHODS.md §1.2).


def aggregate(
  per_token_loss: jax.Array,
  completion_mask: jax.Array,
  *,
  mode: str,
  num_tokens: jax.Array | float,
  num_seqs: jax.Array | float,
  seq_norm_constant: float | None = None,
) -> jax.Array:
  """Partial loss of this micro-batch under a global normaliser (METHODS.md §1.2).

  With m the mask, n_b = sum_t m and l the per-token loss (rows with n_b = 0 contribute 0):

  * ``token_mean``:              sum_b sum_t m l / N_tok
  * ``seq_mean_token_mean``:     sum_b (sum_t m l / n_b) / N_seq
  * ``seq_mean_token_sum``:      sum_b sum_t m l / N_seq
  * ``seq_mean_token_sum_norm``: sum_b sum_t m l / (N_seq * C), C = ``seq_norm_constant`` (required;
    e.g. the maximum response length; Dr.GRPO arXiv 2503.20783)
  * ``token_sum``:               sum_b sum_t m l (no normaliser: verl ``token-sum``; the loss and
    the gradient grow with the number of tokens, so scale the learning rate with the batch)

  Args:
    per_token_loss: [B, T] float32 (already multiplied by any token weights).
    completion_mask: [B, T] bool or 0/1 (n_b is counted from it).
    mode: one of ``AGGREGATION_MODES``.
    num_tokens: N_tok, the number of loss tokens of the whole STEP batch (scalar).
    num_seqs: N_seq, the number of rows with n_b > 0 in the whole STEP batch (scalar).
    seq_norm_constant: C for ``seq_mean_token_sum_norm``, a run constant.

  Returns:
    scalar float32; summing it over micro-batches / shards gives the step loss exactly. A zero
    normaliser gives 0 with finite gradients.
  """
  check_choice("loss aggregation mode", mode, AGGREGATION_MODES)
  check_tokens(per_token_loss=per_token_loss, completion_mask=completion_mask)
  m = as_mask(completion_mask)
  rows = masked_sum(jnp.asarray(per_token_loss, jnp.float32), m, axis=-1)
  if mode == "token_mean":
    return safe_div(jnp.sum(rows), num_tokens)
  if mode == "token_sum":
    return jnp.sum(rows)
  if mode == "seq_mean_token_mean":
    return safe_div(jnp.sum(safe_div(rows, jnp.sum(m, axis=-1))), num_seqs)
  if mode == "seq_mean_token_sum":
    return safe_div(jnp.sum(rows), num_seqs)
  if seq_norm_constant is None or not seq_norm_constant > 0:
    raise ValueError(
      "seq_mean_token_sum_norm needs a positive run constant seq_norm_constant (e.g. the maximum "
      f"response length), got {seq_norm_constant!r}"
    )
  return safe_div(jnp.sum(rows), jnp.asarray(num_seqs, jnp.float32) * seq_norm_constant)


# ----------------------------------------------------------------------------------------------
# Metrics as (value, weight) pairs that merge exactly over micro-batches.

Metrics = dict[str, tuple[jax.Array, jax.Array]]


def _pair(value, weight) -> tuple[jax.Array, jax.Array]:
  return jnp.asarray(value, jnp.float32), jnp.asarray(weight, jnp.float32)


def mean_metric(x: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(sum over mask, count)``: a mean-type metric."""
  return _pair(masked_sum(x, mask), jnp.sum(mask))


def min_metric(x: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  return _pair(jnp.min(jnp.where(mask > 0, x, jnp.inf)), jnp.sum(mask))


def max_metric(x: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  return _pair(jnp.max(jnp.where(mask > 0, x, -jnp.inf)), jnp.sum(mask))


def _reducer(key: str):
  if key.endswith("/min"):
    return jnp.minimum
  if key.endswith("/max"):
    return jnp.maximum
  return jnp.add


def merge_metrics(a: Mapping, b: Mapping) -> Metrics:
  """Merges two metric dicts of ``(value, weight)`` pairs exactly.

  Mean-type keys add values (sums) and weights (counts); keys ending in ``/min`` or ``/max`` take
  the min or max of the values and add the weights. A key present in only one dict is copied.
  Works inside ``jax.jit`` and on host scalars.
  """
  out = dict(a)
  for key, (value, weight) in b.items():
    if key in out:
      v0, w0 = out[key]
      out[key] = (_reducer(key)(v0, value), w0 + weight)
    else:
      out[key] = (value, weight)
  return out


def finalize_metrics(metrics: Mapping) -> dict[str, jax.Array]:
  """Turns ``(value, weight)`` pairs into plain float32 numbers.

  Mean-type: value / weight; ``/min`` and ``/max``: the value. A metric with weight 0 (nothing to
  average, e.g. no valid token) reads 0. If both ``mismatch/weight_mean`` and
  ``mismatch/weight_sq_mean`` are present, the effective sample size ratio
  ``mismatch/ess = mean(w)^2 / mean(w^2)`` is added.
  """
  out = {}
  for key, (value, weight) in metrics.items():
    value = jnp.asarray(value, jnp.float32)
    weight = jnp.asarray(weight, jnp.float32)
    if key.endswith(("/min", "/max")):
      out[key] = jnp.where(weight > 0, value, 0.0)
    else:
      out[key] = safe_div(value, weight)
  if "mismatch/weight_mean" in out and "mismatch/weight_sq_mean" in out:
    out["mismatch/ess"] = safe_div(out["mismatch/weight_mean"] ** 2, out["mismatch/weight_sq_mean"])
  return out
