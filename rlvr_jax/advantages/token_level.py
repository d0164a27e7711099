"""Token-level advantage estimators: REINFORCE++, REINFORCE++-baseline, GAE.

Part of :mod:`rlvr_jax.advantages` (import from there). Outputs are ``[B, T]`` float32, zero on
masked tokens, and constants for the loss (the trainer stop-gradients them). Recursions run
backwards over VALID tokens only: a masked position (padding, tool/environment tokens) is skipped,
so the return or GAE carry passes over it unchanged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlvr_jax.advantages import common, group


def _check_tokens(completion_mask: jax.Array, **arrays: jax.Array | None) -> None:
  common.check_rank("completion_mask", completion_mask, 2, "B, T")
  for name, x in arrays.items():
    if x is not None:
      common.check_rank(name, x, 2, "B, T")
  names = ("completion_mask", *arrays)
  common.check_same_shape(names, (completion_mask, *arrays.values()))


def _reverse_scan(step, init, *xs: jax.Array):
  """lax.scan backwards over T of [B, T] arrays; returns the stacked outputs as [B, T]."""
  _, ys = jax.lax.scan(step, init, tuple(x.T for x in xs), reverse=True)
  return jax.tree.map(lambda y: y.T, ys)


def discounted_returns(
  token_rewards: jax.Array, completion_mask: jax.Array, *, gamma: float = 1.0
) -> jax.Array:
  """Masked reward-to-go Ret_{b,t} = Σ_{t' >= t, m=1} γ^{(#valid steps from t to t')} u_{b,t'}.

  Masked positions are skipped (not reset), which equals verl's reset-after-EOS for trailing
  padding and keeps the return flowing over tool tokens inside a response.

  Args:
    token_rewards: [B, T] float rewards u.
    completion_mask: [B, T] bool mask m.
    gamma: discount γ.

  Returns:
    [B, T] float32 returns, 0 where m = 0.
  """
  _check_tokens(completion_mask, token_rewards=token_rewards)
  mask = completion_mask.astype(bool)
  rewards = jnp.where(mask, token_rewards, 0.0).astype(jnp.float32)

  def step(carry, x):
    u, m = x
    ret = jnp.where(m, u + gamma * carry, carry)
    return ret, jnp.where(m, ret, 0.0)

  # The carry is derived from the data so it inherits its sharding / shard_map varying type.
  return _reverse_scan(step, jnp.zeros_like(rewards[:, 0]), rewards, mask)


def _outcome_on_last_token(seq_rewards: jax.Array, mask: jax.Array) -> jax.Array:
  """[B] rewards placed on the last valid token of each row -> [B, T]."""
  num_tokens = mask.shape[1]
  last = num_tokens - 1 - jnp.argmax(jnp.flip(mask, axis=1), axis=1)
  at_last = (jnp.arange(num_tokens)[None, :] == last[:, None]) & mask
  return jnp.where(at_last, seq_rewards[:, None], 0.0)


def _row_setup(rewards, completion_mask, valid):
  """Checks [P, G] vs [B, T]; returns flat f32 rewards [B], token mask of valid rows [B, T]."""
  rewards, row_ok = common.prepare(rewards, valid)
  common.check_rank("completion_mask", completion_mask, 2, "B, T")
  common.check_grouped("completion_mask", completion_mask, rewards.size, rewards.shape[1], "B, T")
  mask = completion_mask.astype(bool) & row_ok.reshape(-1)[:, None]
  return rewards, mask


def reinforce_plus_plus_advantages(
  rewards: jax.Array,
  completion_mask: jax.Array,
  *,
  valid: jax.Array | None = None,
  old_logp: jax.Array | None = None,
  ref_logp: jax.Array | None = None,
  kl_coef: float = 0.0,
  token_rewards: jax.Array | None = None,
  gamma: float = 1.0,
  whiten: bool = True,
  std_ddof: int = 1,
  epsilon: float = 1e-8,
  axis_name: str | None = None,
) -> jax.Array:
  """REINFORCE++: k1-KL-shaped token returns, whitened over the rollout batch (arXiv 2501.03262).

    u_{b,t} = R_b 𝟙[t = last valid] - β (old_logp - ref_logp)_{b,t} + d_{b,t}
    Ret_{b,t} = Σ_{t' >= t} γ^{t'-t} u_{b,t'}
    A = (Ret - μ̂) / sqrt(v̂ + 1e-8),   μ̂, v̂ = token-weighted mean / (std_ddof) variance over all
                                        valid tokens of the rollout batch.

  The k1 KL belongs in the reward (it is a sample of the KL, not a loss). The whitening is
  token-weighted, so long responses dominate μ̂ and v̂. Invalid rows (NaN reward) are dropped
  from the statistics and get A = 0. Pass the whole rollout batch (or its shards inside
  ``shard_map`` with ``axis_name``).

  Constant for the loss: differentiable in principle, the trainer stop-gradients it.

  Args:
    rewards: [P, G] sequence rewards (NaN = failed).
    completion_mask: [B, T] bool, B = P * G.
    valid: optional [P, G] bool.
    old_logp, ref_logp: [B, T] float32; both needed when the KL penalty is used (ref_logp given).
    kl_coef: β.
    token_rewards: optional [B, T] dense rewards d (a process reward, a self-reward) added to u.
    gamma: γ.  whiten: apply the batch whitening (verl: always).
    std_ddof, epsilon: of the whitening variance.  axis_name: mesh axis inside ``shard_map``.

  Returns:
    [B, T] float32 advantages, 0 on masked tokens and invalid rows.
  """
  rewards, mask = _row_setup(rewards, completion_mask, valid)
  dense = token_rewards
  token_rewards = _outcome_on_last_token(rewards.reshape(-1), mask)
  if ref_logp is not None:
    if old_logp is None:
      raise ValueError("reinforce_plus_plus_advantages: ref_logp given without old_logp.")
    _check_tokens(completion_mask, old_logp=old_logp, ref_logp=ref_logp)
    token_rewards = token_rewards - kl_coef * (old_logp - ref_logp)
  if dense is not None:
    _check_tokens(completion_mask, token_rewards=dense)
    token_rewards = token_rewards + jnp.where(mask, dense, 0.0)
  returns = discounted_returns(token_rewards, mask, gamma=gamma)
  if not whiten:
    return returns
  return common.masked_whiten(
    returns, mask, std_ddof=std_ddof, epsilon=epsilon, axis_name=axis_name
  )


def reinforce_plus_plus_baseline_advantages(
  rewards: jax.Array,
  completion_mask: jax.Array,
  *,
  valid: jax.Array | None = None,
  std_ddof: int = 1,
  epsilon: float = 1e-8,
  axis_name: str | None = None,
) -> jax.Array:
  """REINFORCE++-baseline: group mean baseline, then token-weighted batch whitening.

    A_b = R_b - mean_g R;   A_{b,t} = (A_b - μ̂) / sqrt(v̂ + 1e-8) on valid tokens,

  μ̂, v̂ = token-weighted mean / variance of A_b over all valid tokens of the rollout batch
  (arXiv 2501.03262). Not zero-mean per group nor per sequence. Shapes: rewards [P, G],
  completion_mask [B, T] -> [B, T] float32. verl ``reinforce_plus_plus_baseline``.
  Constant for the loss: differentiable in principle, the trainer stop-gradients it.
  """
  _, mask = _row_setup(rewards, completion_mask, valid)
  seq_adv = group.dr_grpo_advantages(rewards, valid=valid).reshape(-1)
  tokens = jnp.where(mask, seq_adv[:, None], 0.0)
  return common.masked_whiten(tokens, mask, std_ddof=std_ddof, epsilon=epsilon, axis_name=axis_name)


def gae_advantages(
  token_rewards: jax.Array,
  values: jax.Array,
  completion_mask: jax.Array,
  *,
  gamma: float = 1.0,
  lam: float = 1.0,
  whiten: bool = True,
  std_ddof: int = 1,
  epsilon: float = 1e-8,
  axis_name: str | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Generalized advantage estimation over valid tokens (arXiv 1506.02438).

  Backwards over valid tokens only (masked positions are skipped):

    δ_t = u_t + γ V_next - V_t,   A_t = δ_t + γ λ A_next,   Ret_t = A_t + V_t,

  with V_next, A_next those of the next valid token (0 after the last). Then, as verl, the
  advantages are whitened over all valid tokens of the rollout batch (``whiten=True``); the
  returns (value targets) are not. Needs a value model; its output ``values`` is a constant here.

  Constant for the loss: differentiable in principle, the trainer stop-gradients it.

  Args:
    token_rewards: [B, T] float rewards u (outcome on the last valid token plus dense terms).
    values: [B, T] float values V.
    completion_mask: [B, T] bool.
    gamma: γ.  lam: λ.  whiten: batch-whiten the advantages.
    std_ddof, epsilon: of the whitening.  axis_name: mesh axis inside ``shard_map``.

  Returns:
    (advantages [B, T], returns [B, T]) float32, 0 where the mask is 0.
  """
  _check_tokens(completion_mask, token_rewards=token_rewards, values=values)
  mask = completion_mask.astype(bool)
  rewards = jnp.where(mask, token_rewards, 0.0).astype(jnp.float32)
  values = jnp.where(mask, values, 0.0).astype(jnp.float32)

  def step(carry, x):
    next_value, next_adv = carry
    u, v, m = x
    adv = u + gamma * next_value - v + gamma * lam * next_adv
    carry = (jnp.where(m, v, next_value), jnp.where(m, adv, next_adv))
    return carry, jnp.where(m, adv, 0.0)

  zeros = jnp.zeros_like(rewards[:, 0])  # inherits sharding / varying type, see above
  advantages = _reverse_scan(step, (zeros, zeros), rewards, values, mask)
  returns = jnp.where(mask, advantages + values, 0.0)
  if whiten:
    advantages = common.masked_whiten(
      advantages, mask, std_ddof=std_ddof, epsilon=epsilon, axis_name=axis_name
    )
  return advantages, returns
