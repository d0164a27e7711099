"""Dense credit: token- and step-level rewards -> advantages (PRIME, PURE, step segmentation).

Part of :mod:`rlvr_jax.advantages` (import from there). Inputs are ``[B, T]`` completion-aligned
arrays in group order (row b = sample b % G of prompt b // G); outputs are ``[B, T]`` float32,
zero on masked tokens and invalid rows, and constants for the loss (the trainer stop-gradients
them). Every function is pure and jittable; ``group_size`` and ``separator_ids`` are static.

* ``implicit_process_rewards``: PRIME's token reward r_t = β (log π_φ − log π_ref) (§5.8).
* ``segment_steps``: steps of a completion split after separator tokens (PURE splits at "\\n\\n").
* ``min_form_credit``: PURE's softmin-weighted step rewards (§5.9).
* ``group_loo_token_rewards``: PRIME's leave-one-out baseline on rewards at given positions.
* ``token_rloo_returns``: returns of token rewards minus a per-token leave-one-out baseline
  (PURE's "token mode" RLOO; the GRPO-style estimator for dense rewards).
* ``prime_advantages`` / ``pure_advantages``: the two recipes end to end.
* ``step_sums``: token rewards summed over each step, placed at the step's end (an implicit
  PRM's step reward).
* ``pure_token_advantages``: PURE from token rewards and token ids (the trainer's form: steps
  split at ``separator_ids``), registered as ``pure`` (the implicit PRM's token rewards,
  ``config.implicit_prm``) and ``pure_token_rewards`` (the configured reward's ``token_rewards``).

REINFORCE++ takes dense rewards through ``reinforce_plus_plus_advantages(token_rewards=...)`` and
GAE through its ``token_rewards`` argument (``token_level``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlvr_jax.advantages import common
from rlvr_jax.advantages.registry import Estimate, EstimatorSpec, register_estimator
from rlvr_jax.advantages.token_level import (
  _check_tokens,
  _outcome_on_last_token,
  discounted_returns,
)


def implicit_process_rewards(
  prm_logp: jax.Array, ref_logp: jax.Array, completion_mask: jax.Array, *, beta: float = 0.05
) -> jax.Array:
  """PRIME implicit process reward (arXiv 2502.01456; METHODS.md §5.8).

    r^φ_{b,t} = β (log π_φ(y_t | y_<t) − log π_ref(y_t | y_<t))   on valid tokens, 0 elsewhere.

  Args:
    prm_logp: [B, T] log-probs of the sampled tokens under the implicit PRM π_φ.
    ref_logp: [B, T] the same under the frozen reference π_ref.
    completion_mask: [B, T] bool.
    beta: β_φ (0.05 in the release).

  Returns:
    [B, T] float32 token rewards.
  """
  _check_tokens(completion_mask, prm_logp=prm_logp, ref_logp=ref_logp)
  mask = completion_mask.astype(bool)
  diff = jnp.where(mask, prm_logp - ref_logp, 0.0)
  return (beta * diff).astype(jnp.float32)


class StepSegments(NamedTuple):
  """Steps of each completion.

  Attributes:
    step_index: [B, T] int32, the 0-based step of each valid token; -1 on masked tokens.
    step_end: [B, T] bool, True on the last token of each step (where a step reward sits).
    num_steps: [B] int32 number of steps.
  """

  step_index: jax.Array
  step_end: jax.Array
  num_steps: jax.Array


def segment_steps(
  tokens: jax.Array, completion_mask: jax.Array, *, separator_ids: tuple[int, ...]
) -> StepSegments:
  """Splits each completion into steps that end at a separator token (pure; METHODS.md §5.9).

  A step is a maximal run of valid tokens ending with a separator (the separator belongs to the
  step it closes) or with the row's last valid token. PURE splits at "\\n\\n", which is one token
  in the usual BPE vocabularies; pass every id that should end a step (e.g. "\\n\\n" and
  ".\\n\\n"). Masked positions inside a row (tool tokens) belong to no step and do not split one.

  Args:
    tokens: [B, T] int completion ids.
    completion_mask: [B, T] bool.
    separator_ids: ids that end a step (static).

  Returns:
    :class:`StepSegments`.
  """
  _check_tokens(completion_mask, tokens=tokens)
  if not separator_ids:
    raise ValueError("segment_steps: separator_ids is empty; give at least one token id.")
  mask = completion_mask.astype(bool)
  seps = jnp.asarray(tuple(int(s) for s in separator_ids), dtype=tokens.dtype)
  is_sep = jnp.any(tokens[..., None] == seps, axis=-1) & mask
  num_tokens = mask.shape[1]
  last = num_tokens - 1 - jnp.argmax(jnp.flip(mask, axis=1), axis=1)
  is_last = (jnp.arange(num_tokens)[None, :] == last[:, None]) & mask
  step_end = is_sep | is_last
  ends = step_end.astype(jnp.int32)
  step_index = jnp.where(mask, jnp.cumsum(ends, axis=1) - ends, -1)
  return StepSegments(step_index, step_end, ends.sum(axis=1))


def min_form_credit(
  step_rewards: jax.Array, step_end: jax.Array, *, temperature: float = 0.1
) -> jax.Array:
  """PURE min-form credit (arXiv 2504.15275; METHODS.md §5.9).

    w_k = softmax_k(−p_k / T),   p̃_k = w_k p_k,   Σ_k p̃_k → min_k p_k as T → 0,

  over the steps k of each row (the positions where ``step_end`` is True). The returns-to-go of
  p̃ then give every token the (soft) minimum of the step rewards from its step on, instead of
  their sum, which a policy can inflate by adding steps.

  Args:
    step_rewards: [B, T] float, the step reward p_k (e.g. P(+) − P(−) of a PRM) at each step's
      last token; other positions are ignored.
    step_end: [B, T] bool, True on the last token of each step (``segment_steps``).
    temperature: T > 0.

  Returns:
    [B, T] float32 p̃ at the step ends, 0 elsewhere (rows without steps: all 0).
  """
  _check_tokens(step_end, step_rewards=step_rewards)
  if not temperature > 0:
    raise ValueError(f"min_form_credit: temperature must be > 0, got {temperature}.")
  ends = step_end.astype(bool)
  p = jnp.where(ends, step_rewards, 0.0).astype(jnp.float32)
  logits = jnp.where(ends, -p / temperature, -jnp.inf)
  top = jnp.max(jnp.where(ends, logits, jnp.finfo(jnp.float32).min), axis=1, keepdims=True)
  e = jnp.where(ends, jnp.exp(logits - jax.lax.stop_gradient(top)), 0.0)
  w = common.safe_div(e, jnp.sum(e, axis=1, keepdims=True))
  return jnp.where(ends, w * p, 0.0)


def _group_rows(completion_mask, group_size, valid):
  """[B] bool of rows that may enter group statistics, checked against [P, G] valid."""
  num_rows = completion_mask.shape[0]
  if num_rows % group_size:
    raise ValueError(
      f"completion_mask has {num_rows} rows [B, T], not a whole number of groups of {group_size}."
    )
  if valid is None:
    return jnp.ones((num_rows,), bool)
  common.check_rank("valid", valid, 2, "P, G")
  if valid.shape != (num_rows // group_size, group_size):
    raise ValueError(
      f"valid has shape {tuple(valid.shape)} [P, G]; expected ({num_rows // group_size}, "
      f"{group_size}) for B = {num_rows} rows."
    )
  return valid.reshape(-1).astype(bool)


def _loo_mean(per_row: jax.Array, ok: jax.Array, group_size: int):
  """Leave-one-out group mean of [B] values over rows ``ok``: (mean_{j≠b}, n_b valid peers + 1)."""
  v = common.to_groups(jnp.where(ok, per_row, 0.0), group_size=group_size)
  k = common.to_groups(ok.astype(jnp.float32), group_size=group_size)
  total, count = v.sum(axis=1, keepdims=True), k.sum(axis=1, keepdims=True)
  others = common.safe_div(total - v, count - k)
  return others.reshape(-1), jnp.broadcast_to(count, v.shape).reshape(-1)


def group_loo_token_rewards(
  token_rewards: jax.Array,
  reward_mask: jax.Array,
  *,
  group_size: int,
  valid: jax.Array | None = None,
) -> jax.Array:
  """PRIME's leave-one-out baseline for rewards placed at some positions (METHODS.md §5.8).

    r̄_b = mean of b's rewards over its reward positions,
    r̃_{b,t} = (n r_{b,t} − Σ_{j ∈ group} r̄_j) / (n − 1)   at b's reward positions,

  n = the number of valid rows of the group (G when all are). For a single reward position per
  row (an outcome on the last token) this is exactly RLOO, r_b − mean_{j≠b} r_j. Groups with
  n < 2 and invalid rows get 0. Linear in r, so a coefficient may be applied before or after.

  Args:
    token_rewards: [B, T] float.
    reward_mask: [B, T] bool, the reward positions (all valid tokens for the process reward,
      the last valid token for the outcome).
    group_size: G (static).
    valid: optional [P, G] bool rows that may enter the statistics.

  Returns:
    [B, T] float32, 0 outside the reward positions.
  """
  _check_tokens(reward_mask, token_rewards=token_rewards)
  ok = _group_rows(reward_mask, group_size, valid)
  at = reward_mask.astype(bool) & ok[:, None]
  r = jnp.where(at, token_rewards, 0.0).astype(jnp.float32)
  row_ok = ok & at.any(axis=1)
  row_mean = common.safe_div(r.sum(axis=1), at.sum(axis=1).astype(jnp.float32))
  others, count = _loo_mean(row_mean, row_ok, group_size)
  # (n r − Σ_j r̄_j)/(n − 1) = r + (r − r̄_b)/(n − 1) − mean_{j≠b} r̄_j
  scale = common.safe_div(jnp.ones_like(count), count - 1.0)
  out = r + scale[:, None] * (r - row_mean[:, None]) - others[:, None]
  return jnp.where(at & row_ok[:, None] & (count[:, None] > 1), out, 0.0)


def token_rloo_returns(
  token_rewards: jax.Array,
  completion_mask: jax.Array,
  *,
  group_size: int,
  valid: jax.Array | None = None,
  gamma: float = 1.0,
) -> jax.Array:
  """Returns of dense rewards with a per-token leave-one-out baseline (PURE "token mode" RLOO).

    b_i = mean_{j ≠ i in the group} (Σ_t r_{j,t} / n_j),   n_j = valid tokens of row j,
    u_{i,t} = r_{i,t} − b_i on every valid token,   A_{i,t} = Σ_{t' ≥ t} γ^{t'−t} u_{i,t'}.

  Seen per step k of n_{i,k} tokens this subtracts n_{i,k} b_i from the step's reward, which
  removes the bias toward fewer, longer steps (METHODS.md §5.9). The baseline is per token, so
  for a reward on the last token only this is not plain RLOO (use ``group_loo_token_rewards``
  for that). Groups with fewer than 2 valid rows and invalid rows get 0.

  Args:
    token_rewards: [B, T] float dense rewards.
    completion_mask: [B, T] bool.
    group_size: G (static).  valid: optional [P, G] bool.  gamma: γ.

  Returns:
    [B, T] float32.
  """
  _check_tokens(completion_mask, token_rewards=token_rewards)
  ok = _group_rows(completion_mask, group_size, valid)
  mask = completion_mask.astype(bool) & ok[:, None]
  r = jnp.where(mask, token_rewards, 0.0).astype(jnp.float32)
  row_ok = ok & mask.any(axis=1)
  per_token = common.safe_div(r.sum(axis=1), mask.sum(axis=1).astype(jnp.float32))
  baseline, count = _loo_mean(per_token, row_ok, group_size)
  keep = row_ok & (count > 1)
  u = jnp.where(mask & keep[:, None], r - baseline[:, None], 0.0)
  return discounted_returns(u, mask & keep[:, None], gamma=gamma)


def _whiten(x, mask, whiten, std_ddof, epsilon, axis_name):
  if not whiten:
    return x
  return common.masked_whiten(x, mask, std_ddof=std_ddof, epsilon=epsilon, axis_name=axis_name)


def _outcome_tokens(outcome_rewards, completion_mask, valid):
  """[P, G] outcome -> ([B, T] on the last valid token, [B, T] last-token mask, [P, G] valid)."""
  common.check_rank("outcome_rewards", outcome_rewards, 2, "P, G")
  rewards, ok = common.prepare(outcome_rewards, valid)
  mask = completion_mask.astype(bool)
  last = _outcome_on_last_token(jnp.ones(mask.shape[0], jnp.float32), mask) > 0
  tokens = _outcome_on_last_token(rewards.reshape(-1), mask)
  return tokens, last, ok


def prime_advantages(
  process_rewards: jax.Array,
  outcome_rewards: jax.Array,
  completion_mask: jax.Array,
  *,
  valid: jax.Array | None = None,
  process_coef: float = 5.0,
  outcome_coef: float = 1.0,
  gamma: float = 1.0,
  whiten: bool = True,
  std_ddof: int = 1,
  epsilon: float = 1e-8,
  axis_name: str | None = None,
) -> jax.Array:
  """PRIME advantages from two reward sources (arXiv 2502.01456; METHODS.md §5.8).

    r̃^proc = LOO(r^φ at every valid token),   r̃^out = LOO(R on the last valid token),
    A = whiten( Σ_{t' ≥ t} γ^{t'−t} (c_p r̃^proc + c_o r̃^out)_{t'} )

  with LOO = ``group_loo_token_rewards`` and the whitening token-weighted over every valid token
  of the rollout batch (as REINFORCE++). The release weights the process source by 5; since LOO
  and returns are linear, where the coefficient enters does not matter. Rows with a NaN outcome
  (or ``valid`` False) get 0 and leave every statistic.

  Args:
    process_rewards: [B, T] implicit process rewards (``implicit_process_rewards``).
    outcome_rewards: [P, G] verifier rewards (NaN = failed).
    completion_mask: [B, T] bool.
    valid: optional [P, G] bool.
    process_coef, outcome_coef: c_p, c_o.  gamma: γ.  whiten, std_ddof, epsilon, axis_name: of
      the batch whitening (``axis_name`` inside ``shard_map``).

  Returns:
    [B, T] float32 advantages.
  """
  _check_tokens(completion_mask, process_rewards=process_rewards)
  group_size = outcome_rewards.shape[-1]
  out_tokens, last, ok = _outcome_tokens(outcome_rewards, completion_mask, valid)
  mask = completion_mask.astype(bool) & ok.reshape(-1)[:, None]
  proc = group_loo_token_rewards(process_rewards, mask, group_size=group_size, valid=ok)
  out = group_loo_token_rewards(out_tokens, last & mask, group_size=group_size, valid=ok)
  returns = discounted_returns(process_coef * proc + outcome_coef * out, mask, gamma=gamma)
  return _whiten(returns, mask, whiten, std_ddof, epsilon, axis_name)


def pure_advantages(
  step_rewards: jax.Array,
  step_end: jax.Array,
  completion_mask: jax.Array,
  *,
  group_size: int,
  verifiable_rewards: jax.Array | None = None,
  valid: jax.Array | None = None,
  temperature: float = 0.1,
  gamma: float = 1.0,
  whiten: bool = False,
  std_ddof: int = 1,
  epsilon: float = 1e-8,
  axis_name: str | None = None,
) -> jax.Array:
  """PURE advantages: min-form step credit, token-mode RLOO returns (arXiv 2504.15275; §5.9).

    p̃ = min_form_credit(p, T),   A = token_rloo_returns(p̃) + Σ_{t' ≥ t} LOO(v)_{t'},

  where the optional verifiable reward v (the paper: 𝟙[solved] − 1 ∈ {−1, 0}) sits on the last
  valid token with a leave-one-out baseline (``group_loo_token_rewards``). ``whiten`` applies the
  token-weighted batch whitening (off by default: PURE's RLOO returns are not whitened).

  Args:
    step_rewards: [B, T] step rewards at the step ends.  step_end: [B, T] bool.
    completion_mask: [B, T] bool.  group_size: G (static).
    verifiable_rewards: optional [P, G] rewards (NaN = failed row).
    valid: optional [P, G] bool.  temperature: the softmin T.  gamma: γ.

  Returns:
    [B, T] float32 advantages.
  """
  _check_tokens(completion_mask, step_rewards=step_rewards, step_end=step_end)
  mask = completion_mask.astype(bool)
  ok = valid
  extra = jnp.zeros(mask.shape, jnp.float32)
  if verifiable_rewards is not None:
    out_tokens, last, ok = _outcome_tokens(verifiable_rewards, completion_mask, valid)
    extra = group_loo_token_rewards(out_tokens, last, group_size=group_size, valid=ok)
  row_ok = _group_rows(completion_mask, group_size, ok)
  credit = min_form_credit(step_rewards, step_end & mask, temperature=temperature)
  adv = token_rloo_returns(credit, mask, group_size=group_size, valid=ok, gamma=gamma)
  adv = adv + discounted_returns(extra, mask & row_ok[:, None], gamma=gamma)
  return _whiten(adv, mask & row_ok[:, None], whiten, std_ddof, epsilon, axis_name)


def _prime_call(spec, inputs, state, hp) -> Estimate:
  """``rl.advantage="prime"``: the token rewards are the implicit PRM's (``prm_token_rewards``: the
  trainer fills them from its PRM pass, ``config.implicit_prm``), the rewards the verifier's."""
  adv = prime_advantages(
    inputs["prm_token_rewards"], inputs["rewards"], inputs["completion_mask"],
    valid=inputs.get("valid"), **hp,
  )  # fmt: skip
  return Estimate(adv, {}, None)


register_estimator(
  EstimatorSpec(
    "prime",
    prime_advantages,
    level="token",
    reads=("rewards", "completion_mask", "prm_token_rewards"),
    call=_prime_call,
    static=("whiten",),
    paper="arXiv 2502.01456",
  )
)


def step_sums(token_rewards: jax.Array, segments: StepSegments) -> jax.Array:
  """Σ of the token rewards of each step, at the step's last token (0 elsewhere).

    p_{b,k} = Σ_{t in step k of row b} r_{b,t}

  The step reward of an implicit PRM (PRIME's q-value differences telescope: the reward of a
  step is the sum of its tokens' β log π_φ / π_ref). Masked tokens belong to no step.

  Args:
    token_rewards: [B, T] float.  segments: ``segment_steps`` of the same rows.

  Returns:
    [B, T] float32.
  """
  _check_tokens(segments.step_end, token_rewards=token_rewards)
  num_rows, num_tokens = token_rewards.shape
  idx = jnp.where(segments.step_index >= 0, segments.step_index, num_tokens)  # spare bucket
  r = jnp.where(segments.step_index >= 0, token_rewards, 0.0).astype(jnp.float32)
  sums = jnp.zeros((num_rows, num_tokens + 1), jnp.float32)
  sums = sums.at[jnp.arange(num_rows)[:, None], idx].add(r)
  per_token = jnp.take_along_axis(sums, idx, axis=1)
  return jnp.where(segments.step_end, per_token, 0.0)


def pure_token_advantages(
  token_rewards: jax.Array,
  rewards: jax.Array,
  completion_mask: jax.Array,
  completion_tokens: jax.Array,
  *,
  separator_ids: tuple[int, ...],
  valid: jax.Array | None = None,
  outcome_coef: float = 1.0,
  temperature: float = 0.1,
  gamma: float = 1.0,
  whiten: bool = False,
  std_ddof: int = 1,
  epsilon: float = 1e-8,
  axis_name: str | None = None,
) -> jax.Array:
  """PURE min-form credit from token rewards (arXiv 2504.15275; METHODS.md §5.9).

    steps = segment_steps(tokens, separator_ids),   p_k = Σ_{t in step k} r_t   (step_sums)
    A = pure_advantages(p, steps, verifiable_rewards = c_o R)   (softmin credit, token RLOO)

  The trainer's form: the steps are split at ``separator_ids`` in the completion ids, the step
  rewards are sums of dense token rewards (an implicit PRM's, or a reward's own per-token
  rewards), and the verifier outcome R enters with weight ``outcome_coef`` (0: step rewards
  only, the paper's PRM-only setting).

  Args:
    token_rewards: [B, T] dense rewards.  rewards: [P, G] outcomes (NaN = failed row).
    completion_mask: [B, T] bool.  completion_tokens: [B, T] int ids.
    separator_ids: ids that end a step (static).  valid: optional [P, G] bool.
    outcome_coef: c_o.  temperature, gamma, whiten, std_ddof, epsilon, axis_name: as
      ``pure_advantages``.

  Returns:
    [B, T] float32 advantages.
  """
  common.check_rank("rewards", rewards, 2, "P, G")
  segments = segment_steps(completion_tokens, completion_mask, separator_ids=separator_ids)
  p = step_sums(token_rewards, segments)
  _, ok = common.prepare(rewards, valid)
  outcome = None if outcome_coef == 0 else outcome_coef * rewards
  return pure_advantages(
    p, segments.step_end, completion_mask, group_size=rewards.shape[-1],
    verifiable_rewards=outcome, valid=ok, temperature=temperature, gamma=gamma, whiten=whiten,
    std_ddof=std_ddof, epsilon=epsilon, axis_name=axis_name,
  )  # fmt: skip


def _pure_call(spec, inputs, state, hp) -> Estimate:
  """The dense source is the spec's third read (``prm_token_rewards`` or ``token_rewards``)."""
  adv = pure_token_advantages(
    inputs[spec.reads[2]], inputs["rewards"], inputs["completion_mask"],
    inputs["completion_tokens"], valid=inputs.get("valid"), **hp,
  )  # fmt: skip
  return Estimate(adv, {}, None)


def _pure_check(num_prompts, group_size, hp):
  seps = hp.get("separator_ids")
  if not seps or not all(isinstance(s, int) and s >= 0 for s in seps):
    return f"separator_ids={seps!r}: give the token ids that end a step, e.g. (12,)"
  return None


for _name, _source in (("pure", "prm_token_rewards"), ("pure_token_rewards", "token_rewards")):
  register_estimator(
    EstimatorSpec(
      _name,
      pure_token_advantages,
      level="token",
      reads=("rewards", "completion_mask", _source, "completion_tokens"),
      call=_pure_call,
      check=_pure_check,
      static=("separator_ids", "whiten"),
      paper="arXiv 2504.15275",
    )
  )
