"""The estimator registry: every advantage estimator is ONE immutable description (``EstimatorSpec``)
in ONE table (``ESTIMATORS``). The rollout collector and the config validation read the descriptions
(what an estimator reads, what it returns besides the advantages, the state it carries) and contain no
estimator names (``docs/design.md``, "Methods are values").

An estimator reads named inputs from the rollout (``READS``: the rewards always; group answer ids, a
greedy rollout's reward, per-token rewards, critic values, ...) and returns an ``Estimate``: the
advantages (``[P, G]`` at sequence level, ``[B, T]`` at token level), extra arrays for the objective
(``outputs``, e.g. COPO's global advantages and local weights), and its next state (RiskPO's quantile
tracker). ``register_estimator(spec)`` adds a user's own. ``SEQUENCE_ESTIMATORS`` is a view: the
sequence-level estimators that read nothing but the rewards, as name -> function.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import jax

from rlvr_jax.advantages import group, passk, riskpo, segments, token_level

# The inputs an estimator may read, with their shapes. ``valid`` ([P, G] bool, False where the
# reward failed) is always passed and is not listed.
READS = {
  "rewards": "[P, G] float32 sequence rewards (NaN = failed)",
  "completion_mask": "[B, T] bool, True on completion tokens (B = P * G, group ordered)",
  "answer_ids": "[P, G] int32, equal within a group iff the extracted answers are equal",
  "greedy_rewards": "[P] float32, the reward of one extra greedy (temperature 0) rollout per prompt",
  "metric": "[P, G] float32 per-response metric (CANON: mean rollout entropy, or the length)",
  "token_rewards": "[B, T] float32 per-token rewards",
  "completion_tokens": "[B, T] int32 the completion token ids",
  "prm_token_rewards": "[B, T] float32 token rewards of an implicit PRM, beta (log pi_phi - log pi_ref)",
  "values": "[B, T] float32 critic values",
  "old_logp": "[B, T] float32 log-probs of the sampled tokens under the sampling policy",
  "ref_logp": "[B, T] float32 log-probs of the sampled tokens under the reference policy",
  "sum_pi_squared": "[B, T] float32 sum_v pi(v)^2 of the sampling distribution at each token",
  "reward_components": "[P, G, K] float32 reward components before they are summed",
  "turn_rewards": "[B, K] float32 per-turn rewards of multi-turn episodes (NaN = missing turn)",
  "turn_index": "[B, T] int32 turn k (1-based) of each action token, 0 on observations/padding",
  "segment_values": "[B, M] float32 SPO values: the prompt's, then the Monte Carlo value of the "
  "prefix before each segment (the collector's branch round)",
  "segment_ids": "[B, T] int32 SPO segment of each completion token (-1 off the mask)",
  "num_segments": "[B] int32 SPO segments per row",
  "spo_cutpoints": "[B, T] bool completion tokens with pi_old(y_t) < spo.prob_threshold",
  "tree_values": "[B, M] float32 SPO-tree: the values (mean leaf reward) of each row's ancestors "
  "at depths 0..M-1 of its prompt's sampling tree (the collector's tree round)",
  "retry_prefix": "[B] int32 R3L: completion tokens a row shares with the trajectory it retries "
  "or was retried from, 0 outside retry pairs (the collector's retry round)",
}
LEVELS = ("sequence", "token")


class Estimate(NamedTuple):
  """What an estimator returns: ``advantages`` ([P, G] or [B, T]), ``extras`` (name -> array, the
  objective's extra inputs, [P, G] or [B, T]) and ``state`` (None for stateless estimators)."""

  advantages: jax.Array
  extras: dict
  state: Any = None


def _keyword_call(spec, inputs, state, hp) -> Estimate:
  """The default adapter: ``fn(**reads, valid=valid, **hp)`` returns the advantages."""
  kwargs = {name: inputs[name] for name in spec.reads}
  return Estimate(spec.fn(**kwargs, valid=inputs.get("valid"), **hp), {}, None)


@dataclasses.dataclass(frozen=True)
class EstimatorSpec:
  """One advantage estimator as a value (hashable: usable as a static ``jax.jit`` argument).

  Attributes:
    name: the config name (``rl.advantage``).
    fn: the library function (its docstring has the formula and the paper).
    level: 'sequence' (advantages [P, G]) or 'token' ([B, T]).
    reads: keys of ``READS`` it needs (``rewards`` first).
    outputs: extra arrays it returns for the objective (``Estimate.extras`` keys); the objective
      must read them (``losses.Input`` with source 'estimator').
    init_state: ``init_state(hp) -> state`` for stateful estimators (the state is then threaded
      through ``compute`` and checkpointed with the run).
    call: ``call(spec, inputs, state, hp) -> Estimate`` when ``fn`` does not have the plain keyword
      form ``fn(**reads, valid=..., **hp) -> advantages``.
    static: hyperparameter names that change the program (ints, strings): static under jit.
    check: ``check(num_prompts, group_size, hp) -> error message | None``, run by the config
      validation before anything is built.
    paper: the reference.
  """

  name: str
  fn: Callable
  level: str = "sequence"
  reads: tuple[str, ...] = ("rewards",)
  outputs: tuple[str, ...] = ()
  init_state: Callable[[dict], Any] | None = None
  call: Callable | None = None
  static: tuple[str, ...] = ()
  check: Callable[[int, int, dict], str | None] | None = None
  paper: str = ""

  def __post_init__(self):
    if self.level not in LEVELS:
      raise ValueError(f"estimator {self.name!r}: level {self.level!r} not in {LEVELS}")
    unknown = [r for r in self.reads if r not in READS]
    if unknown or not self.reads or self.reads[0] != "rewards":
      raise ValueError(
        f"estimator {self.name!r}: reads {self.reads} must start with 'rewards' and name keys of "
        f"READS {sorted(READS)} (unknown: {unknown})"
      )

  def compute(self, inputs: Mapping, state: Any = None, **hp) -> Estimate:
    """Runs the estimator on ``inputs`` (``READS`` keys plus ``valid``) with hyperparameters."""
    missing = [r for r in self.reads if inputs.get(r) is None]
    if missing:
      raise ValueError(f"estimator {self.name!r} reads {missing}, which were not given")
    if self.init_state is not None and state is None:
      raise ValueError(f"estimator {self.name!r} is stateful: pass state (init_state(hp) at start)")
    out = (self.call or _keyword_call)(self, inputs, state, hp)
    extra = sorted(set(out.extras) ^ set(self.outputs))
    if extra:
      raise ValueError(f"estimator {self.name!r}: extras {sorted(out.extras)} != {self.outputs}")
    return out

  @property
  def summary(self) -> str:
    return (self.fn.__doc__ or "").strip().splitlines()[0] if self.fn.__doc__ else ""

  @property
  def stateful(self) -> bool:
    return self.init_state is not None

  def hyperparameters(self) -> dict[str, Any]:
    """Name -> default of ``fn``'s keyword settings (``READS`` inputs, ``valid``, ``state`` and
    ``axis_name`` left out; a required one has default None)."""
    code = self.fn.__code__
    names = code.co_varnames[code.co_argcount : code.co_argcount + code.co_kwonlyargcount]
    defaults = dict(self.fn.__kwdefaults__ or {})
    skip = set(READS) | {"valid", "state", "axis_name"}
    return {n: defaults.get(n) for n in names if n not in skip}

  def required_hyperparameters(self) -> tuple[str, ...]:
    """The keyword settings of ``fn`` without a default (e.g. pass@k's ``k``)."""
    defaults = self.fn.__kwdefaults__ or {}
    return tuple(n for n in self.hyperparameters() if n not in defaults)


# ----------------------------------------------------------------------------------------------
# Adapters for the estimators without the plain keyword form.


def _remax_call(spec, inputs, state, hp) -> Estimate:
  adv = spec.fn(inputs["rewards"], inputs["greedy_rewards"], valid=inputs.get("valid"), **hp)
  return Estimate(adv, {}, None)


def _copo_call(spec, inputs, state, hp) -> Estimate:
  out = spec.fn(inputs["rewards"], inputs["answer_ids"], valid=inputs.get("valid"), **hp)
  extras = {"global_advantages": out.global_advantages, "local_weight": out.local_weight}
  return Estimate(out.local_advantages, extras, None)


def _riskpo_call(spec, inputs, state, hp) -> Estimate:
  adv, new_state = spec.fn(inputs["rewards"], state, valid=inputs.get("valid"), **hp)
  return Estimate(adv, {}, new_state)


def _riskpo_check(num_prompts, group_size, hp):
  b = hp.get("bundle_size", 5)
  if b < 1 or num_prompts % b:
    return f"bundle_size={b} must divide the {num_prompts} prompts of a step"
  return None


def _gae_call(spec, inputs, state, hp) -> Estimate:
  adv, _ = spec.fn(inputs["token_rewards"], inputs["values"], inputs["completion_mask"], **hp)
  return Estimate(adv, {}, None)


# ----------------------------------------------------------------------------------------------
# The table.

ESTIMATORS: dict[str, EstimatorSpec] = {}
DEFAULT_ESTIMATOR = "grpo"  # the config's default


def register_estimator(spec: EstimatorSpec, *, replace: bool = False) -> EstimatorSpec:
  """Adds ``spec`` to ``ESTIMATORS`` (selectable as ``rl.advantage=<spec.name>``); a taken name
  raises ValueError unless ``replace``. Returns the spec."""
  if not isinstance(spec, EstimatorSpec):
    raise TypeError(f"register_estimator takes an EstimatorSpec, got {type(spec).__name__}")
  old = ESTIMATORS.get(spec.name)
  if old is not None and old != spec and not replace:
    raise ValueError(f"estimator {spec.name!r} is already registered ({old.fn.__name__})")
  ESTIMATORS[spec.name] = spec
  return spec


def get_estimator(name: str) -> EstimatorSpec:
  if name not in ESTIMATORS:
    raise ValueError(f"unknown advantage estimator {name!r}; known: {sorted(ESTIMATORS)}")
  return ESTIMATORS[name]


_TOKEN = dict(level="token", reads=("rewards", "completion_mask"))
for _spec in (
  EstimatorSpec("grpo", group.grpo_advantages, paper="arXiv 2402.03300"),
  EstimatorSpec("dr_grpo", group.dr_grpo_advantages, paper="arXiv 2503.20783"),
  EstimatorSpec("lite_ppo", group.lite_ppo_advantages, paper="arXiv 2508.08221"),
  EstimatorSpec("rloo", group.rloo_advantages, paper="arXiv 2402.14740"),
  EstimatorSpec(
    "remax",
    group.remax_advantages,
    reads=("rewards", "greedy_rewards"),
    call=_remax_call,
    paper="arXiv 2310.10505",
  ),  # fmt: skip
  EstimatorSpec(
    "copo",
    group.copo_advantages,
    reads=("rewards", "answer_ids"),
    call=_copo_call,
    outputs=("global_advantages", "local_weight"),
    paper="arXiv 2508.04138",
  ),  # fmt: skip
  EstimatorSpec(
    "canon", group.canon_advantages, reads=("rewards", "metric"), paper="arXiv 2509.23962"
  ),  # fmt: skip
  EstimatorSpec(
    "passk_training", passk.passk_training_advantages, static=("k",), paper="arXiv 2508.10751"
  ),  # fmt: skip
  EstimatorSpec("pkpo", passk.pkpo_advantages, static=("k",), paper="arXiv 2505.15201"),
  EstimatorSpec("grpo_passk", passk.max_at_g_advantages, paper="arXiv 2503.19595"),
  EstimatorSpec(
    "riskpo",
    riskpo.riskpo_advantages,
    call=_riskpo_call,
    check=_riskpo_check,
    init_state=lambda hp: riskpo.riskpo_init(),
    paper="arXiv 2510.00911",
    static=("bundle_size", "risk_mode", "credit", "quantile_mode", "natural_baseline"),
  ),  # fmt: skip
  EstimatorSpec(
    "reinforce_plus_plus",
    token_level.reinforce_plus_plus_advantages,
    **_TOKEN,
    static=("whiten",),
    paper="arXiv 2501.03262",
  ),  # fmt: skip
  EstimatorSpec(
    "reinforce_plus_plus_baseline",
    token_level.reinforce_plus_plus_baseline_advantages,
    **_TOKEN,
    paper="arXiv 2501.03262",
  ),  # fmt: skip
  EstimatorSpec(
    "spo_chain",
    segments.spo_chain_token_advantages,
    level="token",
    reads=("rewards", "segment_values", "segment_ids", "num_segments", "spo_cutpoints"),
    static=("use_prob_mask",),
    paper="arXiv 2505.23564",
  ),  # fmt: skip
  EstimatorSpec(
    "spo_tree",
    segments.spo_tree_token_advantages,
    level="token",
    reads=("rewards", "tree_values", "segment_ids", "num_segments", "spo_cutpoints"),
    static=("use_prob_mask",),
    paper="arXiv 2505.23564",
  ),  # fmt: skip
  EstimatorSpec(
    "r3l",
    segments.r3l_token_advantages,
    level="token",
    reads=("rewards", "completion_mask", "retry_prefix"),
    static=("baseline",),
    paper="arXiv 2601.03715",
  ),  # fmt: skip
  EstimatorSpec(
    "gae",
    token_level.gae_advantages,
    level="token",
    call=_gae_call,
    static=("whiten",),
    reads=("rewards", "token_rewards", "values", "completion_mask"),
    paper="arXiv 1506.02438",
  ),  # fmt: skip
):
  register_estimator(_spec)


class _SequenceEstimators(Mapping):
  """Live view: name -> ``fn`` of the sequence-level, stateless estimators that read only the
  rewards and return nothing else (callable as ``fn(rewards, *, valid=None, **hp) -> [P, G]``)."""

  def _names(self):
    return [
      n
      for n, s in ESTIMATORS.items()
      if s.level == "sequence" and s.reads == ("rewards",) and not s.outputs and not s.stateful
      and s.call is None
    ]  # fmt: skip

  def __getitem__(self, name):
    if name not in self._names():
      raise KeyError(name)
    return ESTIMATORS[name].fn

  def __iter__(self) -> Iterator[str]:
    return iter(self._names())

  def __len__(self) -> int:
    return len(self._names())

  def __repr__(self) -> str:
    return f"SEQUENCE_ESTIMATORS({self._names()})"


SEQUENCE_ESTIMATORS = _SequenceEstimators()
