"""The objective registry: every objective is ONE immutable description (``ObjectiveSpec``) in ONE
table (``OBJECTIVES``). The trainer, the config validation and the docs read these descriptions and
contain no objective names (``docs/design.md``, "Methods are values").

A description says everything the trainer needs to know about an objective besides its math:

* ``fn``: the pure loss, ``fn(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
  ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None, **hp) -> (loss, metrics)``
  (the uniform signature, ``rlvr_jax.losses``). The spec is itself callable with that signature
  (``OBJECTIVES[name](...)`` calls ``fn``) and ``inspect.signature(spec)`` is ``fn``'s.
* ``token_local``: its gradient w.r.t. (logp_t, H_t) depends only on token t (at 'step' scope, no
  OPSM), so the trainer may fuse it into the log-prob sweep (``logprobs.fused_objective_from_hidden``).
* ``step_stats`` / ``stat_kwargs``: the statistics of the WHOLE step batch it needs (a no-grad pre-pass
  computes them once per step, before the accumulation loop) and the keyword names they are passed
  under; ``stats_always`` when they are needed whatever ``scope`` says (SIREN's H_sel).
* ``inputs``: the extra per-token / per-sequence arrays it reads (``Input``: name, shape and where the
  trainer gets them: ``step_noise``, ``proxy_logp``, ``estimator`` outputs, or ``caller`` = optional,
  never filled by the trainer).
* ``state``: for stateful objectives, the state carried between steps (``MethodState``: initial value,
  the keyword arguments it gives each step, and its update after the step).

``register_objective(spec)`` adds a user's own objective (the trainer then runs it by name).
``TOKEN_LOCAL_OBJECTIVES``, ``STEP_STAT_OBJECTIVES``, ``is_token_local`` and ``step_statistics`` are
views of the table kept for existing callers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from rlvr_jax import regularizers as reg
from rlvr_jax.losses import selection as sel
from rlvr_jax.losses.engine import CommonOptions, require
from rlvr_jax.losses.recipes import (
  cispo_objective,
  copo_objective,
  dapo_objective,
  dr_grpo_objective,
  gmpo_objective,
  gppo_objective,
  grpo_objective,
  gspo_objective,
  lite_ppo_objective,
  ppo_objective,
  riskpo_objective,
  sapo_objective,
)
from rlvr_jax.losses.recipes_entropy import (
  clip_cov_objective,
  high_entropy_objective,
  kl_cov_objective,
  lp_reg_objective,
  siren_objective,
  steer_objective,
)

# Where the trainer gets an extra objective input from (``Input.source``).
INPUT_SOURCES = {
  "step_noise": "one uniform [0, 1) draw per token of the step batch, from the step's key",
  "proxy_logp": "log-probs of the min-p filtered policy at temperature 1 (a no-grad rollout pass)",
  "estimator": "an extra output of the advantage estimator (EstimatorSpec.outputs)",
  "caller": "optional; the trainer leaves it unset (the objective has a default)",
}
# Keyword arguments of every objective that the trainer fills (never settings).
BATCH_KWARGS = frozenset(
  {
    "num_tokens",
    "num_seqs",
    "ref_logp",
    "sampler_logp",
    "entropy",
    "mean_log_softmax",
    "group_size",
  }
)


@dataclasses.dataclass(frozen=True)
class Input:
  """An extra array an objective reads: keyword ``name``, ``shape`` ('[B, T]' or '[B]'), and where
  the trainer gets it (``source``, a key of ``INPUT_SOURCES``)."""

  name: str
  source: str
  shape: str = "[B, T]"

  def __post_init__(self):
    if self.source not in INPUT_SOURCES:
      raise ValueError(
        f"Input {self.name!r}: source {self.source!r} not in {sorted(INPUT_SOURCES)}"
      )


@dataclasses.dataclass(frozen=True)
class MethodState:
  """State a method carries between steps (a pytree of arrays, checkpointed with the run).

  Attributes:
    init: ``init(hp) -> state`` from the objective's keyword hyperparameters ``hp``.
    step_kwargs: ``step_kwargs(state, stats, hp) -> dict`` of keyword arguments the objective gets
      in this step (``stats``: this step's ``step_stats``, computed before it).
    update: ``update(state, stats, metrics, hp) -> state`` after the step (``metrics``: the step's
      finalized scalars, e.g. ``entropy/mean``).
    kwargs: the keyword names ``step_kwargs`` returns (they are not settings).
  """

  init: Callable[[dict], Any]
  step_kwargs: Callable[[Any, dict, dict], dict]
  update: Callable[[Any, dict, dict, dict], Any]
  kwargs: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class ObjectiveSpec:
  """One objective as a value (see the module docstring). Hashable, so it can be a static argument
  of ``jax.jit``; calling it calls ``fn``."""

  name: str
  fn: Callable
  token_local: bool = False
  step_stats: Callable | None = None
  stat_kwargs: tuple[str, ...] = ()
  stats_always: bool = False
  inputs: tuple[Input, ...] = ()
  state: MethodState | None = None
  paper: str = ""

  def __post_init__(self):
    if not self.name or not isinstance(self.name, str):
      raise ValueError(f"an objective needs a non-empty string name, got {self.name!r}")
    if not callable(self.fn):
      raise TypeError(f"objective {self.name!r}: fn must be callable, got {self.fn!r}")
    if (self.step_stats is None) != (not self.stat_kwargs):
      raise ValueError(f"objective {self.name!r}: step_stats and stat_kwargs go together")

  def __call__(self, *args, **kwargs):
    return self.fn(*args, **kwargs)

  @property
  def __wrapped__(self):  # inspect.signature(spec) follows this to fn's signature
    return self.fn

  @property
  def summary(self) -> str:
    """The first line of ``fn``'s docstring (the METHODS table's description)."""
    return (self.fn.__doc__ or "").strip().splitlines()[0] if self.fn.__doc__ else ""

  def hyperparameters(self) -> dict[str, Any]:
    """Name -> default of the keyword settings (arrays the trainer fills are left out)."""
    defaults = dict(getattr(self.fn, "__kwdefaults__", None) or {})
    return {k: v for k, v in defaults.items() if k not in self.array_kwargs()}

  def array_kwargs(self) -> frozenset[str]:
    """Keyword names that carry arrays or state rather than settings."""
    state = self.state.kwargs if self.state is not None else ()
    return BATCH_KWARGS | {i.name for i in self.inputs} | set(self.stat_kwargs) | set(state)

  def needs_step_stats(self, options: Mapping) -> bool:
    """Whether the trainer must run the statistics pre-pass for these keyword ``options``."""
    if self.step_stats is None:
      return False
    return self.stats_always or options.get("scope", "step") == "step"

  def is_token_local(self, options: Mapping) -> bool:
    """Token-local gradient with these options: a token-local recipe at 'step' scope (statistics
    computed beforehand) without off-policy sequence masking."""
    return (
      self.token_local
      and options.get("scope", "step") == "step"
      and options.get("opsm_threshold") is None
    )

  def inputs_from(self, source: str) -> tuple[Input, ...]:
    return tuple(i for i in self.inputs if i.source == source)


# ----------------------------------------------------------------------------------------------
# Step statistics (computed over the whole step batch, no gradient; METHODS.md §1.3).


def _clip_cov_stats(logp, old_logp, advantages, completion_mask, *, noise=None, **hp):
  kw = {k: hp[k] for k in ("clip_cov_ratio", "cov_low", "cov_high", "clip_low", "clip_high")
        if k in hp}  # fmt: skip
  noise = require(noise, "noise [B, T]", "step_statistics('clip_cov')")
  return {"cov_stats": sel.clip_cov_stats(logp, old_logp, advantages, completion_mask, noise, **kw)}


def _kl_cov_stats(logp, old_logp, advantages, completion_mask, **hp):
  kw = {"kl_cov_ratio": hp.get("kl_cov_ratio", 2e-4)}
  return {"cov_stats": sel.kl_cov_stats(logp, advantages, completion_mask, **kw)}


def _high_entropy_stats(logp, old_logp, advantages, completion_mask, *, entropy=None, **hp):
  h = require(entropy, "entropy", "step_statistics('high_entropy')")
  kw = {k: hp[k] for k in ("top_entropy_frac", "top_entropy_rule") if k in hp}
  return {"entropy_threshold": sel.high_entropy_threshold(h, completion_mask, **kw)}


def _steer_stats(logp, old_logp, advantages, completion_mask, *, entropy=None, **hp):
  h = require(entropy, "entropy", "step_statistics('steer')")
  omega = sel.steer_omega(logp, old_logp, advantages, h)
  return {"omega_range": sel.steer_omega_range(omega, completion_mask)}


def _lp_reg_stats(logp, old_logp, advantages, completion_mask, **hp):
  frac = hp.get("lp_reg_frac", 0.01)
  return {"lp_threshold": reg.lp_reg_threshold(logp, advantages, completion_mask, lp_reg_frac=frac)}


def _siren_stats(logp, old_logp, advantages, completion_mask, *, entropy=None, num_tokens=None,
                 num_seqs=None, **hp):  # fmt: skip
  h = require(hp.get("nucleus_entropy", entropy), "nucleus_entropy", "step_statistics('siren')")
  _, h_sel = reg.siren_penalty(
    jax.lax.stop_gradient(h), completion_mask, anchor=0.0, num_tokens=num_tokens, num_seqs=num_seqs,
    quantile=hp.get("siren_quantile", 0.8),
  )  # fmt: skip
  return {"siren_selected_entropy": h_sel}


# SIREN's anchor: H_sel of the first step batch, then frozen (NaN = not set yet).
def _siren_anchor(state, stats, hp):
  return jnp.where(jnp.isnan(state), stats["siren_selected_entropy"], state)


SIREN_STATE = MethodState(
  init=lambda hp: jnp.asarray(jnp.nan, jnp.float32),
  step_kwargs=lambda state, stats, hp: {"siren_anchor": _siren_anchor(state, stats, hp)},
  update=lambda state, stats, metrics, hp: _siren_anchor(state, stats, hp),
  kwargs=("siren_anchor",),
)

# ----------------------------------------------------------------------------------------------
# The table.

DEFAULT_OBJECTIVE = "grpo"  # the config's default

_PPO_LIKE = dict(token_local=True)
OBJECTIVES: dict[str, ObjectiveSpec] = {}


def register_objective(spec: ObjectiveSpec, *, replace: bool = False) -> ObjectiveSpec:
  """Adds ``spec`` to ``OBJECTIVES`` (the trainer can then run it as ``objective.name=<spec.name>``).

  Raises ValueError if the name is taken by a different spec (``replace=True`` overrides). Returns
  the spec, so it can be used as ``MY = register_objective(ObjectiveSpec(...))``.
  """
  if not isinstance(spec, ObjectiveSpec):
    raise TypeError(f"register_objective takes an ObjectiveSpec, got {type(spec).__name__}")
  old = OBJECTIVES.get(spec.name)
  if old is not None and old != spec and not replace:
    raise ValueError(f"objective {spec.name!r} is already registered ({old.fn.__name__})")
  OBJECTIVES[spec.name] = spec
  return spec


for _spec in (
  ObjectiveSpec("ppo", ppo_objective, **_PPO_LIKE, paper="arXiv 1707.06347"),
  ObjectiveSpec("grpo", grpo_objective, **_PPO_LIKE, paper="arXiv 2402.03300"),
  ObjectiveSpec("dr_grpo", dr_grpo_objective, **_PPO_LIKE, paper="arXiv 2503.20783"),
  ObjectiveSpec("dapo", dapo_objective, **_PPO_LIKE, paper="arXiv 2503.14476"),
  ObjectiveSpec("lite_ppo", lite_ppo_objective, **_PPO_LIKE, paper="arXiv 2508.08221"),
  ObjectiveSpec("riskpo", riskpo_objective, **_PPO_LIKE, paper="arXiv 2510.00911"),
  ObjectiveSpec("gppo", gppo_objective, **_PPO_LIKE, paper="arXiv 2508.07629"),
  ObjectiveSpec("gspo", gspo_objective, paper="arXiv 2507.18071"),
  ObjectiveSpec("gmpo", gmpo_objective, paper="arXiv 2507.20673"),
  ObjectiveSpec("cispo", cispo_objective, **_PPO_LIKE, paper="arXiv 2506.13585"),
  ObjectiveSpec("sapo", sapo_objective, **_PPO_LIKE, paper="arXiv 2511.20347"),
  ObjectiveSpec(
    "copo",
    copo_objective,
    **_PPO_LIKE,
    paper="arXiv 2508.04138",
    inputs=(Input("global_advantages", "estimator"), Input("local_weight", "estimator")),
  ),  # fmt: skip
  ObjectiveSpec(
    "clip_cov",
    clip_cov_objective,
    **_PPO_LIKE,
    paper="arXiv 2505.22617",
    step_stats=_clip_cov_stats,
    stat_kwargs=("cov_stats",),
    inputs=(Input("noise", "step_noise"), Input("key", "caller", shape="PRNG key")),
  ),  # fmt: skip
  ObjectiveSpec(
    "kl_cov",
    kl_cov_objective,
    **_PPO_LIKE,
    paper="arXiv 2505.22617",
    step_stats=_kl_cov_stats,
    stat_kwargs=("cov_stats",),
  ),  # fmt: skip
  ObjectiveSpec(
    "high_entropy",
    high_entropy_objective,
    **_PPO_LIKE,
    paper="arXiv 2506.01939",
    step_stats=_high_entropy_stats,
    stat_kwargs=("entropy_threshold",),
  ),  # fmt: skip
  ObjectiveSpec(
    "steer",
    steer_objective,
    **_PPO_LIKE,
    paper="arXiv 2510.10150",
    step_stats=_steer_stats,
    stat_kwargs=("omega_range",),
  ),  # fmt: skip
  ObjectiveSpec(
    "lp_reg",
    lp_reg_objective,
    **_PPO_LIKE,
    paper="arXiv 2510.03222",
    step_stats=_lp_reg_stats,
    stat_kwargs=("lp_threshold",),
    inputs=(Input("proxy_logp", "proxy_logp"),),
  ),  # fmt: skip
  ObjectiveSpec(
    "siren",
    siren_objective,
    **_PPO_LIKE,
    paper="arXiv 2509.25133",
    step_stats=_siren_stats,
    stat_kwargs=("siren_selected_entropy",),
    stats_always=True,
    inputs=(Input("nucleus_entropy", "caller"),),
    state=SIREN_STATE,
  ),  # fmt: skip
):
  register_objective(_spec)


def get_objective(name: str) -> ObjectiveSpec:
  """The registered spec; ValueError naming the known objectives otherwise."""
  if name not in OBJECTIVES:
    raise ValueError(f"unknown objective {name!r}; known: {sorted(OBJECTIVES)}")
  return OBJECTIVES[name]


# ----------------------------------------------------------------------------------------------
# Views kept for existing callers.


class _NameView:
  """A live, read-only tuple-like view of the names of ``OBJECTIVES`` whose spec satisfies a test
  (so objectives registered later appear in it)."""

  def __init__(self, test: Callable[[ObjectiveSpec], bool], doc: str):
    self._test, self.__doc__ = test, doc

  def _names(self) -> tuple[str, ...]:
    return tuple(n for n, s in OBJECTIVES.items() if self._test(s))

  def __iter__(self) -> Iterator[str]:
    return iter(self._names())

  def __contains__(self, name) -> bool:
    return name in self._names()

  def __len__(self) -> int:
    return len(self._names())

  def __getitem__(self, i):
    return self._names()[i]

  def __repr__(self) -> str:
    return repr(self._names())


TOKEN_LOCAL_OBJECTIVES = _NameView(
  lambda s: s.token_local, "Names of the objectives whose spec says token_local."
)
STEP_STAT_OBJECTIVES = _NameView(
  lambda s: s.step_stats is not None, "Names of the objectives with step statistics."
)


def is_token_local(name: str, options: Mapping) -> bool:
  """``OBJECTIVES[name].is_token_local(options)`` (False for unknown names)."""
  spec = OBJECTIVES.get(name)
  return spec is not None and spec.is_token_local(options)


def step_statistics(name, logp, old_logp, advantages, completion_mask, *, num_tokens=None,
                    num_seqs=None, entropy=None, noise=None, **hyperparameters) -> dict:  # fmt: skip
  """The extra keyword arguments objective ``name`` needs at 'step' scope, computed over the WHOLE
  step batch (call it once per step, jitted, before the accumulation loop, with no gradient, and
  pass the result to every micro-batch call). ``logp`` is the current policy's log-prob from that
  pre-pass (old_logp is a rollout-time approximation). Returns {} for objectives without step
  statistics. ``hyperparameters`` are the objective's own (unused ones are ignored).

  Example (trainer)::

    spec = losses.OBJECTIVES[name]
    extra = spec.step_stats(logp_nograd, old_logp, adv, mask, entropy=h, noise=u,
                            num_tokens=n_tok, num_seqs=n_seq, **hyper)
    for micro in micro_batches:  # slice the [B, T] inputs, keep `extra` whole
      loss, metrics = spec(..., **extra, **hyper)
  """
  if name not in OBJECTIVES:
    raise ValueError(f"unknown objective {name!r}; known: {sorted(OBJECTIVES)}")
  spec = OBJECTIVES[name]
  if spec.step_stats is None:
    return {}
  lp = jax.lax.stop_gradient(jnp.asarray(logp, jnp.float32))
  return spec.step_stats(
    lp, old_logp, advantages, completion_mask, num_tokens=num_tokens, num_seqs=num_seqs,
    entropy=entropy, noise=noise, **hyperparameters,
  )  # fmt: skip


def common_option_names() -> tuple[str, ...]:
  return tuple(f.name for f in dataclasses.fields(CommonOptions))
