"""Shared pieces of the advantage estimators: shape checks, masks, masked statistics.

Private helpers of :mod:`rlvr_jax.advantages` (its ``__init__`` re-exports the public ones).
Shapes follow the glossary in :mod:`rlvr_jax.types`: rewards are ``[P, G]`` with row ``b`` of the
flat batch being sample ``b % G`` of prompt ``b // G``.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

Scope = str  # "group" | "rollout" | "none"; see METHODS.md §1.3.


# ----------------------------------------------------------------------------- shape checks


def check_rank(name: str, x: jax.Array, rank: int, dims: str) -> None:
  """Raises ValueError at trace time if ``x`` does not have ``rank`` dimensions."""
  if jnp.ndim(x) != rank:
    raise ValueError(
      f"{name} must have rank {rank} with shape [{dims}], got shape {tuple(jnp.shape(x))}."
    )


def check_same_shape(names: Sequence[str], arrays: Sequence[jax.Array | None]) -> None:
  """Raises ValueError if the given (non-None) arrays do not all share one shape."""
  pairs = [(n, tuple(jnp.shape(a))) for n, a in zip(names, arrays, strict=True) if a is not None]
  if len({s for _, s in pairs}) > 1:
    listing = ", ".join(f"{n}{list(s)}" for n, s in pairs)
    raise ValueError(f"Shapes must match: {listing}.")


def check_choice(name: str, value: str, choices: Sequence[str]) -> None:
  if value not in choices:
    raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}.")


def check_grouped(name: str, x: jax.Array, num_rows: int, group_size: int, dims: str) -> None:
  """Checks that a flat ``[B, ...]`` array matches ``P * G`` rows."""
  if jnp.shape(x)[0] != num_rows:
    raise ValueError(
      f"{name} has shape {tuple(jnp.shape(x))} [{dims}] but the grouped input implies "
      f"B = P * G = {num_rows // group_size} * {group_size} = {num_rows} rows."
    )


# ----------------------------------------------------------------------------- masks


def valid_mask(rewards: jax.Array, valid: jax.Array | None = None) -> jax.Array:
  """Samples whose reward may enter statistics: finite and (if given) marked valid.

  A NaN reward means the reward computation failed; such a sample is excluded from every
  statistic and gets advantage 0, it is never treated as reward 0.

  Args:
    rewards: [P, G] (or any shape) float rewards, NaN where the reward failed.
    valid: optional bool mask of the same shape (False = drop the sample).

  Returns:
    bool mask of the shape of ``rewards``.
  """
  check_same_shape(("rewards", "valid"), (rewards, valid))
  mask = jnp.isfinite(rewards)
  if valid is not None:
    mask = mask & valid.astype(bool)
  return mask


def prepare(rewards: jax.Array, valid: jax.Array | None) -> tuple[jax.Array, jax.Array]:
  """Checks ``[P, G]`` rewards; returns float32 rewards with invalid entries zeroed, and the mask."""
  check_rank("rewards", rewards, 2, "P, G")
  mask = valid_mask(rewards, valid)
  # Zero invalid entries first: NaN * 0 is NaN, so masks alone would not protect the sums.
  return jnp.where(mask, rewards, 0.0).astype(jnp.float32), mask


# ----------------------------------------------------------------------------- statistics


def replicated(x: jax.Array) -> jax.Array:
  """Gathers an array sharded over Explicit mesh axes, for global sorts of small arrays.

  With sharding in types (``jax.make_mesh`` defaults to Explicit axes) a sort along a sharded
  dimension is a type error; under Auto axes or without a mesh this is the identity.
  """
  sharding = getattr(jax.typeof(x), "sharding", None)
  if sharding is None or sharding.mesh.empty or all(s is None for s in sharding.spec):
    return x
  return jax.sharding.reshard(x, jax.sharding.NamedSharding(sharding.mesh, PartitionSpec()))


def _psum(x: jax.Array, axis_name: str | None) -> jax.Array:
  return x if axis_name is None else jax.lax.psum(x, axis_name)


def safe_div(num: jax.Array, den: jax.Array) -> jax.Array:
  """num / den where den != 0, else 0 (double where keeps gradients finite)."""
  ok = den != 0
  return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


def safe_sqrt(x: jax.Array) -> jax.Array:
  """sqrt(max(x, 0)) with a finite gradient at 0 (double where)."""
  pos = x > 0
  return jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0)


def group_mean_std(
  values: jax.Array, mask: jax.Array, *, ddof: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Masked mean, std (with ``ddof``) and count over the last axis, keepdims.

  The std is 0 where fewer than ``ddof + 1`` entries are valid.
  """
  count = jnp.sum(mask, axis=-1, keepdims=True).astype(jnp.float32)
  mean = safe_div(jnp.sum(jnp.where(mask, values, 0.0), axis=-1, keepdims=True), count)
  sq = jnp.sum(jnp.where(mask, jnp.square(values - mean), 0.0), axis=-1, keepdims=True)
  var = safe_div(sq, jnp.maximum(count - ddof, 0.0))
  return mean, safe_sqrt(var), count


def batch_mean_std(
  values: jax.Array, mask: jax.Array, *, ddof: int, axis_name: str | None = None
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Masked mean, std (with ``ddof``) and count over ALL entries (rollout scope).

  Under ``jax.jit`` with sharded inputs the reductions are global by construction; inside
  ``jax.shard_map`` pass the mesh ``axis_name`` so the sums are ``psum``-ed over the shards.
  Two passes (mean, then squared deviations) for accuracy.
  """
  count = _psum(jnp.sum(mask).astype(jnp.float32), axis_name)
  mean = safe_div(_psum(jnp.sum(jnp.where(mask, values, 0.0)), axis_name), count)
  sq = _psum(jnp.sum(jnp.where(mask, jnp.square(values - mean), 0.0)), axis_name)
  var = safe_div(sq, jnp.maximum(count - ddof, 0.0))
  return mean, safe_sqrt(var), count


def masked_whiten(
  values: jax.Array,
  mask: jax.Array,
  *,
  std_ddof: int = 1,
  epsilon: float = 1e-8,
  axis_name: str | None = None,
) -> jax.Array:
  """Token-weighted whitening over every valid entry: (x - mean) / sqrt(var + epsilon).

  This is verl's ``masked_whiten`` (shift the mean too). The statistic has rollout scope: pass
  the whole rollout batch (or its shards with ``axis_name``). Masked entries return 0.

  Args:
    values: [B, T] (any shape) float values.
    mask: bool mask of the same shape.
    std_ddof: degrees of freedom of the variance (1 = unbiased, as verl).
    epsilon: added to the variance (paper/verl: 1e-8).
    axis_name: mesh axis to reduce over inside ``shard_map``.

  Returns:
    float32 array of the shape of ``values``.
  """
  check_same_shape(("values", "mask"), (values, mask))
  mask = mask.astype(bool)
  values = jnp.where(mask, values, 0.0).astype(jnp.float32)
  mean, std, _ = batch_mean_std(values, mask, ddof=std_ddof, axis_name=axis_name)
  out = (values - mean) * jax.lax.rsqrt(jnp.square(std) + epsilon)
  return jnp.where(mask, out, 0.0)


# ----------------------------------------------------------------------------- layout helpers


def to_groups(x: jax.Array, *, group_size: int) -> jax.Array:
  """Reshapes a flat group-ordered ``[B, ...]`` array into ``[P, G, ...]``.

  Raises:
    ValueError: if ``group_size`` does not divide B.
  """
  if jnp.ndim(x) < 1:
    raise ValueError(f"Expected a [B, ...] array, got shape {tuple(jnp.shape(x))}.")
  num_rows = jnp.shape(x)[0]
  if group_size < 1 or num_rows % group_size:
    raise ValueError(
      f"group_size G = {group_size} does not divide the batch B = {num_rows} "
      f"(array shape {tuple(jnp.shape(x))})."
    )
  return jnp.reshape(x, (num_rows // group_size, group_size) + tuple(jnp.shape(x)[1:]))


def to_tokens(advantages: jax.Array, completion_mask: jax.Array) -> jax.Array:
  """Broadcasts sequence advantages ``[P, G]`` (or ``[B]``) to tokens ``[B, T]`` times the mask.

  A_{b,t} = A_b * m_{b,t}. The result is a constant for the loss (the trainer stop-gradients it).

  Args:
    advantages: [P, G] group-ordered (row b = prompt b // G, sample b % G) or flat [B].
    completion_mask: [B, T] bool/0-1 mask of generated tokens.

  Returns:
    [B, T] float32 advantages, 0 where the mask is 0.
  """
  check_rank("completion_mask", completion_mask, 2, "B, T")
  if jnp.ndim(advantages) not in (1, 2):
    raise ValueError(
      f"advantages must have shape [P, G] or [B], got {tuple(jnp.shape(advantages))}."
    )
  flat = jnp.reshape(advantages, (-1,))
  if flat.shape[0] != completion_mask.shape[0]:
    raise ValueError(
      f"advantages of shape {tuple(jnp.shape(advantages))} hold {flat.shape[0]} rows but "
      f"completion_mask has shape {tuple(completion_mask.shape)} [B, T]: need P * G == B."
    )
  return flat.astype(jnp.float32)[:, None] * completion_mask.astype(jnp.float32)


# ----------------------------------------------------------------------------- zero variance


def zero_variance_groups(
  outcomes: jax.Array, *, valid: jax.Array | None = None, atol: float = 0.0
) -> jax.Array:
  """Groups whose outcome is constant over their valid samples (METHODS.md §2.11).

  Pass the *outcome* (verifier correctness), not the shaped reward: with length or overlong
  shaping the shaped reward varies even when every answer is wrong ("phantom advantage").
  Groups with fewer than 2 valid samples count as zero-variance (no baseline information).

  Args:
    outcomes: [P, G] float outcomes (NaN = failed, excluded).
    valid: optional [P, G] bool mask.
    atol: outcomes within ``atol`` of each other count as equal.

  Returns:
    [P] bool, True for zero-variance groups.
  """
  outcomes, mask = prepare(outcomes, valid)
  hi = jnp.max(jnp.where(mask, outcomes, -jnp.inf), axis=-1)
  lo = jnp.min(jnp.where(mask, outcomes, jnp.inf), axis=-1)
  return (jnp.sum(mask, axis=-1) < 2) | (hi - lo <= atol)


def handle_zero_variance(
  advantages: jax.Array, zero_variance: jax.Array, *, handling: str = "mask"
) -> tuple[jax.Array, jax.Array]:
  """Applies the zero-variance policy of METHODS.md §2.11 to sequence advantages.

  * ``keep``: zero-variance groups get A = 0 but their rows stay in the loss normalisers.
  * ``mask``: A = 0 and the rows are dropped: multiply the completion mask by the returned
    ``row_mask`` BEFORE computing N_tok / N_seq (also removes their KL/entropy terms).

  (``refill``, ``global`` and ``hint`` live in the loop / COPO / GHPO, not here.)

  Args:
    advantages: [P, G] sequence advantages.
    zero_variance: [P] bool, from :func:`zero_variance_groups`.
    handling: "keep" or "mask".

  Returns:
    (advantages [P, G] with zero-variance groups set to 0, row_mask [P, G] bool).
  """
  check_rank("advantages", advantages, 2, "P, G")
  check_rank("zero_variance", zero_variance, 1, "P")
  check_choice("handling", handling, ("keep", "mask"))
  if zero_variance.shape[0] != advantages.shape[0]:
    raise ValueError(
      f"zero_variance has shape {tuple(zero_variance.shape)} [P] but advantages have shape "
      f"{tuple(advantages.shape)} [P, G]."
    )
  zv = zero_variance[:, None]
  advantages = jnp.where(zv, 0.0, advantages)
  row_mask = jnp.broadcast_to(~zv if handling == "mask" else True, advantages.shape)
  return advantages, row_mask


def gradient_group_fraction(
  outcomes: jax.Array, *, valid: jax.Array | None = None, atol: float = 0.0
) -> jax.Array:
  """Fraction of groups that carry gradient (non-zero outcome variance); a float32 scalar.

  ``1 - gradient_group_fraction`` is the ``zero_var_frac`` every run should log (§2.11).
  """
  zero_var = zero_variance_groups(outcomes, valid=valid, atol=atol)
  return 1.0 - jnp.mean(zero_var.astype(jnp.float32))


def zero_variance_metrics(
  outcomes: jax.Array, *, valid: jax.Array | None = None, atol: float = 0.0
) -> dict[str, tuple[jax.Array, jax.Array]]:
  """Mergeable ``(sum, count)`` metrics: ``groups/zero_var_frac`` and ``groups/grad_frac``."""
  zero_var = zero_variance_groups(outcomes, valid=valid, atol=atol).astype(jnp.float32)
  count = jnp.asarray(zero_var.shape[0], jnp.float32)
  num_zero = jnp.sum(zero_var)
  return {"groups/zero_var_frac": (num_zero, count), "groups/grad_frac": (count - num_zero, count)}
