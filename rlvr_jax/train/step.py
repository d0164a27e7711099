"""The jitted, donated train step and the no-grad scoring pass.

One optimiser update on a step batch of B rows split into M micro-batches:

  for each micro-batch m:  (L_m, metrics_m), g_m = value_and_grad(objective(logp_m, ...))
  L = sum_m L_m,  g = sum_m g_m          (each L_m is normalised by the GLOBAL N_tok / N_seq
                                          of the step batch, METHODS.md 1.2, so L and g equal
                                          the full-batch loss and gradient)
  if L and g are finite:  params, opt_state <- optax update(g)
  else:                   unchanged; num_skipped += 1

logp and the full-vocabulary entropy are recomputed from the final hidden states with
``rlvr_jax.logprobs.token_logprobs_from_hidden`` (chunked over T: the [B, T, V] logits are never
materialised) at the sampling temperature, so on-policy logp equals the sampler's log-prob.

Metrics (plain float32 scalars): ``loss``, every objective metric, ``entropy/mean``,
``logp_gap/mean`` and ``logp_gap/max`` (|trainer logp - sampler logp| over completion tokens; only
meaningful on the first update of a rollout batch, where params equal the sampler's),
``grad_norm`` (before clipping), ``param_norm``, ``update_norm``, ``skipped``.

LoRA (``StepConfig.lora``, ``make_train_step(lora=...)``): ``state.params`` holds the adapters only
(``rlvr_jax.model.lora``), so the optimiser state, the update and the norms are the adapters'; the
frozen base params come as the step's ``base`` argument (not donated, never updated). The model
runs on ``lora.merge(base, adapters)`` in the compute dtype: the gradients are those of
``lora.adapter_loss`` (the base behind ``stop_gradient``), merged per layer inside the layer scan
(``lora.attach`` and the decoder's hook) when the model config has ``remat``, else as a whole
tree; the no-grad statistics pass runs on the whole merged tree.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlvr_jax import logprobs, losses, model
from rlvr_jax.model import lora as lora_lib
from rlvr_jax.train import packing
from rlvr_jax.train.optimizer import OptimizerSpec
from rlvr_jax.train.state import TrainBatch, TrainState


def sequence_inputs(prompt_tokens, prompt_mask, completion_tokens):
  """Model inputs for prompt ++ completion.

  Args:
    prompt_tokens: [B, S_prompt] int32, left-padded.
    prompt_mask: [B, S_prompt] bool, True on real prompt tokens.
    completion_tokens: [B, T] int32.
  Returns:
    tokens [B, S] int32 and positions [B, S] int32 (S = S_prompt + T; -1 on prompt padding;
    completion positions continue after each row's prompt length).
  """
  prompt_tokens = jnp.asarray(prompt_tokens, jnp.int32)
  prompt_mask = jnp.asarray(prompt_mask, bool)
  if (
    prompt_tokens.shape != prompt_mask.shape or prompt_tokens.shape[0] != completion_tokens.shape[0]
  ):
    raise ValueError(
      f"prompt_tokens {prompt_tokens.shape}, prompt_mask {prompt_mask.shape} and "
      f"completion_tokens {completion_tokens.shape} must share B (and S_prompt)"
    )
  prompt_pos = jnp.where(prompt_mask, jnp.cumsum(prompt_mask, axis=1) - 1, -1)
  prompt_len = prompt_mask.sum(axis=1, dtype=jnp.int32)
  t = completion_tokens.shape[1]
  completion_pos = prompt_len[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
  tokens = jnp.concatenate([prompt_tokens, jnp.asarray(completion_tokens, jnp.int32)], axis=1)
  positions = jnp.concatenate([prompt_pos, completion_pos], axis=1).astype(jnp.int32)
  return tokens, positions


def completion_hidden(
  params,
  tokens,
  positions,
  *,
  num_completion: int,
  model_config,
  with_states: bool = False,
  prompt_group: int = 1,
  packed=None,
):
  """(hidden [B, T, D], unembed [D, V], targets [B, T]) for the last T tokens of ``tokens`` [B, S]:
  the final hidden states that predict them and the unembedding matrix. ``with_states`` appends
  the states AT those tokens ([B, T, D]: the one at a completion's last token predicts what
  follows it, where an auxiliary loss may read a self-reward).

  ``prompt_group`` G > 1: rows come in blocks of G with the same left-padded prompt (the first
  S - T columns; the caller guarantees it, ``shares_prompts``), and each prompt runs through the
  model once (``model.forward_shared_prompt``): the same values, P * Sp + B * T tokens of work
  instead of B * S.

  ``packed``: a ``packing.PackedLayout`` of these rows: the model runs on its rows and the states
  are gathered back to [B, T] (the same values; no work on padding)."""
  s = tokens.shape[1]
  if not 0 < num_completion < s:
    raise ValueError(
      f"num_completion={num_completion} must be in (0, S={s}) for tokens {tokens.shape}"
    )
  sp = s - num_completion
  targets = tokens[:, sp:]
  unembed = model.unembed_matrix(params, model_config)
  if packed is not None:
    if prompt_group > 1:
      raise ValueError("completion_hidden: packed rows and prompt_group > 1 exclude each other")
    hidden, _ = model.forward(
      params, packed.tokens, packed.positions, config=model_config,
      segment_ids=packed.segment_ids, max_segments=packed.max_segments,
    )  # fmt: skip
    flat = hidden.reshape(-1, hidden.shape[-1])
    h = packing.gather_rows(flat, packed.predict_index)
    states = packing.gather_rows(flat, packed.token_index)
  elif prompt_group > 1:
    G = prompt_group
    prompt_h, states = model.forward_shared_prompt(
      params, tokens[::G, :sp], positions[::G, :sp], targets, positions[:, sp:],
      config=model_config,
    )  # fmt: skip
    # The last prompt token (real: prompts are left-padded) predicts the first completion token.
    last = jnp.repeat(prompt_h[:, -1:], G, axis=0)
    h = jnp.concatenate([last, states[:, :-1]], axis=1)
  else:
    hidden, _ = model.forward(params, tokens, positions, config=model_config)
    # The hidden state at index i predicts token i + 1.
    h, states = hidden[:, sp - 1 : s - 1], hidden[:, sp:]
  return (h, unembed, targets, states) if with_states else (h, unembed, targets)


def whole_groups(rows: int, group: int, num_microbatches: int = 1) -> bool:
  """Whether ``rows`` split into ``num_microbatches`` micro-batches of whole blocks of ``group``
  rows (group > 1): the shape condition of ``prompt_group``."""
  return group > 1 and rows % num_microbatches == 0 and (rows // num_microbatches) % group == 0


def shares_prompts(prompt_tokens, prompt_mask, group: int, num_microbatches: int = 1) -> bool:
  """Whether rows [B, Sp] (host arrays) come in blocks of ``group`` identical prompts with whole
  blocks in each of the ``num_microbatches`` micro-batches: the condition of ``prompt_group``."""
  tokens, mask = np.asarray(prompt_tokens), np.asarray(prompt_mask)
  B = tokens.shape[0]
  if not whole_groups(B, group, num_microbatches):
    return False
  t, m = tokens.reshape(B // group, group, -1), mask.reshape(B // group, group, -1)
  same_mask = (m == m[:, :1]).all()
  return bool(same_mask and (np.where(m, t, 0) == np.where(m[:, :1], t[:, :1], 0)).all())


def completion_logprobs(
  params, tokens, positions, *, num_completion: int, model_config, temperature, chunk_size,
  prompt_group: int = 1, packed=None,
):  # fmt: skip
  """logp [B, T] and entropy [B, T] (float32) of the last T tokens of ``tokens`` [B, S]
  (``prompt_group``, ``packed``: see ``completion_hidden``)."""
  h, unembed, targets = completion_hidden(
    params, tokens, positions, num_completion=num_completion, model_config=model_config,
    prompt_group=prompt_group, packed=packed,
  )  # fmt: skip
  return logprobs.token_logprobs_from_hidden(
    h, unembed, targets, temperature=temperature, chunk_size=chunk_size, compute_entropy=True
  )


def split_microbatches(tree, num_microbatches: int):
  """Micro-batch split: [B, ...] leaves -> [M, B / M, ...]."""

  def one(x):
    if x.shape[0] % num_microbatches:
      raise ValueError(
        f"batch rows {x.shape[0]} not divisible by num_microbatches={num_microbatches}"
      )
    return x.reshape(num_microbatches, x.shape[0] // num_microbatches, *x.shape[1:])

  return jax.tree.map(one, tree)


def _masked_pair(x, mask):
  """(sum, count) metric pair of x over mask."""
  mask = mask.astype(jnp.float32)
  return jnp.sum(x * mask), jnp.sum(mask)


@dataclasses.dataclass(frozen=True)
class StepConfig:
  """Everything static about the train step: hashable, the static argument of ``train_step``, so
  ``jax.jit`` compiles once per distinct configuration (no hand-keyed cache).

  Attributes:
    model_config: the ``model.ModelConfig``.
    optimizer: the optax transformation (its state is ``state.opt_state``).
    objective: the ``losses.ObjectiveSpec`` (what the step computes and reads).
    objective_kwargs: its keyword hyperparameters, as sorted (name, value) pairs.
    num_microbatches: M; B must be divisible by M.
    temperature: sampling temperature tau (logits are divided by it).
    chunk_size: T-chunk of the log-prob computation.
    on_policy: the step batch is the only update on its rollout batch: old_logp = sg(logp) and
      ``batch.old_logp`` is ignored.
    fused: the objective is fused into the log-prob sweep (``logprobs.fused_objective_from_hidden``).
    prompt_group: G > 1: every micro-batch's rows come in blocks of G sharing their prompt, run
      once per block (``completion_hidden``); 1: every row runs its own prompt.
    auxiliary: a ``losses.AuxiliarySpec`` added to the loss of every micro-batch, or None.
    auxiliary_kwargs: its keyword settings, as sorted (name, value) pairs.
    lora: a ``model.lora.LoraConfig``: ``state.params`` are the adapters of the frozen base the
      step takes as its ``base`` argument (module docstring); None: full fine-tuning.
  """

  model_config: Any
  optimizer: Any
  objective: losses.ObjectiveSpec
  objective_kwargs: tuple = ()
  num_microbatches: int = 1
  temperature: float = 1.0
  chunk_size: int = 128
  on_policy: bool = False
  fused: bool = False
  prompt_group: int = 1
  auxiliary: Any = None
  auxiliary_kwargs: tuple = ()
  lora: Any = None

  @property
  def hp(self) -> dict:
    return dict(self.objective_kwargs)


def model_params(cfg: StepConfig, params, base=None):
  """The params tree the model runs on: ``params`` itself, or with LoRA the merge of the base and
  the adapters ``params`` in the compute dtype (``lora.merge``)."""
  if cfg.lora is None:
    return params
  return lora_lib.merge(_frozen_base(base), params, cfg.lora, cfg.model_config.activation_dtype)


def _frozen_base(base):
  if base is None:
    raise ValueError("a LoRA step (StepConfig.lora) needs the frozen base params (base=...)")
  return base


def init_extra(objective, objective_kwargs: dict | None = None) -> dict:
  """The ``state.extra`` entries the objective carries between steps (``{}`` if stateless):
  ``{"objective": spec.state.init(hp)}``."""
  spec = losses.get_objective(objective) if isinstance(objective, str) else objective
  if spec.state is None:
    return {}
  return {"objective": spec.state.init(dict(objective_kwargs or {}))}


# ------------------------------------------------------------------------------------------------
# The parts of one step, in the order ``_train_step`` runs them (docs/design.md, "The train step").


def score(cfg: StepConfig, params, mb: TrainBatch):
  """(logp, entropy) [B, T] of the micro-batch's completion tokens under ``params``."""
  return completion_logprobs(
    params, mb.tokens, mb.positions, num_completion=mb.completion_mask.shape[1],
    model_config=cfg.model_config, temperature=cfg.temperature, chunk_size=cfg.chunk_size,
    prompt_group=cfg.prompt_group, packed=mb.packed,
  )  # fmt: skip


def draw_noise(cfg: StepConfig, batch: TrainBatch, key) -> TrainBatch:
  """Inputs of source ``step_noise``: one uniform draw per token of the step batch each."""
  extras = dict(batch.extras)
  for i, inp in enumerate(cfg.objective.inputs_from("step_noise")):
    k = key if i == 0 else jax.random.fold_in(key, i)
    extras[inp.name] = jax.random.uniform(k, batch.completion_mask.shape, jnp.float32)
  return dataclasses.replace(batch, extras=extras)


def statistics_pass(cfg: StepConfig, params, batch: TrainBatch, num_tokens, num_seqs) -> dict:
  """Step-scope statistics (METHODS.md 1.3): a no-grad pre-pass over the whole step batch, so the
  loss does not depend on the micro-batch split. {} when the objective needs none."""
  spec = cfg.objective
  if not spec.needs_step_stats(cfg.hp):
    return {}
  mbs = split_microbatches(batch, cfg.num_microbatches)
  logp, entropy = jax.lax.map(lambda mb: score(cfg, params, mb), mbs)
  logp = jax.lax.stop_gradient(logp.reshape(batch.completion_mask.shape))
  entropy = jax.lax.stop_gradient(entropy.reshape(batch.completion_mask.shape))
  return spec.step_stats(
    logp, logp if cfg.on_policy else batch.old_logp, batch.advantages, batch.completion_mask,
    num_tokens=num_tokens, num_seqs=num_seqs, entropy=entropy, **batch.extras, **cfg.hp,
  )  # fmt: skip


def micro_batch_loss(cfg: StepConfig, params, mb: TrainBatch, num_tokens, num_seqs, extra):
  """(loss, metrics) of one micro-batch: the objective on the recomputed log-probs (fused into
  the log-prob sweep when ``cfg.fused``), plus the log-prob gap to the sampler."""

  def run(logp, entropy):
    old_logp = jax.lax.stop_gradient(logp) if cfg.on_policy else mb.old_logp
    return cfg.objective.fn(
      logp, old_logp, mb.advantages, mb.completion_mask, num_tokens=num_tokens,
      num_seqs=num_seqs, ref_logp=mb.ref_logp, sampler_logp=mb.sampler_logp, entropy=entropy,
      **mb.extras, **extra, **cfg.hp,
    )  # fmt: skip

  aux = cfg.auxiliary
  h, unembed, targets, *states = completion_hidden(
    params, mb.tokens, mb.positions, num_completion=mb.completion_mask.shape[1],
    model_config=cfg.model_config, with_states=aux is not None, prompt_group=cfg.prompt_group,
    packed=mb.packed,
  )  # fmt: skip
  if cfg.fused:
    loss, logp, entropy = logprobs.fused_objective_from_hidden(
      h, unembed, targets, lambda lp, ent: run(lp, ent)[0], temperature=cfg.temperature,
      logp_fill=mb.sampler_logp,
    )  # fmt: skip
    _, metrics = run(logp, entropy)  # on the constants: metrics only
  else:
    logp, entropy = logprobs.token_logprobs_from_hidden(
      h, unembed, targets, temperature=cfg.temperature, chunk_size=cfg.chunk_size,
      compute_entropy=True,
    )  # fmt: skip
    loss, metrics = run(logp, entropy)
  if aux is not None:  # an auxiliary loss on the same forward pass (losses.AUXILIARY_LOSSES)
    aux_loss, aux_metrics = aux.fn(
      states[0], unembed, mb.completion_mask, num_seqs=num_seqs,
      **{k: mb.aux[k] for k in aux.reads}, **dict(cfg.auxiliary_kwargs),
    )  # fmt: skip
    loss = loss + aux_loss
    metrics = {**metrics, **aux_metrics}
  m = mb.completion_mask
  gap = jnp.abs(jax.lax.stop_gradient(logp) - mb.sampler_logp)
  metrics = dict(metrics)
  metrics.setdefault("entropy/mean", _masked_pair(jax.lax.stop_gradient(entropy), m))
  metrics["logp_gap/mean"] = _masked_pair(gap, m)
  metrics["logp_gap/max"] = (jnp.max(jnp.where(m, gap, 0.0)), jnp.float32(1.0))
  return loss, metrics


def accumulate_gradients(
  cfg: StepConfig, params, batch: TrainBatch, num_tokens, num_seqs, extra, base=None
):
  """sum_m (L_m, metrics_m, g_m) over the M micro-batches (a scan after the first): each L_m is
  normalised by the GLOBAL N_tok / N_seq, so the sums are the full-batch loss and gradient.
  With ``cfg.lora``, ``params`` are the adapters of ``base`` and g the adapters' gradient."""
  if cfg.lora is None:
    value_and_grad = jax.value_and_grad(micro_batch_loss, argnums=1, has_aux=True)
    grad_fn = lambda mb: value_and_grad(cfg, params, mb, num_tokens, num_seqs, extra)
  else:
    loss_fn = lora_lib.adapter_loss(
      lambda p, mb: micro_batch_loss(cfg, p, mb, num_tokens, num_seqs, extra), _frozen_base(base),
      cfg.lora, dtype=cfg.model_config.activation_dtype, attached=cfg.model_config.remat,
    )  # fmt: skip
    value_and_grad = jax.value_and_grad(loss_fn, has_aux=True)
    grad_fn = lambda mb: value_and_grad(params, mb)
  mbs = split_microbatches(batch, cfg.num_microbatches)
  first = jax.tree.map(lambda x: x[0], mbs)
  (loss, metrics), grads = grad_fn(first)
  if cfg.num_microbatches > 1:

    def body(carry, mb):
      loss_acc, metrics_acc, grads_acc = carry
      (mb_loss, mt), g = grad_fn(mb)
      grads_acc = jax.tree.map(jnp.add, grads_acc, g)
      return (loss_acc + mb_loss, losses.merge_metrics(metrics_acc, mt), grads_acc), None

    rest = jax.tree.map(lambda x: x[1:], mbs)
    (loss, metrics, grads), _ = jax.lax.scan(body, (loss, metrics, grads), rest)
  return loss, metrics, grads


def apply_update(cfg: StepConfig, state: TrainState, loss, grads):
  """The optax update if L and g are finite, else params / optimiser state unchanged (non-finite
  gradients would poison the moments). Returns (params, opt_state, finite, grad_norm,
  update_norm).

  A ``lax.cond`` runs the update only when finite: measured on SmolLM2-135M (bfloat16 compute),
  selecting between the new and the old params and moments with ``where`` (and zeroing the
  gradients first) cost 150-250 ms per update, a full extra pass over every parameter-sized tree.
  The trainer's optimiser (an ``OptimizerSpec``) runs as ``fused_apply`` (its ``update_norm`` is
  ||p' - p||); any other optax transformation as ``update`` + ``apply_updates`` (||u||).
  """
  grad_norm = optax.global_norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

  def update(_):
    if isinstance(cfg.optimizer, OptimizerSpec):  # the trainer's AdamW: fewer passes, same math
      params, opt_state, norm = cfg.optimizer.fused_apply(
        grads, state.opt_state, state.params, grad_norm
      )
    else:
      updates, opt_state = cfg.optimizer.update(grads, state.opt_state, state.params)
      params, norm = optax.apply_updates(state.params, updates), optax.global_norm(updates)
    # float32 whatever the params' dtype: both branches of the cond must agree (bfloat16 params
    # give a bfloat16 norm).
    return params, opt_state, norm.astype(jnp.float32)

  def skip(_):
    return state.params, state.opt_state, jnp.zeros((), jnp.float32)

  params, opt_state, update_norm = jax.lax.cond(finite, update, skip, None)
  return params, opt_state, finite, grad_norm, update_norm


def step_metrics(loss, metrics, *, params, finite, grad_norm, update_norm) -> dict:
  """Plain float32 scalars: every objective metric, ``loss``, ``grad_norm`` (before clipping),
  ``param_norm``, ``update_norm``, ``skipped``."""
  out = dict(losses.finalize_metrics(metrics))
  out.update(
    loss=loss, grad_norm=grad_norm, param_norm=optax.global_norm(params), update_norm=update_norm,
    skipped=(~finite).astype(jnp.float32),
  )  # fmt: skip
  return out


def _train_step(state: TrainState, batch: TrainBatch, num_tokens, num_seqs, key, base=None, *, cfg):
  """One optimiser update (the module docstring), part by part. ``base``: the frozen base params
  of a LoRA step (``cfg.lora``), else None."""
  spec = cfg.objective
  num_tokens = jnp.asarray(num_tokens, jnp.float32)
  num_seqs = jnp.asarray(num_seqs, jnp.float32)
  batch = draw_noise(cfg, batch, key)
  # (With LoRA and no statistics to compute, the unused merge is dead code to XLA.)
  stats = statistics_pass(cfg, model_params(cfg, state.params, base), batch, num_tokens, num_seqs)
  extra = dict(stats)
  if spec.state is not None:  # the objective's state gives this step its keywords
    extra.update(spec.state.step_kwargs(state.extra["objective"], stats, cfg.hp))
  loss, metrics, grads = accumulate_gradients(
    cfg, state.params, batch, num_tokens, num_seqs, extra, base
  )
  params, opt_state, finite, grad_norm, update_norm = apply_update(cfg, state, loss, grads)
  out = step_metrics(loss, metrics, params=state.params, finite=finite, grad_norm=grad_norm,
                     update_norm=update_norm)  # fmt: skip
  new_extra = state.extra
  if spec.state is not None:  # ... and is updated from the step's statistics and metrics
    new_extra = {**state.extra,
                 "objective": spec.state.update(state.extra["objective"], stats, out, cfg.hp)}  # fmt: skip
  state = state.replace(
    params=params, opt_state=opt_state, extra=new_extra,
    num_skipped=state.num_skipped + (~finite).astype(jnp.int32),
  )  # fmt: skip
  return state, out


def owned_jit(fn, **jit_kwargs):
  """``jax.jit`` of a new function object that calls ``fn``: the executables compiled through it
  live as long as the returned callable, not as long as the process.

  jax keys its caches on the function object (weakly), so a module-level ``jax.jit(fn)`` keeps
  every executable it ever compiled; a run that builds its steps with this instead gives them
  back when it drops them (``rlvr_jax.compilation``). Within one callable, calls with equal
  static arguments and shapes compile once, as with ``jax.jit``."""

  @functools.wraps(fn)
  def owned(*args, **kwargs):
    return fn(*args, **kwargs)

  return jax.jit(owned, **jit_kwargs)


def make_train_step(
  *,
  model_config,
  optimizer: optax.GradientTransformation,
  objective,
  objective_kwargs: dict | None = None,
  num_microbatches: int = 1,
  temperature: float = 1.0,
  chunk_size: int = 128,
  on_policy: bool = False,
  fused_loss: bool | str = "auto",
  auxiliary=None,
  auxiliary_kwargs: dict | None = None,
  prompt_group: int = 1,
  lora=None,
):
  """``train_step(state, batch, num_tokens, num_seqs, key) -> (state, metrics)``: the step jitted
  for its ``StepConfig`` (static), the state donated. The returned callable owns its executables:
  one compile per input shapes while it lives, freed with it (``owned_jit``). With ``lora`` it is
  ``train_step(state, batch, num_tokens, num_seqs, key, base=base)``: ``state.params`` are the
  adapters, ``base`` the frozen base (not donated).

  Args:
    model_config: the ``model.ModelConfig``.
    optimizer: the optax transformation (its state is ``state.opt_state``).
    objective: an ``ObjectiveSpec`` or a name in ``losses.OBJECTIVES``.
    objective_kwargs: keyword hyperparameters for the objective.
    num_microbatches, temperature, chunk_size, on_policy: see ``StepConfig``.
    fused_loss: fuse the objective into the log-prob sweep: 'auto' (default) when the objective
      is token-local with these options (``spec.is_token_local``); True: require it (ValueError
      otherwise); False: never.
    auxiliary: a ``losses.AuxiliarySpec`` (or its name in ``losses.AUXILIARY_LOSSES``) added to
      the loss on the same forward pass; its per-row reads come from ``batch.aux``.
    auxiliary_kwargs: its keyword settings (with ``token_id`` when the spec takes a token).
    prompt_group: see ``StepConfig``; the caller checks ``shares_prompts`` on every batch it
      gives this step (rows of different prompts in one block would be trained on the wrong
      prompt).
    lora: a ``model.lora.LoraConfig`` (train the adapters of a frozen base), or None.
  ``key`` is a typed PRNG key (the ``step_noise`` inputs are drawn from it). A stateful objective
  needs ``state.extra`` from ``init_extra(objective, objective_kwargs)``.
  """
  spec = losses.get_objective(objective) if isinstance(objective, str) else objective
  kwargs = dict(objective_kwargs or {})
  token_local = spec.is_token_local(kwargs)
  if fused_loss not in (True, False, "auto"):
    raise ValueError(f"fused_loss must be True, False or 'auto', got {fused_loss!r}")
  if fused_loss is True and not token_local:
    raise ValueError(
      f"fused_loss=True needs a token-local objective (ObjectiveSpec.is_token_local); "
      f"{spec.name!r} with {sorted(kwargs)} is not (sequence-level ratio, OPSM or scope='micro')"
    )
  cfg = StepConfig(
    model_config=model_config, optimizer=optimizer, objective=spec,
    objective_kwargs=tuple(sorted(kwargs.items())), num_microbatches=num_microbatches,
    temperature=temperature, chunk_size=chunk_size, on_policy=on_policy,
    fused=token_local and fused_loss in (True, "auto"), prompt_group=prompt_group,
    auxiliary=losses.AUXILIARY_LOSSES[auxiliary] if isinstance(auxiliary, str) else auxiliary,
    auxiliary_kwargs=tuple(sorted((auxiliary_kwargs or {}).items())), lora=lora,
  )  # fmt: skip
  step = owned_jit(_train_step, static_argnames=("cfg",), donate_argnums=(0,))
  return functools.partial(step, cfg=cfg)


def _score(params, tokens, positions, num_completion, *, model_config, temperature, chunk_size,
           num_microbatches, prompt_group=1):  # fmt: skip
  def one(xs):
    tok, pos = xs
    return completion_logprobs(
      params, tok, pos, num_completion=num_completion, model_config=model_config,
      temperature=temperature, chunk_size=chunk_size, prompt_group=prompt_group,
    )  # fmt: skip

  tok, pos = split_microbatches((tokens, positions), num_microbatches)
  logp, ent = jax.lax.map(one, (tok, pos))
  b = tokens.shape[0]
  return logp.reshape(b, -1), ent.reshape(b, -1)


def make_score_fn(
  *, model_config, temperature: float = 1.0, chunk_size: int = 128, num_microbatches=1
):
  """``score(params, tokens, positions, num_completion) -> (logp, entropy)``: a no-grad pass (old
  log-probs before several updates, reference log-probs) over micro-batches of B / M rows, the
  jitted ``score_logprobs`` bound to its static configuration. Pass ``prompt_group=G`` to a call
  whose micro-batches hold whole blocks of G rows sharing a prompt (``completion_hidden``).
  Jitted for this configuration and owned by the returned callable (``owned_jit``)."""
  score = owned_jit(
    _score,
    static_argnames=("num_completion", "model_config", "temperature", "chunk_size",
                     "num_microbatches", "prompt_group"),
  )  # fmt: skip
  return functools.partial(
    score, model_config=model_config, temperature=temperature, chunk_size=chunk_size,
    num_microbatches=num_microbatches,
  )  # fmt: skip
