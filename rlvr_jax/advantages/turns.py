"""Turn-level credit for multi-turn episodes: returns and advantages over turns (AGENTS.md §2).

Part of ``rlvr_jax.advantages``.

Pure functions of arrays (jax only). Shapes follow :mod:`rlvr_jax.types` plus K = turns:

  * ``rewards`` / per-turn values ``[B, K]``: row ``b`` is sample ``b % G`` of prompt ``b // G``
    (group ordered, as everywhere in the repo); column ``k`` is turn ``k + 1``. A turn that the
    rollout did not reach, or whose reward failed, is NaN: it is *missing*, never 0.
  * ``turn_index`` ``[B, T]`` int: ``k`` (1-based) on the action tokens of turn ``k``, 0 on prompt,
    observation and padding tokens (built host-side by ``rlvr_jax.envs.episode``).

Every advantage here is 0 on missing turns and, like the sequence estimators, a constant for the
loss (the trainer applies ``jax.lax.stop_gradient``). Statistics follow the conventions of
``advantages.group``: unbiased std (ddof 1) plus ``epsilon`` = 1e-6, and a statistic over fewer
than ``min_count`` members (default 2) or over equal values gives exactly 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_MODES = ("final", "sum")


# ----------------------------------------------------------------------------- helpers


def _check_turns(name: str, x: jax.Array) -> None:
  if jnp.ndim(x) != 2:
    raise ValueError(f"{name} must have rank 2 with shape [B, K], got shape {tuple(jnp.shape(x))}.")


def _grouped(name: str, x: jax.Array, group_size: int) -> jax.Array:
  """[B, K] -> [P, G, K]; checks that G divides B."""
  _check_turns(name, x)
  num_rows = jnp.shape(x)[0]
  if group_size < 1 or num_rows % group_size:
    raise ValueError(
      f"group_size G = {group_size} does not divide the batch B = {num_rows} "
      f"({name} shape {tuple(jnp.shape(x))})."
    )
  return jnp.reshape(x, (num_rows // group_size, group_size, jnp.shape(x)[1]))


def _mask(x: jax.Array, valid: jax.Array | None) -> jax.Array:
  mask = jnp.isfinite(x)
  if valid is not None:
    if jnp.shape(valid) != jnp.shape(x):
      raise ValueError(f"Shapes must match: x{list(jnp.shape(x))}, valid{list(jnp.shape(valid))}.")
    mask = mask & valid.astype(bool)
  return mask


def _safe_div(num: jax.Array, den: jax.Array) -> jax.Array:
  """num / den where den != 0, else 0 (double where keeps gradients finite)."""
  ok = den != 0
  return jnp.where(ok, num / jnp.where(ok, den, 1.0), 0.0)


def _safe_sqrt(x: jax.Array) -> jax.Array:
  pos = x > 0
  return jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0)


def _mean_std(x: jax.Array, mask: jax.Array, axis, ddof: int):
  """Masked mean, std (ddof) and count over ``axis`` (keepdims); two passes for accuracy."""
  count = jnp.sum(mask, axis=axis, keepdims=True).astype(jnp.float32)
  mean = _safe_div(jnp.sum(jnp.where(mask, x, 0.0), axis=axis, keepdims=True), count)
  sq = jnp.sum(jnp.where(mask, jnp.square(x - mean), 0.0), axis=axis, keepdims=True)
  return mean, _safe_sqrt(_safe_div(sq, jnp.maximum(count - ddof, 0.0))), count


def _reached_count(mask: jax.Array) -> jax.Array:
  """[B] number of reached (finite) turns of each row."""
  return jnp.sum(mask, axis=-1)


# ----------------------------------------------------------------------------- returns


def discounted_turn_returns(rewards: jax.Array, *, gamma: float = 1.0) -> jax.Array:
  """Discounted return from each turn on: G_{i,k} = sum_{k' >= k} gamma^{k'-k} r_{i,k'}.

  Missing turns (NaN) add nothing and get a NaN return, so the result can feed the normalisers
  below directly. Golden (AGENTS.md §2): r = [0, 0.5, 1], gamma = 0.9 -> [1.26, 1.4, 1.0].

  Args:
    rewards: [B, K] per-turn rewards, NaN where missing.
    gamma: discount over turns (gamma in the papers; MatchTIR's lambda).

  Returns:
    [B, K] float32 returns, NaN where ``rewards`` is NaN.
  """
  _check_turns("rewards", rewards)
  rewards = jnp.asarray(rewards, jnp.float32)
  mask = jnp.isfinite(rewards)
  r = jnp.where(mask, rewards, 0.0)
  k = jnp.arange(jnp.shape(r)[1])
  lag = k[:, None] - k[None, :]  # [k', k] = k' - k
  weights = jnp.where(lag >= 0, jnp.float32(gamma) ** jnp.maximum(lag, 0), 0.0)
  returns = jnp.einsum("bj,jk->bk", r, weights, precision=jax.lax.Precision.HIGHEST)
  return jnp.where(mask, returns, jnp.nan)


def episode_return(rewards: jax.Array, *, mode: str = "final") -> jax.Array:
  """Episode return R_i from per-turn rewards: the last reached turn's reward or their sum.

  ``mode="final"``: R_i = r_{i, K_i} (outcome rewards carried by the final turn); ``"sum"``:
  R_i = sum_k r_{i,k}. Rows with no finite reward get NaN (excluded by every estimator), so the
  existing GRPO family runs on ``R.reshape(P, G)``.

  Shapes: rewards [B, K] -> [B] float32.
  """
  _check_turns("rewards", rewards)
  if mode not in _MODES:
    raise ValueError(f"mode must be one of {_MODES}, got {mode!r}.")
  rewards = jnp.asarray(rewards, jnp.float32)
  mask = jnp.isfinite(rewards)
  any_ok = jnp.any(mask, axis=-1)
  if mode == "sum":
    value = jnp.sum(jnp.where(mask, rewards, 0.0), axis=-1)
  else:
    last = jnp.shape(rewards)[1] - 1 - jnp.argmax(mask[:, ::-1], axis=-1)
    value = jnp.take_along_axis(rewards, last[:, None], axis=-1)[:, 0]
  return jnp.where(any_ok, value, jnp.nan)


def geometric_outcome_credit(
  outcome: jax.Array, reached: jax.Array, *, gamma: float = 0.9
) -> jax.Array:
  """EAPO-style geometric credit [recon]: turn t of an episode of K_i turns gets gamma^{K_i-t} R_i.

  Shorter successful episodes credit their turns more. Turns not reached are NaN.

  Args:
    outcome: [B] outcome rewards R_i (NaN: failed).
    reached: [B, K] bool, True on the turns the episode reached (a prefix of each row).
    gamma: per-turn discount.

  Returns:
    [B, K] float32 per-turn rewards, NaN on turns not reached.
  """
  _check_turns("reached", reached)
  reached = reached.astype(bool)
  num_turns = _reached_count(reached)[:, None].astype(jnp.float32)
  t = jnp.arange(1, jnp.shape(reached)[1] + 1, dtype=jnp.float32)[None, :]
  credit = jnp.float32(gamma) ** jnp.maximum(num_turns - t, 0.0) * jnp.asarray(outcome)[:, None]
  return jnp.where(reached, credit.astype(jnp.float32), jnp.nan)


def gated_return(
  outcome: jax.Array, step_rewards: jax.Array, *, threshold: float = 1.0
) -> jax.Array:
  """G-RA gated return: R = R_high + 1[R_high >= theta] * sum_k r_k^imm.

  Dense step rewards count only once the outcome clears ``threshold`` (theta), so they cannot be
  farmed by failing episodes. Missing step rewards (NaN) add 0; a NaN outcome stays NaN.

  Shapes: outcome [B], step_rewards [B, K] -> [B] float32.
  """
  _check_turns("step_rewards", step_rewards)
  outcome = jnp.asarray(outcome, jnp.float32)
  dense = jnp.sum(jnp.where(jnp.isfinite(step_rewards), step_rewards, 0.0), axis=-1)
  return outcome + jnp.where(outcome >= threshold, dense, 0.0).astype(jnp.float32)


# ----------------------------------------------------------------------------- advantages


def turn_group_normalize(
  values: jax.Array,
  *,
  group_size: int,
  valid: jax.Array | None = None,
  use_std: bool = False,
  std_ddof: int = 1,
  epsilon: float = 1e-6,
  min_count: int = 2,
) -> jax.Array:
  """Per-turn-index group normalisation: the one shared primitive of CM2 / MatchTIR / A2TGPO / MAPO.

    A_{i,k} = (x_{i,k} - mean_{j reached k} x_{j,k}) [/ (std_{j reached k} x_{j,k} + epsilon)]

  over the rollouts j of the group (same prompt) that reached turn k (x finite and ``valid``).
  Turn positions reached by fewer than ``min_count`` rollouts, and positions whose values are all
  equal, get exactly 0 (no 0/0; CM2 zeroes positions reached by <= 4 rollouts: ``min_count=5``).
  x is per-turn rewards r or returns G (``discounted_turn_returns``).
  Golden (AGENTS.md §2): r = [[1, 0, 1], [0, 1, -], [1, 1, 0]] ->
  [[1/3, -2/3, 1/2], [-2/3, 1/3, 0], [1/3, 1/3, -1/2]].

  Args:
    values: [B, K] per-turn values, NaN where missing.
    group_size: G (rows per prompt).
    valid: optional [B, K] bool; False entries are excluded like NaN ones.
    use_std: divide by the std (z-score) or subtract the mean only.
    std_ddof: degrees of freedom of the std (1 = unbiased).
    epsilon: denominator guard.
    min_count: least number of rollouts at a turn index for a non-zero advantage (>= 1).

  Returns:
    [B, K] float32 advantages, 0 on missing turns.
  """
  if min_count < 1:
    raise ValueError(f"min_count must be >= 1, got {min_count}.")
  values = jnp.asarray(values, jnp.float32)
  mask = _grouped("valid", _mask(values, valid), group_size)
  x = jnp.where(mask, _grouped("values", values, group_size), 0.0)
  mean, std, count = _mean_std(x, mask, axis=1, ddof=std_ddof)
  centred = x - mean
  if use_std:
    centred = centred / (std + epsilon)
  hi = jnp.max(jnp.where(mask, x, -jnp.inf), axis=1, keepdims=True)
  lo = jnp.min(jnp.where(mask, x, jnp.inf), axis=1, keepdims=True)
  zero = (count < min_count) | (hi == lo)
  out = jnp.where(mask & ~zero, centred, 0.0)
  return jnp.reshape(out, jnp.shape(values))


def _batch_zscore(values, mask, *, std_ddof, epsilon):
  """z-score over every masked entry of the array (rollout scope); 0 where masked."""
  x = jnp.where(mask, values, 0.0)
  mean, std, count = _mean_std(x, mask, axis=None, ddof=std_ddof)
  z = jnp.where(count < 2, 0.0, (x - mean) / (std + epsilon))
  return jnp.where(mask, z, 0.0)


def mapo_advantages(
  values: jax.Array,
  *,
  group_size: int,
  mix: float = 0.5,
  valid: jax.Array | None = None,
  std_ddof: int = 1,
  epsilon: float = 1e-6,
  min_count: int = 2,
) -> jax.Array:
  """MAPO mix of turn-level and batch-level z-scores [recon]:

    A_{i,k} = lam * z_turn(x)_{i,k} + (1 - lam) * z_batch(x)_{i,k}

  z_turn = ``turn_group_normalize(x, use_std=True)`` over the rollouts of the group at turn k
  (pass ``group_size=B`` to take the whole batch at turn k); z_batch = the z-score over every
  reached turn of the array passed in. x is rewards or returns G. Golden (AGENTS.md §2, one group,
  lam = 0.5): [[0.651, -1.1812, 0.7158], [-1.1812, 0.651, 0], [0.651, 0.651, -0.9574]].

  Args:
    values: [B, K] per-turn values, NaN where missing.
    group_size: G for z_turn.
    mix: lam, the weight of the turn-level term.
    valid, std_ddof, epsilon, min_count: as in ``turn_group_normalize``.

  Returns:
    [B, K] float32, 0 on missing turns.
  """
  values = jnp.asarray(values, jnp.float32)
  mask = _mask(values, valid)
  z_turn = turn_group_normalize(
    values, group_size=group_size, valid=valid, use_std=True, std_ddof=std_ddof, epsilon=epsilon,
    min_count=min_count,
  )  # fmt: skip
  z_batch = _batch_zscore(values, mask, std_ddof=std_ddof, epsilon=epsilon)
  return jnp.where(mask, mix * z_turn + (1.0 - mix) * z_batch, 0.0)


def matchtir_advantages(
  rewards: jax.Array,
  *,
  group_size: int,
  gamma: float = 0.9,
  valid: jax.Array | None = None,
  std_ddof: int = 1,
  epsilon: float = 1e-6,
  min_count: int = 2,
) -> jax.Array:
  """MatchTIR dual advantage: trajectory and turn z-scores averaged.

    A_{i,k} = ( z_G(sum_k r_{i,k})_i + z_turn(G^gamma)_{i,k} ) / 2

  z_G is the GRPO z-score of the episode's summed reward over its group; z_turn is
  ``turn_group_normalize(discounted_turn_returns(r, gamma), use_std=True)``. gamma is the paper's
  lambda (0.9).

  Shapes: rewards [B, K] (NaN where missing) -> [B, K] float32, 0 on missing turns.
  """
  rewards = jnp.asarray(rewards, jnp.float32)
  mask = _mask(rewards, valid)
  total = jnp.sum(jnp.where(mask, rewards, 0.0), axis=-1, keepdims=True)  # [B, 1]
  row_ok = jnp.any(mask, axis=-1, keepdims=True)
  z_traj = turn_group_normalize(
    jnp.where(row_ok, total, jnp.nan), group_size=group_size, use_std=True, std_ddof=std_ddof,
    epsilon=epsilon, min_count=min_count,
  )  # fmt: skip
  returns = jnp.where(
    mask, discounted_turn_returns(jnp.where(mask, rewards, jnp.nan), gamma=gamma), jnp.nan
  )
  z_turn = turn_group_normalize(
    returns, group_size=group_size, use_std=True, std_ddof=std_ddof, epsilon=epsilon,
    min_count=min_count,
  )  # fmt: skip
  return jnp.where(mask, 0.5 * (z_traj + z_turn), 0.0)


def depth_scaled_returns(values: jax.Array, *, gamma: float = 1.0) -> jax.Array:
  """A2TGPO depth scaling [recon]: A_{i,t} = (sum_{k >= t} gamma^{k-t} x_{i,k}) / sqrt(K_i - t + 1).

  K_i = the number of turns row i reached; long remaining horizons are damped so early turns do
  not collect every later signal at full weight. Golden (AGENTS.md §2): x = [0.5, -0.2, 1.0],
  gamma = 1 -> [0.7506, 0.5657, 1.0]. x is normally the turn-normalised information gain
  (``turn_group_normalize`` of IGPO rewards), see ``a2tgpo_advantages``.

  Shapes: values [B, K] (NaN where missing) -> [B, K] float32, 0 on missing turns.
  """
  values = jnp.asarray(values, jnp.float32)
  mask = jnp.isfinite(values)
  returns = discounted_turn_returns(values, gamma=gamma)
  num_turns = _reached_count(mask)[:, None].astype(jnp.float32)
  t = jnp.arange(1, jnp.shape(values)[1] + 1, dtype=jnp.float32)[None, :]
  horizon = jnp.maximum(num_turns - t + 1.0, 1.0)
  return jnp.where(mask, returns / jnp.sqrt(horizon), 0.0)


def a2tgpo_advantages(
  rewards: jax.Array,
  *,
  group_size: int,
  gamma: float = 1.0,
  valid: jax.Array | None = None,
  std_ddof: int = 1,
  epsilon: float = 1e-6,
  min_count: int = 2,
) -> jax.Array:
  """A2TGPO [recon]: depth-scaled returns of turn-index-normalised turn rewards.

    x = turn_group_normalize(r, use_std=True);  A = depth_scaled_returns(x, gamma)

  Shapes: rewards [B, K] (NaN where missing) -> [B, K] float32, 0 on missing turns.
  """
  rewards = jnp.asarray(rewards, jnp.float32)
  mask = _mask(rewards, valid)
  x = turn_group_normalize(
    rewards, group_size=group_size, valid=valid, use_std=True, std_ddof=std_ddof, epsilon=epsilon,
    min_count=min_count,
  )  # fmt: skip
  return depth_scaled_returns(jnp.where(mask, x, jnp.nan), gamma=gamma)


def turn_clip_range(values: jax.Array, *, epsilon: float = 0.2, coef: float = 0.5) -> jax.Array:
  """A2TGPO per-turn clip range [recon]: eps_{i,t} = eps_0 (1 + c tanh(x_{i,t})).

  An array argument for the clipped surrogate (broadcast with ``turn_values_to_tokens``).
  Missing turns get eps_0. Shapes: [B, K] -> [B, K] float32.
  """
  values = jnp.asarray(values, jnp.float32)
  x = jnp.where(jnp.isfinite(values), values, 0.0)
  return epsilon * (1.0 + coef * jnp.tanh(x))


def turn_values_to_tokens(values: jax.Array, turn_index: jax.Array) -> jax.Array:
  """Broadcasts per-turn values to the tokens of each action: out[b, t] = values[b, turn_index[b, t] - 1].

  Tokens with ``turn_index`` 0 (prompt, observations, padding) get 0, as do NaN values, so the
  result can be used as token advantages / rewards directly. ``turn_index`` must be <= K.

  Shapes: values [B, K], turn_index [B, T] int -> [B, T] float32.
  """
  _check_turns("values", values)
  _check_turns("turn_index", turn_index)
  if jnp.shape(values)[0] != jnp.shape(turn_index)[0]:
    raise ValueError(
      f"values [B, K] {tuple(jnp.shape(values))} and turn_index [B, T] "
      f"{tuple(jnp.shape(turn_index))} differ in B."
    )
  values = jnp.asarray(values, jnp.float32)
  index = jnp.clip(turn_index - 1, 0, jnp.shape(values)[1] - 1)
  gathered = jnp.take_along_axis(values, index, axis=-1)
  return jnp.where((turn_index > 0) & jnp.isfinite(gathered), gathered, 0.0)
