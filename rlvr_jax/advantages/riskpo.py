"""RiskPO: mixed value-at-risk advantages over bundles, with a cross-step quantile tracker.

Part of :mod:`rlvr_jax.advantages` (import from there). METHODS.md §2.8, arXiv 2510.00911,
code RTkenny/RiskPO. The tracker state is a frozen dataclass pytree threaded explicitly by the
trainer: the advantage at step k uses the state updated at step k-1 (the release updates the
tracker after the advantage and then drops it, so its ``track`` mode silently used batch values).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from rlvr_jax.advantages import common
from rlvr_jax.types import pytree_dataclass

DEFAULT_LEVELS = tuple(round(0.05 * i, 2) for i in range(1, 20))  # 0.05, 0.10, ..., 0.95
_CREDITS = ("uniform", "std", "score", "sum_mean")


@pytree_dataclass
class RiskPOState:
  """Quantile tracker of paper scores.

  Attributes:
    quantiles: [Q] float32 tracked quantile q_τ of the paper score at each level of ``levels``.
    initialized: bool scalar; False until the first step has set the quantiles empirically.
    levels: static tuple of the Q quantile levels τ.
  """

  _static_fields = ("levels",)

  quantiles: jax.Array
  initialized: jax.Array
  levels: tuple[float, ...] = DEFAULT_LEVELS


def riskpo_init(levels: tuple[float, ...] = DEFAULT_LEVELS) -> RiskPOState:
  """An empty tracker (``track`` / ``mix`` modes use batch quantiles until it is set)."""
  levels = tuple(float(x) for x in levels)
  return RiskPOState(
    quantiles=jnp.zeros(len(levels), jnp.float32), initialized=jnp.array(False), levels=levels
  )


def _sorted_quantile(sorted_values: jax.Array, count: jax.Array, tau: float) -> jax.Array:
  """numpy "linear" quantile over the first ``count`` entries of the (ascending) last axis."""
  pos = tau * jnp.maximum(count - 1, 0).astype(jnp.float32)
  lo = jnp.floor(pos).astype(jnp.int32)
  hi = jnp.minimum(lo + 1, jnp.maximum(count - 1, 0))
  v_lo = jnp.take_along_axis(sorted_values, lo[..., None], axis=-1)[..., 0]
  v_hi = jnp.take_along_axis(sorted_values, hi[..., None], axis=-1)[..., 0]
  return v_lo + (pos - lo) * (v_hi - v_lo)


def _gather_invariant(x: jax.Array, axis_name: str) -> jax.Array:
  """All-gather (tiled) of a small vector as a psum, so the result is device-invariant.

  ``lax.all_gather`` is typed as varying inside ``shard_map``; the tracker must come out
  replicated, so each shard writes its slice into zeros and the slices are summed.
  """
  size, n = jax.lax.axis_size(axis_name), x.shape[0]
  full = jnp.zeros((size * n,), jnp.float32)
  full = jax.lax.dynamic_update_slice(
    full, x.astype(jnp.float32), (jax.lax.axis_index(axis_name) * n,)
  )
  return jax.lax.psum(full, axis_name)


def riskpo_tracker_update(
  state: RiskPOState,
  scores: jax.Array,
  mask: jax.Array,
  *,
  tracker_lr: float = 0.1,
  axis_name: str | None = None,
) -> RiskPOState:
  """One tracker step from this step's paper scores, pooled over all bundles (and shards).

    first step:  q_τ = empirical τ-quantile (numpy "linear") of the pooled scores
    afterwards:  q_τ <- q_τ + η_q (τ - mean_k 𝟙[S_k < q_τ])     (pinball-loss SGD step)

  Args:
    state: the tracker.
    scores: paper scores S (any shape), mask: bool of the same shape (valid papers).
    tracker_lr: η_q.  axis_name: mesh axis inside ``shard_map`` (scores are all-gathered).

  Returns:
    The updated tracker (unchanged if no paper is valid).
  """
  common.check_same_shape(("scores", "mask"), (scores, mask))
  scores, mask = scores.reshape(-1).astype(jnp.float32), mask.reshape(-1).astype(bool)
  scores, mask = common.replicated(scores), common.replicated(mask)  # pooled sort below
  if axis_name is not None:
    scores, mask = _gather_invariant(scores, axis_name), _gather_invariant(mask, axis_name) > 0
  levels = jnp.asarray(state.levels, jnp.float32)
  count = jnp.sum(mask)
  sorted_scores = jnp.sort(jnp.where(mask, scores, jnp.inf))
  empirical = jnp.stack([_sorted_quantile(sorted_scores, count, t) for t in state.levels])
  below = jnp.sum(mask[None, :] & (scores[None, :] < state.quantiles[:, None]), axis=-1)
  frac_below = common.safe_div(below.astype(jnp.float32), count.astype(jnp.float32))
  stepped = state.quantiles + tracker_lr * (levels - frac_below)
  new = jnp.where(state.initialized, stepped, empirical)
  return dataclasses.replace(
    state,
    quantiles=jnp.where(count > 0, new, state.quantiles),
    initialized=state.initialized | (count > 0),
  )


def _nearest(levels: tuple[float, ...], tau: float) -> int:
  return min(range(len(levels)), key=lambda i: abs(levels[i] - tau))


def _paper_advantage(scores, q_down, q_up, *, alpha, beta, w_mix, w_seek, risk_mode,
                     natural_baseline, epsilon):  # fmt: skip
  """Mixed VaR (or risk-seeking) advantage of each paper score, before the bundle std."""
  relu = jax.nn.relu
  baseline = (q_down - q_up) if natural_baseline else 0.0
  a_range = (relu(scores - q_down) - relu(scores - q_up) + baseline) / (beta - alpha + epsilon)
  if risk_mode == "mixed":
    a_cvar = -relu(q_down - scores) / (alpha + epsilon)
    return (w_mix * a_cvar + a_range) / (w_mix + 1.0)
  a_seek = relu(scores - q_up) / (1.0 - beta + epsilon)
  return (w_seek * a_seek + a_range) / (w_seek + 1.0)


def riskpo_advantages(
  rewards: jax.Array,
  state: RiskPOState | None = None,
  *,
  valid: jax.Array | None = None,
  bundle_size: int = 5,
  quantile_down: float = 0.2,
  quantile_up: float = 0.9,
  w_mix: float = 1.5,
  w_seek: float = 1.5,
  risk_mode: str = "mixed",
  natural_baseline: bool = True,
  credit: str = "std",
  quantile_mode: str = "track",
  tracker_lr: float = 0.1,
  std_ddof: int = 1,
  epsilon: float = 1e-6,
  axis_name: str | None = None,
) -> tuple[jax.Array, RiskPOState | None]:
  """RiskPO mixed value-at-risk advantages with bundling (arXiv 2510.00911).

  Rows are group ordered and ``bundle_size`` = B_q consecutive prompts form a bundle. Within a
  bundle, paper k takes the k-th valid response of every question (k < K = min_q n_q; later
  responses get A = 0) and scores S_k = Σ_q R_{q,k}. With quantiles q_α, q_β of {S_k}:

    A_R = ([S - q_α]_+ - [S - q_β]_+ + (q_α - q_β)) / (β - α + ε)    (natural baseline on)
    A_C = -[q_α - S]_+ / (α + ε)
    A = (w A_C + A_R) / (w + 1)          or risk-seeking (u [S - q_β]_+/(1 - β + ε) + A_R)/(u + 1)
    A <- A / (std_k S + ε)               (ddof std within the bundle; 1 if K = 1)

  then credited to each response of the paper: ``uniform`` A; ``std`` A / (s_q + ε) with
  s_q = std_g R_q if > 1e-3 else 1; ``score`` (0.5 if R > 0 else 1.5) A; ``sum_mean``
  A (R_b - mean_q) / Σ_paper (R - mean), or A / B_q if that sum is below 1e-6.
  Quantiles: ``batch`` per bundle (numpy "linear"), ``track`` from ``state`` read at the nearest
  grid level (batch values until the tracker is set), ``mix`` their average. With the natural
  baseline every paper has A <= 0: only the lower tail is pushed down. Permuting the questions of
  a bundle permutes the advantages; permuting samples within a group does NOT (papers pair
  responses by rollout index), so keep the sampler's order.

  Constant for the loss: differentiable in principle, the trainer stop-gradients it.

  Args:
    rewards: [P, G] rewards (NaN = failed), P a multiple of ``bundle_size``.
    state: the tracker from the previous step (``riskpo_init()`` at the start); may be None for
      ``quantile_mode="batch"``.
    valid: optional [P, G] bool.
    bundle_size: B_q.  quantile_down: α.  quantile_up: β.  w_mix: w.  w_seek: u.
    risk_mode: "mixed" (MVaR) or "seeking".  natural_baseline: include (q_α - q_β).
    credit: "uniform" | "std" | "score" | "sum_mean".  quantile_mode: "batch" | "track" | "mix".
    tracker_lr: η_q.  std_ddof: of the bundle and question stds.  epsilon: ε.
    axis_name: mesh axis inside ``shard_map`` for the pooled tracker update (bundles must not be
      split across shards).

  Returns:
    (advantages [P, G] float32, the tracker updated with this step's scores, or None).
  """
  common.check_choice("credit", credit, _CREDITS)
  common.check_choice("quantile_mode", quantile_mode, ("batch", "track", "mix"))
  common.check_choice("risk_mode", risk_mode, ("mixed", "seeking"))
  if state is None and quantile_mode != "batch":
    raise ValueError(f"quantile_mode={quantile_mode!r} needs a RiskPOState (riskpo_init()).")
  rewards, mask = common.prepare(rewards, valid)
  num_prompts, group_size = rewards.shape
  if bundle_size < 1 or num_prompts % bundle_size:
    raise ValueError(
      f"bundle_size B_q = {bundle_size} does not divide the number of prompts P = {num_prompts} "
      f"(rewards shape {tuple(rewards.shape)} [P, G])."
    )
  shape3 = (num_prompts // bundle_size, bundle_size, group_size)
  rewards, mask = rewards.reshape(shape3), mask.reshape(shape3)

  # Papers: compact each question's valid responses to the front, keeping rollout order.
  order = jnp.argsort(~mask, axis=-1, stable=True)
  compact = jnp.take_along_axis(rewards, order, axis=-1)
  num_papers = jnp.min(jnp.sum(mask, axis=-1), axis=-1)  # K per bundle, [NB]
  paper_ok = jnp.arange(group_size)[None, :] < num_papers[:, None]  # [NB, G]
  scores = jnp.where(paper_ok, jnp.sum(compact, axis=1), 0.0)  # S_k, [NB, G]

  sorted_scores = jnp.sort(jnp.where(paper_ok, scores, jnp.inf), axis=-1)
  q_down = _sorted_quantile(sorted_scores, num_papers, quantile_down)[:, None]
  q_up = _sorted_quantile(sorted_scores, num_papers, quantile_up)[:, None]
  if quantile_mode != "batch":
    tracked_down = state.quantiles[_nearest(state.levels, quantile_down)]
    tracked_up = state.quantiles[_nearest(state.levels, quantile_up)]
    if quantile_mode == "mix":
      tracked_down, tracked_up = (tracked_down + q_down) / 2, (tracked_up + q_up) / 2
    q_down = jnp.where(state.initialized, tracked_down, q_down)
    q_up = jnp.where(state.initialized, tracked_up, q_up)

  paper_adv = _paper_advantage(
    scores, q_down, q_up, alpha=quantile_down, beta=quantile_up, w_mix=w_mix, w_seek=w_seek,
    risk_mode=risk_mode, natural_baseline=natural_baseline, epsilon=epsilon,
  )  # fmt: skip
  _, bundle_std, _ = common.group_mean_std(scores, paper_ok, ddof=std_ddof)
  bundle_std = jnp.where(num_papers[:, None] > 1, bundle_std, 1.0)
  paper_adv = jnp.where(paper_ok, paper_adv / (bundle_std + epsilon), 0.0)[:, None, :]

  q_mean, q_std, _ = common.group_mean_std(rewards, mask, ddof=std_ddof)  # [NB, B_q, 1]
  if credit == "uniform":
    adv = jnp.broadcast_to(paper_adv, shape3)
  elif credit == "std":
    adv = paper_adv / (jnp.where(q_std > 1e-3, q_std, 1.0) + epsilon)
  elif credit == "score":
    adv = jnp.where(compact > 0, 0.5, 1.5) * paper_adv
  else:  # sum_mean
    centred = compact - q_mean
    den = jnp.sum(centred, axis=1, keepdims=True)
    small = jnp.abs(den) < 1e-6
    adv = jnp.where(small, paper_adv / bundle_size, paper_adv * common.safe_div(centred, den))
  adv = jnp.where(paper_ok[:, None, :], adv, 0.0)
  adv = jnp.take_along_axis(adv, jnp.argsort(order, axis=-1), axis=-1)
  adv = adv.reshape(num_prompts, group_size)

  new_state = None
  if state is not None:
    new_state = riskpo_tracker_update(
      state, scores, paper_ok, tracker_lr=tracker_lr, axis_name=axis_name
    )
  return adv, new_state
