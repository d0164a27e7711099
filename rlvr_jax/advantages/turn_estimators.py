"""Turn-level credit in the registry's form: the multi-turn estimators selectable as
``rl.advantage=<name>`` (AGENTS.md §2; the math is in :mod:`rlvr_jax.advantages.turns`).

Part of ``rlvr_jax.advantages``.

Each estimator reads, besides the episode returns ``rewards`` [P, G] (R_i, NaN = failed; here they
only say which episodes count and the group size G), the per-turn rewards and the turn of each
token of the episode stream (``EstimatorSpec.reads``, filled by the multi-turn collector):

  * ``turn_rewards`` [B, K]: r_{i,k}, the reward of turn k's environment step, NaN where missing;
  * ``turn_index`` [B, T]: k (1-based) on the action tokens of turn k, 0 on observations/padding.

and returns token advantages [B, T] (level ``token``): the per-turn advantage A_{i,k} broadcast
to the action tokens of turn k (``turn_values_to_tokens``), 0 on observation tokens, on missing
turns and on invalid episodes (``valid`` False or R_i NaN: all their turns are excluded from every
statistic). A single-turn run has no turns: the trainer refuses these estimators there.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlvr_jax.advantages import common, turns
from rlvr_jax.advantages.registry import EstimatorSpec, register_estimator

_SCOPES = ("group", "batch")


def _turn_inputs(rewards, turn_rewards, turn_index, valid):
  """(G, [B, K] float32 turn rewards, [B, K] bool turn validity) after the shape checks."""
  _, row_ok = common.prepare(rewards, valid)  # [P, G] rank check; finite and marked valid
  P, G = jnp.shape(rewards)
  if jnp.ndim(turn_rewards) != 2 or jnp.shape(turn_rewards)[0] != P * G:
    raise ValueError(
      f"turn_rewards must be [B, K] with B = P * G = {P * G}, got {tuple(jnp.shape(turn_rewards))}"
    )
  if jnp.ndim(turn_index) != 2 or jnp.shape(turn_index)[0] != P * G:
    raise ValueError(
      f"turn_index must be [B, T] with B = P * G = {P * G}, got {tuple(jnp.shape(turn_index))}"
    )
  turn_rewards = jnp.asarray(turn_rewards, jnp.float32)
  turn_ok = jnp.isfinite(turn_rewards) & jnp.reshape(row_ok, (P * G, 1))
  return G, turn_rewards, turn_ok


def turn_norm_advantages(
  rewards: jax.Array,
  turn_rewards: jax.Array,
  turn_index: jax.Array,
  *,
  valid: jax.Array | None = None,
  gamma: float = 1.0,
  use_std: bool = True,
  min_count: int = 2,
  std_ddof: int = 1,
  epsilon: float = 1e-6,
) -> jax.Array:
  """Per-turn-index group normalisation of discounted turn returns (CM2-style), on the tokens.

    G_{i,k} = sum_{k' >= k} gamma^{k'-k} r_{i,k'};
    A_{i,k} = (G_{i,k} - mean_{j reached k} G_{j,k}) [/ (std_{j reached k} G_{j,k} + epsilon)]

  over the rollouts j of the group that reached turn k (``turns.turn_group_normalize``); a turn
  index reached by fewer than ``min_count`` rollouts gets 0 (CM2: ``min_count=5``).

  Shapes: rewards [P, G], turn_rewards [B, K], turn_index [B, T] -> [B, T] float32.
  """
  G, r, ok = _turn_inputs(rewards, turn_rewards, turn_index, valid)
  returns = turns.discounted_turn_returns(jnp.where(ok, r, jnp.nan), gamma=gamma)
  adv = turns.turn_group_normalize(
    returns, group_size=G, valid=ok, use_std=use_std, std_ddof=std_ddof, epsilon=epsilon,
    min_count=min_count,
  )  # fmt: skip
  return turns.turn_values_to_tokens(adv, turn_index)


def mapo_token_advantages(
  rewards: jax.Array,
  turn_rewards: jax.Array,
  turn_index: jax.Array,
  *,
  valid: jax.Array | None = None,
  mix: float = 0.5,
  gamma: float = 1.0,
  turn_scope: str = "batch",
  min_count: int = 2,
  std_ddof: int = 1,
  epsilon: float = 1e-6,
) -> jax.Array:
  """MAPO [recon]: A_{i,k} = mix * z_turn(G)_{i,k} + (1 - mix) * z_batch(G)_{i,k}, on the tokens.

  G = discounted turn returns (``gamma``); z_turn is the z-score over the rollouts at turn index k
  (``turn_scope``: of the whole batch, as AGENTS.md §2 states MAPO, or of the group), z_batch over
  every reached turn of the batch (``turns.mapo_advantages``).

  Shapes: rewards [P, G], turn_rewards [B, K], turn_index [B, T] -> [B, T] float32.
  """
  if turn_scope not in _SCOPES:
    raise ValueError(f"turn_scope must be one of {_SCOPES}, got {turn_scope!r}")
  G, r, ok = _turn_inputs(rewards, turn_rewards, turn_index, valid)
  returns = turns.discounted_turn_returns(jnp.where(ok, r, jnp.nan), gamma=gamma)
  size = G if turn_scope == "group" else jnp.shape(r)[0]
  adv = turns.mapo_advantages(
    returns, group_size=size, mix=mix, valid=ok, std_ddof=std_ddof, epsilon=epsilon,
    min_count=min_count,
  )  # fmt: skip
  return turns.turn_values_to_tokens(adv, turn_index)


def matchtir_token_advantages(
  rewards: jax.Array,
  turn_rewards: jax.Array,
  turn_index: jax.Array,
  *,
  valid: jax.Array | None = None,
  gamma: float = 0.9,
  min_count: int = 2,
  std_ddof: int = 1,
  epsilon: float = 1e-6,
) -> jax.Array:
  """MatchTIR dual advantage, on the tokens: A_{i,k} = (z_G(sum_k r_{i,k}) + z_turn(G^gamma)_{i,k}) / 2.

  ``turns.matchtir_advantages``: the trajectory z-score of the summed turn rewards over the group
  plus the per-turn-index z-score of the discounted returns (gamma: the paper's lambda, 0.9).

  Shapes: rewards [P, G], turn_rewards [B, K], turn_index [B, T] -> [B, T] float32.
  """
  G, r, ok = _turn_inputs(rewards, turn_rewards, turn_index, valid)
  adv = turns.matchtir_advantages(
    r, group_size=G, gamma=gamma, valid=ok, std_ddof=std_ddof, epsilon=epsilon,
    min_count=min_count,
  )  # fmt: skip
  return turns.turn_values_to_tokens(adv, turn_index)


def a2tgpo_token_advantages(
  rewards: jax.Array,
  turn_rewards: jax.Array,
  turn_index: jax.Array,
  *,
  valid: jax.Array | None = None,
  gamma: float = 1.0,
  min_count: int = 2,
  std_ddof: int = 1,
  epsilon: float = 1e-6,
) -> jax.Array:
  """A2TGPO [recon], on the tokens: depth-scaled returns of turn-index-normalised turn rewards.

    x = turn_group_normalize(r, use_std=True);  A_{i,t} = sum_{k>=t} gamma^{k-t} x_{i,k} / sqrt(K_i - t + 1)

  (``turns.a2tgpo_advantages``; K_i = the turns episode i reached). The per-turn clip range of
  the paper (``turns.turn_clip_range``) is not applied: the objective keeps its own clip.

  Shapes: rewards [P, G], turn_rewards [B, K], turn_index [B, T] -> [B, T] float32.
  """
  G, r, ok = _turn_inputs(rewards, turn_rewards, turn_index, valid)
  adv = turns.a2tgpo_advantages(
    r, group_size=G, gamma=gamma, valid=ok, std_ddof=std_ddof, epsilon=epsilon,
    min_count=min_count,
  )  # fmt: skip
  return turns.turn_values_to_tokens(adv, turn_index)


_TURN = dict(level="token", reads=("rewards", "turn_rewards", "turn_index"))
for _spec in (
  EstimatorSpec(
    "turn_norm",
    turn_norm_advantages,
    **_TURN,
    static=("use_std", "min_count", "std_ddof"),
    paper="CM2; MatchTIR's turn term (AGENTS.md §2)",
  ),  # fmt: skip
  EstimatorSpec(
    "mapo",
    mapo_token_advantages,
    **_TURN,
    static=("turn_scope", "min_count", "std_ddof"),
    paper="MAPO [recon] (AGENTS.md §2)",
  ),  # fmt: skip
  EstimatorSpec(
    "matchtir",
    matchtir_token_advantages,
    **_TURN,
    static=("min_count", "std_ddof"),
    paper="MatchTIR (AGENTS.md §2)",
  ),  # fmt: skip
  EstimatorSpec(
    "a2tgpo",
    a2tgpo_token_advantages,
    **_TURN,
    static=("min_count", "std_ddof"),
    paper="A2TGPO [recon] (AGENTS.md §2)",
  ),  # fmt: skip
):
  register_estimator(_spec)
