"""Advantage estimators: rewards -> advantages, pure and jittable (METHODS.md §2).

Conventions shared by every function here:

* Sequence rewards are ``[P, G]`` float32, group ordered: row b of the flat batch ``[B]`` is
  sample ``b % G`` of prompt ``b // G`` (``to_groups`` reshapes a flat ``[B]`` array).
* A NaN reward means the reward computation failed. Such samples (and those with ``valid``
  False) are excluded from every statistic and get advantage 0; they are never counted as 0.
* Hyperparameters are keyword-only; strings and ints that change the program (scopes, modes,
  ``k``, ``bundle_size``) must be static under ``jax.jit`` (bind them with ``functools.partial``).
* Statistics have an explicit scope (METHODS.md §1.3): ``group`` (the G samples of a prompt) or
  ``rollout`` (every row passed in: pass the whole rollout batch, or its shards inside
  ``jax.shard_map`` together with ``axis_name``). Under plain ``jax.jit`` with sharded inputs the
  rollout reductions are global by construction.
* stds take an explicit ``std_ddof`` (default 1, unbiased, as verl).
* Advantages are constants for the loss: they are differentiable in principle, and the trainer
  applies ``jax.lax.stop_gradient`` to them.
* Zero-variance groups (§2.11): group estimators return exactly 0 for groups whose valid rewards
  are all equal or that have fewer than 2 valid samples; ``zero_variance_groups`` on the OUTCOME
  plus ``handle_zero_variance`` applies the ``keep`` / ``mask`` policy.

Estimators (name in verl / TRL / Tunix in the docs name map):

* sequence level ``[P, G] -> [P, G]``: ``grpo_advantages``, ``dr_grpo_advantages``,
  ``lite_ppo_advantages`` (all presets of ``group_normalized_advantages``), ``rloo_advantages``,
  ``remax_advantages``, ``passk_training_advantages``, ``pkpo_rewards`` / ``pkpo_advantages``,
  ``max_at_g_advantages`` (verl ``grpo_passk``), ``riskpo_advantages`` (+ ``RiskPOState``),
  ``copo_advantages``, ``canon_advantages``;
* token level ``-> [B, T]``: ``reinforce_plus_plus_advantages``,
  ``reinforce_plus_plus_baseline_advantages``, ``gae_advantages``;
* dense credit (``[B, T]`` token / step rewards, METHODS.md §5.8-5.9):
  ``implicit_process_rewards`` (PRIME), ``segment_steps`` (+ ``StepSegments``),
  ``min_form_credit`` (PURE), ``group_loo_token_rewards``, ``token_rloo_returns``,
  ``prime_advantages``, ``pure_advantages``, ``pure_token_advantages`` (+ ``step_sums``);
  REINFORCE++ takes dense rewards via ``token_rewards=``;
* segment and tree credit of branching rollouts (SPO, arXiv 2505.23564): ``spo_cutpoints``,
  ``spo_segments``, ``spo_chain_advantages``; ``SegmentTree`` (+ ``complete_tree``),
  ``tree_values``, ``tree_advantages``, ``spo_tree_token_advantages`` (SPO-tree); R3L's
  ``pivotal_mask`` and ``r3l_advantages`` (positive amplification), ``r3l_token_advantages`` (both, the estimator);
* RLPR's prompt filter: ``rlpr_std_filter`` (+ ``StdFilterState``, ``std_filter_init``);
* turn level (multi-turn episodes, ``[B, K]`` per-turn rewards, AGENTS.md §2):
  ``discounted_turn_returns``, ``episode_return``, ``turn_group_normalize`` (the per-turn-index
  group normalisation shared by CM2 / MatchTIR / A2TGPO / MAPO), ``mapo_advantages``,
  ``matchtir_advantages``, ``a2tgpo_advantages`` (+ ``depth_scaled_returns``, ``turn_clip_range``),
  ``geometric_outcome_credit`` (EAPO), ``gated_return`` (G-RA), ``turn_values_to_tokens``;
* ``ESTIMATORS``: name -> ``EstimatorSpec``, the one table (what each estimator reads, its level,
  its extra outputs for the objective, its state); ``register_estimator`` adds one;
  ``SEQUENCE_ESTIMATORS`` is the view name -> function of those that read only the rewards;
* helpers: ``to_tokens`` ([P, G] -> [B, T] times the mask), ``to_groups``, ``valid_mask``,
  ``masked_whiten``, ``discounted_returns``, ``zero_variance_groups``, ``handle_zero_variance``,
  ``gradient_group_fraction``, ``zero_variance_metrics``, ``pass_at_k`` (metric).

Parts (this ``__init__`` is only the public API; the code is in): ``registry`` (``ESTIMATORS``),
``baselines`` (verl's OPO, GPG, GDPO and optimal-token baselines; each registers its own spec),
``filters`` (``GROUP_FILTERS``: rollout group filters, constant outcome and pass rate),
``common`` (validity masks, group reshapes, scoped statistics, zero-variance handling, metrics),
``group`` (group baselines: GRPO family, RLOO, ReMax, CoPO, CANON), ``passk`` (pass@k training,
PKPO, max@G, the pass@k metric), ``riskpo`` (RiskPO and its tracker state), ``token_level``
(REINFORCE++, its baseline variant, GAE), ``process`` (dense credit: PRIME, PURE, step
segmentation), ``segments`` (SPO's chain and tree credit), ``std_filter`` (RLPR's std filter), ``turns`` (turn-level returns and
advantages), ``turn_estimators`` (those in the registry's form, selectable in multi-turn runs). The package imports only jax (``tests/test_import_rules.py`` checks it).
"""

from rlvr_jax.advantages import (
  baselines,  # noqa: F401  (registers verl's extra baselines)
  turn_estimators,  # noqa: F401  (registers the turn estimators)
)
from rlvr_jax.advantages.common import (
  gradient_group_fraction,
  handle_zero_variance,
  masked_whiten,
  to_groups,
  to_tokens,
  valid_mask,
  zero_variance_groups,
  zero_variance_metrics,
)
from rlvr_jax.advantages.filters import (
  DEFAULT_GROUP_FILTER,
  GROUP_FILTERS,
  GroupFilter,
  register_filter,
)
from rlvr_jax.advantages.group import (
  CopoAdvantages,
  canon_advantages,
  copo_advantages,
  dr_grpo_advantages,
  group_normalized_advantages,
  grpo_advantages,
  lite_ppo_advantages,
  remax_advantages,
  rloo_advantages,
)
from rlvr_jax.advantages.passk import (
  max_at_g_advantages,
  pass_at_k,
  passk_training_advantages,
  pkpo_advantages,
  pkpo_rewards,
)
from rlvr_jax.advantages.process import (
  StepSegments,
  group_loo_token_rewards,
  implicit_process_rewards,
  min_form_credit,
  prime_advantages,
  pure_advantages,
  pure_token_advantages,
  segment_steps,
  step_sums,
  token_rloo_returns,
)
from rlvr_jax.advantages.registry import (
  DEFAULT_ESTIMATOR,
  ESTIMATORS,
  READS,
  SEQUENCE_ESTIMATORS,
  Estimate,
  EstimatorSpec,
  get_estimator,
  register_estimator,
)
from rlvr_jax.advantages.riskpo import (
  DEFAULT_LEVELS,
  RiskPOState,
  riskpo_advantages,
  riskpo_init,
  riskpo_tracker_update,
)
from rlvr_jax.advantages.segments import (
  SegmentTree,
  complete_tree,
  pivotal_mask,
  r3l_advantages,
  r3l_token_advantages,
  spo_chain_advantages,
  spo_chain_token_advantages,
  spo_cutpoints,
  spo_segments,
  spo_tree_token_advantages,
  tree_advantages,
  tree_values,
)
from rlvr_jax.advantages.std_filter import (
  StdFilterState,
  rlpr_std_filter,
  std_filter_init,
)
from rlvr_jax.advantages.token_level import (
  discounted_returns,
  gae_advantages,
  reinforce_plus_plus_advantages,
  reinforce_plus_plus_baseline_advantages,
)
from rlvr_jax.advantages.turn_estimators import (
  a2tgpo_token_advantages,
  mapo_token_advantages,
  matchtir_token_advantages,
  turn_norm_advantages,
)
from rlvr_jax.advantages.turns import (
  a2tgpo_advantages,
  depth_scaled_returns,
  discounted_turn_returns,
  episode_return,
  gated_return,
  geometric_outcome_credit,
  mapo_advantages,
  matchtir_advantages,
  turn_clip_range,
  turn_group_normalize,
  turn_values_to_tokens,
)

__all__ = [
  "SegmentTree",
  "complete_tree",
  "pivotal_mask",
  "r3l_advantages",
  "r3l_token_advantages",
  "spo_chain_advantages",
  "spo_cutpoints",
  "spo_chain_token_advantages",
  "spo_segments",
  "spo_tree_token_advantages",
  "tree_advantages",
  "tree_values",
  "a2tgpo_token_advantages",
  "mapo_token_advantages",
  "matchtir_token_advantages",
  "turn_norm_advantages",
  "DEFAULT_ESTIMATOR",
  "DEFAULT_GROUP_FILTER",
  "ESTIMATORS",
  "GROUP_FILTERS",
  "GroupFilter",
  "register_filter",
  "READS",
  "SEQUENCE_ESTIMATORS",
  "Estimate",
  "EstimatorSpec",
  "get_estimator",
  "register_estimator",
  "DEFAULT_LEVELS",
  "CopoAdvantages",
  "RiskPOState",
  "canon_advantages",
  "copo_advantages",
  "discounted_returns",
  "dr_grpo_advantages",
  "gae_advantages",
  "gradient_group_fraction",
  "group_normalized_advantages",
  "grpo_advantages",
  "handle_zero_variance",
  "lite_ppo_advantages",
  "masked_whiten",
  "max_at_g_advantages",
  "pass_at_k",
  "passk_training_advantages",
  "pkpo_advantages",
  "pkpo_rewards",
  "reinforce_plus_plus_advantages",
  "reinforce_plus_plus_baseline_advantages",
  "remax_advantages",
  "riskpo_advantages",
  "riskpo_init",
  "riskpo_tracker_update",
  "rloo_advantages",
  "to_groups",
  "to_tokens",
  "valid_mask",
  "zero_variance_groups",
  "zero_variance_metrics",
  "a2tgpo_advantages",
  "depth_scaled_returns",
  "discounted_turn_returns",
  "episode_return",
  "gated_return",
  "geometric_outcome_credit",
  "mapo_advantages",
  "matchtir_advantages",
  "turn_clip_range",
  "turn_group_normalize",
  "turn_values_to_tokens",
  "StdFilterState",
  "StepSegments",
  "group_loo_token_rewards",
  "implicit_process_rewards",
  "min_form_credit",
  "prime_advantages",
  "pure_advantages",
  "pure_token_advantages",
  "step_sums",
  "rlpr_std_filter",
  "segment_steps",
  "std_filter_init",
  "token_rloo_returns",
]
