"""The trainer's view of the method registries (``losses.OBJECTIVES``, ``advantages.ESTIMATORS``,
``advantages.GROUP_FILTERS``): a configured method is a registered name or an import path
``package.module:attribute`` naming an ``ObjectiveSpec`` / ``EstimatorSpec`` (or a plain function,
wrapped with the defaults: a non-token-local objective, a sequence estimator reading the rewards).
Nothing here or elsewhere in ``train/`` names a method: what the trainer does for one is read
from its spec (docs/design.md, "Methods are values").
"""

from __future__ import annotations

import dataclasses

from rlvr_jax import advantages, losses
from rlvr_jax.rewards.registry import import_reward

# What the rollout collector can hand an estimator (``EstimatorSpec.reads``): the rewards, the
# completion mask, the ids of the extracted answers, the reward of one extra greedy rollout, and
# from the reward result the components of a component reward and per-token rewards (the last two
# only when the configured reward gives them: the collector says so, naming the estimator), and the
# token rewards of the implicit PRM when ``implicit_prm.enabled`` (the config ties the two).
PROVIDED_READS = frozenset(
  {"rewards", "completion_mask", "answer_ids", "greedy_rewards", "reward_components",
   "token_rewards", "prm_token_rewards", "completion_tokens",
   # SPO's branch round (train/branching.py): segments and the Monte Carlo values of prefixes
   "segment_values", "segment_ids", "num_segments", "spo_cutpoints",
   # SPO-tree's tree round (train/tree_round.py): the values of each leaf's ancestors
   "tree_values",
   # the retry round (train/retries.py): the prefix a row shares with its retry pair
   "retry_prefix"}
)  # fmt: skip
# What the multi-turn (episode) collector hands an estimator: the episode returns [P, G], the
# action-token mask, each turn's reward [B, K] and each token's turn [B, T] (``train/multiturn``).
EPISODE_READS = frozenset({"rewards", "completion_mask", "turn_rewards", "turn_index"})
# Where the trainer gets an objective's extra inputs from (``losses.Input.source``).
PROVIDED_SOURCES = frozenset({"step_noise", "proxy_logp", "estimator", "caller"})


def import_path(path: str):
  """The object at ``package.module:attribute`` (issue 14's resolver, shared with rewards)."""
  try:
    return import_reward(path)
  except (ImportError, AttributeError) as e:
    raise ValueError(f"{path!r}: {e}") from e


def objective(name: str) -> losses.ObjectiveSpec:
  """The spec of ``objective.name``: registered, or imported from ``module:attribute`` and
  registered under that path on first use."""
  if name in losses.OBJECTIVES or ":" not in name:
    return losses.get_objective(name)
  obj = import_path(name)
  if isinstance(obj, losses.ObjectiveSpec):
    spec = dataclasses.replace(obj, name=name)
  elif callable(obj):
    spec = losses.ObjectiveSpec(name, obj, paper=f"user objective {name}")
  else:
    raise ValueError(f"{name!r}: expected an ObjectiveSpec or a function, got {type(obj).__name__}")
  return losses.register_objective(spec)


def estimator(name: str) -> advantages.EstimatorSpec:
  """The spec of ``rl.advantage``: registered, or imported from ``module:attribute``."""
  if name in advantages.ESTIMATORS or ":" not in name:
    return advantages.get_estimator(name)
  obj = import_path(name)
  if isinstance(obj, advantages.EstimatorSpec):
    spec = dataclasses.replace(obj, name=name)
  elif callable(obj):
    spec = advantages.EstimatorSpec(name, obj, paper=f"user estimator {name}")
  else:
    raise ValueError(f"{name!r}: expected an EstimatorSpec or a function, got {type(obj).__name__}")
  return advantages.register_estimator(spec)


def array_kwargs() -> frozenset[str]:
  """Keyword arguments of any registered objective that are arrays the trainer fills or state,
  not settings (derived from the specs)."""
  out = set(losses.registry.BATCH_KWARGS)
  for spec in losses.OBJECTIVES.values():
    out |= spec.array_kwargs()
  return frozenset(out)


def check_pair(
  obj: losses.ObjectiveSpec, est: advantages.EstimatorSpec, *, episodes: bool = False
) -> str | None:
  """Why this objective and estimator cannot train together, or None: every read of the
  estimator must be provided (by the single-turn collector, or by the episode collector when
  ``episodes``), every input of the objective must have a source, and the estimator's extra
  outputs must be exactly the objective's ``estimator`` inputs."""
  provided = EPISODE_READS if episodes else PROVIDED_READS
  missing = [r for r in est.reads if r not in provided]
  if missing and not episodes and set(missing) <= EPISODE_READS:
    return (
      f"estimator {est.name!r} reads {missing}, which only multi-turn episodes give: set "
      "config.env.id (an environment) or pick a single-turn estimator"
    )
  if missing:
    what = "multi-turn episodes do" if episodes else "the trainer does"
    return (
      f"estimator {est.name!r} reads {missing}, which {what} not provide "
      f"(provided: {sorted(provided)})"
    )
  wanted = sorted(i.name for i in obj.inputs_from("estimator"))
  if wanted != sorted(est.outputs):
    return (
      f"objective {obj.name!r} reads {wanted} from the estimator and estimator {est.name!r} "
      f"returns {sorted(est.outputs)}: pair them so these agree"
    )
  return None
