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
"""

from __future__ import annotations

import dataclasses
import functools
import inspect

import jax
import jax.numpy as jnp
import optax

from rlvr_jax import logprobs, losses, model
from rlvr_jax.train.state import TrainBatch, TrainState

# Objectives whose 'step'-scope statistics need a pre-pass over the whole step batch.
STEP_STAT_OBJECTIVES = losses.STEP_STAT_OBJECTIVES


def init_siren_extra() -> dict:
  """The state entry SIREN's frozen entropy anchor lives in (NaN = not set yet)."""
  return {"siren_anchor": jnp.asarray(jnp.nan, jnp.float32)}


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


def completion_hidden(params, tokens, positions, *, num_completion: int, model_config):
  """(hidden [B, T, D], unembed [D, V], targets [B, T]) for the last T tokens of ``tokens`` [B, S]:
  the final hidden states that predict them and the unembedding matrix."""
  s = tokens.shape[1]
  if not 0 < num_completion < s:
    raise ValueError(
      f"num_completion={num_completion} must be in (0, S={s}) for tokens {tokens.shape}"
    )
  hidden, _ = model.forward(params, tokens, positions, config=model_config)
  # The hidden state at index i predicts token i + 1.
  h = hidden[:, s - num_completion - 1 : s - 1]
  return h, model.unembed_matrix(params, model_config), tokens[:, s - num_completion :]


def completion_logprobs(
  params, tokens, positions, *, num_completion: int, model_config, temperature, chunk_size
):
  """logp [B, T] and entropy [B, T] (float32) of the last T tokens of ``tokens`` [B, S]."""
  h, unembed, targets = completion_hidden(
    params, tokens, positions, num_completion=num_completion, model_config=model_config
  )
  return logprobs.token_logprobs_from_hidden(
    h, unembed, targets, temperature=temperature, chunk_size=chunk_size, compute_entropy=True
  )


def _split(tree, num_microbatches: int):
  """[B, ...] leaves -> [M, B / M, ...]."""

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


def make_train_step(
  *,
  model_config,
  optimizer: optax.GradientTransformation,
  objective: str,
  objective_kwargs: dict | None = None,
  num_microbatches: int = 1,
  temperature: float = 1.0,
  chunk_size: int = 128,
  on_policy: bool = False,
  fused_loss: bool | str = "auto",
):
  """Builds ``train_step(state, batch, num_tokens, num_seqs, key) -> (state, metrics)``.

  Args:
    model_config: the ``model.ModelConfig`` (closed over, static).
    optimizer: the optax transformation (its state is ``state.opt_state``).
    objective: a key of ``losses.OBJECTIVES`` (all share one calling convention).
    objective_kwargs: keyword hyperparameters for the objective.
    num_microbatches: M; B must be divisible by M.
    temperature: sampling temperature tau (logits are divided by it).
    chunk_size: T-chunk of the log-prob computation.
    on_policy: the step batch is the only update on its rollout batch, so old_logp is
      sg(current logp) and ``batch.old_logp`` is ignored (saves a forward pass).
    fused_loss: fuse the objective into the log-prob sweep
      (``logprobs.fused_objective_from_hidden``: three matmul passes over the unembedding instead
      of four). 'auto' (default): when the objective is token-local (``losses.is_token_local``);
      True: require it (ValueError otherwise); False: never.
  The returned function is jitted with ``state`` donated. ``key`` is a typed PRNG key (Clip-Cov
  draws its per-token noise from it). Objectives with step-scope statistics (``STEP_STAT_OBJECTIVES``
  at ``scope='step'``) get them from a no-grad pre-pass over the whole step batch
  (``losses.step_statistics``), so the result does not depend on the micro-batch split. SIREN
  needs ``state.extra["siren_anchor"]`` (float32, NaN until the first step sets it to that
  step's H_sel; ``init_siren_extra()``).
  """
  kwargs = dict(objective_kwargs or {})
  objective_fn = losses.OBJECTIVES[objective]
  signature = inspect.signature(objective_fn).parameters
  wants_noise = "noise" in signature
  needs_stats = objective in STEP_STAT_OBJECTIVES and kwargs.get("scope", "step") == "step"
  needs_stats = needs_stats or objective == "siren"  # SIREN always needs the step's H_sel
  token_local = losses.is_token_local(objective, kwargs)
  if fused_loss is True and not token_local:
    raise ValueError(
      f"fused_loss=True needs a token-local objective (losses.is_token_local); {objective!r} "
      f"with {sorted(kwargs)} is not (sequence-level ratio, OPSM or scope='micro')"
    )
  if fused_loss not in (True, False, "auto"):
    raise ValueError(f"fused_loss must be True, False or 'auto', got {fused_loss!r}")
  fused = token_local and fused_loss in (True, "auto")

  def score(params, mb: TrainBatch):
    """(logp, entropy) [B, T] of the micro-batch's completion tokens under ``params``."""
    return completion_logprobs(
      params,
      mb.tokens,
      mb.positions,
      num_completion=mb.completion_mask.shape[1],
      model_config=model_config,
      temperature=temperature,
      chunk_size=chunk_size,
    )

  def objective_of(mb: TrainBatch, num_tokens, num_seqs, stats):
    """(logp, entropy) -> (loss, metrics) of the micro-batch."""
    extra = {**mb.extras, **stats}

    def run(logp, entropy):
      # On-policy: the proximal policy is the current one, as a constant.
      old_logp = jax.lax.stop_gradient(logp) if on_policy else mb.old_logp
      return objective_fn(
        logp,
        old_logp,
        mb.advantages,
        mb.completion_mask,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        ref_logp=mb.ref_logp,
        sampler_logp=mb.sampler_logp,
        entropy=entropy,
        **extra,
        **kwargs,
      )

    return run

  def loss_fn(params, mb: TrainBatch, num_tokens, num_seqs, stats):
    run = objective_of(mb, num_tokens, num_seqs, stats)
    if fused:
      h, unembed, targets = completion_hidden(
        params,
        mb.tokens,
        mb.positions,
        num_completion=mb.completion_mask.shape[1],
        model_config=model_config,
      )
      loss, logp, entropy = logprobs.fused_objective_from_hidden(
        h,
        unembed,
        targets,
        lambda lp, ent: run(lp, ent)[0],
        temperature=temperature,
        logp_fill=mb.sampler_logp,
      )
      _, metrics = run(logp, entropy)  # on the constants: metrics only
    else:
      logp, entropy = score(params, mb)
      loss, metrics = run(logp, entropy)
    m = mb.completion_mask
    gap = jnp.abs(jax.lax.stop_gradient(logp) - mb.sampler_logp)
    metrics = dict(metrics)
    metrics.setdefault("entropy/mean", _masked_pair(jax.lax.stop_gradient(entropy), m))
    metrics["logp_gap/mean"] = _masked_pair(gap, m)
    metrics["logp_gap/max"] = (jnp.max(jnp.where(m, gap, 0.0)), jnp.float32(1.0))
    return loss, metrics

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def step_stats(params, batch: TrainBatch, num_tokens, num_seqs):
    """Step-scope statistics (METHODS.md 1.3) from a no-grad pre-pass over the whole batch."""
    if not needs_stats:
      return {}
    logp, entropy = jax.lax.map(lambda mb: score(params, mb), _split(batch, num_microbatches))
    logp = jax.lax.stop_gradient(logp.reshape(batch.completion_mask.shape))
    entropy = jax.lax.stop_gradient(entropy.reshape(batch.completion_mask.shape))
    return losses.step_statistics(
      objective,
      logp,
      logp if on_policy else batch.old_logp,
      batch.advantages,
      batch.completion_mask,
      num_tokens=num_tokens,
      num_seqs=num_seqs,
      entropy=entropy,
      noise=batch.extras.get("noise"),
      proxy_logp=batch.extras.get("proxy_logp"),
      **kwargs,
    )

  def train_step(state: TrainState, batch: TrainBatch, num_tokens, num_seqs, key):
    num_tokens = jnp.asarray(num_tokens, jnp.float32)
    num_seqs = jnp.asarray(num_seqs, jnp.float32)
    if wants_noise:  # Clip-Cov's random subset: one uniform draw per token of the step batch
      noise = jax.random.uniform(key, batch.completion_mask.shape, jnp.float32)
      batch = dataclasses.replace(batch, extras={**batch.extras, "noise": noise})
    stats = step_stats(state.params, batch, num_tokens, num_seqs)
    extra_state = state.extra
    if objective == "siren":
      # SIREN's anchor is H_sel of the first step batch, then frozen (carried in state.extra).
      old_anchor = state.extra["siren_anchor"]
      anchor = jnp.where(jnp.isnan(old_anchor), stats["siren_selected_entropy"], old_anchor)
      stats = {**stats, "siren_anchor": anchor}
      extra_state = {**state.extra, "siren_anchor": anchor}
    mbs = _split(batch, num_microbatches)
    first = jax.tree.map(lambda x: x[0], mbs)
    (loss, metrics), grads = grad_fn(state.params, first, num_tokens, num_seqs, stats)
    if num_microbatches > 1:

      def body(carry, mb):
        loss_acc, metrics_acc, grads_acc = carry
        (mb_loss, mt), g = grad_fn(state.params, mb, num_tokens, num_seqs, stats)
        grads_acc = jax.tree.map(jnp.add, grads_acc, g)
        return (loss_acc + mb_loss, losses.merge_metrics(metrics_acc, mt), grads_acc), None

      rest = jax.tree.map(lambda x: x[1:], mbs)
      (loss, metrics, grads), _ = jax.lax.scan(body, (loss, metrics, grads), rest)

    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    # Non-finite gradients would poison the optimiser moments: zero them before the update and
    # then keep the old params / state (the update below is discarded anyway).
    safe_grads = jax.tree.map(lambda g: jnp.where(finite, g, 0.0), grads)
    updates, new_opt_state = optimizer.update(safe_grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
    out = {k: v for k, v in losses.finalize_metrics(metrics).items()}
    out.update(
      loss=loss,
      grad_norm=grad_norm,
      param_norm=optax.global_norm(state.params),
      update_norm=jnp.where(finite, optax.global_norm(updates), 0.0),
      skipped=(~finite).astype(jnp.float32),
    )
    state = state.replace(
      params=keep(new_params, state.params),
      opt_state=keep(new_opt_state, state.opt_state),
      num_skipped=state.num_skipped + (~finite).astype(jnp.int32),
      extra=extra_state,
    )
    return state, out

  return jax.jit(train_step, donate_argnums=(0,))


@functools.lru_cache(maxsize=16)
def make_score_fn(
  *, model_config, temperature: float = 1.0, chunk_size: int = 128, num_microbatches=1
):
  """Builds jitted ``score(params, tokens, positions, num_completion) -> (logp, entropy)``.

  A no-grad pass (old_logp before several updates, reference log-probs), run over micro-batches
  of B / M rows to bound memory. ``num_completion`` (T) is static.
  """

  def score(params, tokens, positions, num_completion):
    def one(xs):
      tok, pos = xs
      return completion_logprobs(
        params,
        tok,
        pos,
        num_completion=num_completion,
        model_config=model_config,
        temperature=temperature,
        chunk_size=chunk_size,
      )

    tok, pos = _split((tokens, positions), num_microbatches)
    logp, ent = jax.lax.map(one, (tok, pos))
    b = tokens.shape[0]
    return logp.reshape(b, -1), ent.reshape(b, -1)

  return jax.jit(score, static_argnums=(3,))
