"""KV-cache sampler: ``prefill``, ``decode_step`` and ``generate`` (one jitted program).

Flow of ``generate`` for P prompts and G samples each (B = P * G rows, group ordered):

  host:  left-padded prompts [P, S] -> re-pad to a length bucket S_b (bounds recompiles)
  jit:   prefill the cache with the P prompts -> repeat its rows G times -> sample token 0
         for each cache phase (``cache_phases``: the cache grows, e.g. 96 -> 128 -> 176 slots):
           while t < phase end and not all rows finished:  decode_step(previous token) -> sample t
  out:   Rollout with tokens, sampler / model log-probs (float32), mask, lengths, flags, ids.

The sampler calls the same ``rlvr_jax.model.forward`` as the trainer, so its log-probs match a full
forward pass to float rounding (not bitwise: the matmul shapes differ; bound and reason in
``rlvr_jax.sampling.parity``). Randomness comes from
``keys.row_keys`` (per prompt id and sample id) folded with the completion position, so samples do
not depend on batch size or device layout.

Under a mesh (``jax.set_mesh``) the rows (and the KV cache) are sharded by the ``batch`` rule of
``rlvr_jax.sharding.SAMPLE_RULES`` (data x fsdp axes); the parameters keep the sharding they arrive
with: place them with ``model.param_shardings(config, mesh, sharding.SAMPLE_RULES)`` (weights split
over ``tensor`` only, so the decode loop does no per-step all-gather).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax import sharding as sharding_lib
from rlvr_jax.model import (
  KVCache,
  ModelConfig,
  compute_params,
  forward,
  forward_into_new_cache,
  grow_cache,
  logits_from_hidden,
  unstack_layers,
  with_unembed,
)
from rlvr_jax.sampling import keys as keys_lib
from rlvr_jax.sampling.strategies import Greedy, Strategy, per_row_log_probs
from rlvr_jax.types import Rollout, pytree_dataclass

# Powers of two and 1.5x powers of two, 16, 24, 32, 48, ..., 6144, 8192: prompts are padded by at
# most a third (the prefill's cost grows with the padded length) at the price of two compiled
# programs per octave of lengths.
DEFAULT_BUCKETS = tuple(b for p in range(3, 13) for b in (2 * 2**p, 3 * 2**p) if b <= 8192)


# Minimum decode steps per cache phase of ``generate`` (see ``cache_phases``).
DEFAULT_PHASE_STEPS = 32


def bucket_length(length: int, buckets: Sequence[int] = DEFAULT_BUCKETS) -> int:
  """The smallest bucket >= ``length`` (prompt lengths are padded up to it)."""
  for b in sorted(buckets):
    if b >= length:
      return int(b)
  raise ValueError(f"prompt length {length} exceeds the largest bucket {max(buckets)}")


def cache_phases(
  prompt_len: int, max_new_tokens: int, *, min_steps: int | None = DEFAULT_PHASE_STEPS
) -> tuple[int, ...]:
  """Cache lengths of ``generate``'s decode phases, increasing, the last = prompt_len + T.

  A decode step attends over every slot of its cache, filled or not, so ``generate`` starts with a
  short cache and grows it (``model.grow_cache``, one copy) when the next token would not fit:
  phase lengths are the ``DEFAULT_BUCKETS`` values (powers of two and 1.5x) that leave at least
  ``min_steps`` decode steps both in the phase they end and in the rest of the completion. Each
  phase is one more compiled decode body; ``min_steps`` None or 0 gives a single phase (a cache of
  prompt_len + T slots from the start).
  """
  final = prompt_len + max_new_tokens
  if not min_steps:
    return (final,)
  lengths = []
  for b in DEFAULT_BUCKETS:
    last = lengths[-1] if lengths else prompt_len
    if b - last >= min_steps and final - b >= min_steps:
      lengths.append(b)
  return (*lengths, final)


def prompt_positions(mask: jax.Array) -> jax.Array:
  """Positions of left-padded prompts: 0, 1, ... on real tokens, -1 on padding. [B, S] -> [B, S]."""
  mask = mask.astype(jnp.int32)
  return jnp.where(mask > 0, jnp.cumsum(mask, axis=-1) - 1, -1).astype(jnp.int32)


def _constrain_rows(x: jax.Array) -> jax.Array:
  """Shards axis 0 (rows) by the ``batch`` rule of ``SAMPLE_RULES`` over the current mesh, if any.

  Mesh axes that do not divide the rows are dropped (``sharding.logical_to_spec``).
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  axes = ("batch",) + (None,) * (x.ndim - 1)
  spec = sharding_lib.logical_to_spec(axes, sharding_lib.SAMPLE_RULES, shape=x.shape, mesh=mesh)
  return jax.lax.with_sharding_constraint(x, spec)


def _map_cache_rows(fn, cache: KVCache) -> KVCache:
  """``fn`` applied to every row-major cache array (each k / v buffer and the positions)."""
  return KVCache(
    k=tuple(map(fn, cache.k)),
    v=tuple(map(fn, cache.v)),
    positions=fn(cache.positions),
    index=cache.index,
  )


def _constrain_cache(cache: KVCache) -> KVCache:
  """Rows of the cache (axis 0 of every buffer) over the data axes."""
  return _map_cache_rows(_constrain_rows, cache)


def _prefill(params, tokens, mask, *, config: ModelConfig, cache_len: int):
  positions = prompt_positions(mask)
  hidden, cache = forward_into_new_cache(
    params, tokens, positions, config=config, max_len=cache_len
  )
  cache = _constrain_cache(cache)
  # Left padding: the last column is every row's last prompt token.
  logits = logits_from_hidden(params, hidden[:, -1, :], config)
  return logits, cache, positions[:, -1] + 1


def _decode(params, cache, tokens, positions, *, config: ModelConfig):
  hidden, cache = forward(params, tokens[:, None], positions[:, None], config=config, cache=cache)
  return logits_from_hidden(params, hidden[:, 0, :], config), cache


@functools.partial(jax.jit, static_argnames=("config", "cache_len"))
def prefill(params, tokens, mask, *, config: ModelConfig, cache_len: int):
  """Runs the prompts through the model and fills a fresh KV cache.

  Args:
    params: model params, stacked or ``unstack_layers``-ed (see ``decode_step``).
    tokens: [B, S] int32 left-padded prompt ids; mask: [B, S] bool, True on real tokens (the last
      column must be real for every row).
    config: model config; cache_len: S_max of the cache (>= S + new tokens).
  Returns:
    (logits [B, V] float32 of the next token, cache with index S, next_positions [B] int32 =
    prompt lengths, the position of the first generated token).
  """
  if tokens.shape != mask.shape or tokens.ndim != 2:
    raise ValueError(f"tokens {tokens.shape} and mask {mask.shape} must both be [B, S]")
  if cache_len < tokens.shape[1]:
    raise ValueError(f"cache_len {cache_len} < prompt length {tokens.shape[1]}")
  return _prefill(params, tokens, mask, config=config, cache_len=cache_len)


@functools.partial(jax.jit, static_argnames=("config",), donate_argnames=("cache",))
def decode_step(params, cache: KVCache, tokens, positions, *, config: ModelConfig):
  """One decode step with a donated cache: tokens [B], positions [B] -> (logits [B, V] f32, cache).

  In a host loop pass ``model.with_unembed(model.unstack_layers(model.compute_params(params,
  config), config), config)`` (once): with stacked params every call copies each layer's weights
  out of the stack first, with float32 params under a bfloat16 ``compute_dtype`` every call
  casts them, and without ``with_unembed`` a bfloat16 call reads a float32 copy of the tied
  embedding for its logits. (``prefill`` runs the stacked layer scan: give it the stacked
  params; unstacked ones are re-stacked.)
  """
  if tokens.shape != positions.shape or tokens.ndim != 1:
    raise ValueError(f"tokens {tokens.shape} and positions {positions.shape} must both be [B]")
  return _decode(params, cache, tokens, positions, config=config)


def _sample(strategy: Strategy, logits, row_keys, t, temperatures=None):
  """Samples token t of every row; returns (tokens, sampler_logp, model_logp, threshold), all [B].

  ``temperatures`` [B] (optional) replaces the strategy's temperature per row; 0 = greedy row.
  """
  pick = lambda a, tokens: jnp.take_along_axis(a, tokens[:, None], axis=-1)[:, 0]
  logits = logits.astype(jnp.float32)
  if temperatures is None and isinstance(strategy, Greedy):
    tokens, threshold = strategy.choose(logits)
    sampler_logp = jnp.zeros(tokens.shape, jnp.float32)  # a point mass
  else:
    if temperatures is None:
      logp, threshold = strategy.log_probs(logits)
    else:
      logp, threshold = per_row_log_probs(strategy, logits, temperatures)
    # Greedy rows of a mixed batch have a point-mass logp: sampling it returns the argmax.
    tokens = jax.vmap(strategy.sample)(keys_lib.position_keys(row_keys, t), logp)
    sampler_logp = pick(logp, tokens)
    if temperatures is None and strategy.temperature == 1.0 and not strategy.truncates:
      # The sampled distribution is the model's: no second log-sum-exp over the vocabulary.
      return tokens, sampler_logp, sampler_logp, threshold
  model_logp = pick(logits, tokens) - jax.nn.logsumexp(logits, axis=-1)
  return tokens, sampler_logp, model_logp, threshold


@pytree_dataclass
class DecodeBuffers:
  """What the decode loop writes at each completion position t (all [B, T], B = P * G rows).

  Attributes:
    tokens: int32 sampled ids (``pad_id`` once a row has finished).
    sampler_logp: float32 log-prob under the distribution sampled from (0 after the end).
    model_logp: float32 log-prob under the model at temperature 1 (0 after the end).
    threshold: float32 truncation threshold of the strategy (0 after the end, unused if none).
    mask: bool, True on generated tokens up to and including the stop token.
  """

  tokens: jax.Array
  sampler_logp: jax.Array
  model_logp: jax.Array
  threshold: jax.Array
  mask: jax.Array


@pytree_dataclass
class DecodeState:
  """The carry of ``generate``'s decode ``while_loop`` (one per cache phase).

  Attributes:
    buf: the ``DecodeBuffers`` written so far (positions >= t still hold their initial values).
    done: [B] bool, the row has sampled a stop token.
    ended: [B] bool, the row samples no more: it stopped or used its token budget.
    cache: the ``KVCache`` (its length grows between phases).
    last: [B] int32, the token sampled at position t - 1 (fed to the next decode step).
    t: [] int32, the next completion position to sample.
  """

  buf: DecodeBuffers
  done: jax.Array
  ended: jax.Array
  cache: KVCache
  last: jax.Array
  t: jax.Array


def _generate(
  params,
  prompt_tokens,
  prompt_mask,
  prompt_ids,
  key,
  stop_tokens,
  temperatures=None,
  budgets=None,
  *,
  config: ModelConfig,
  strategy: Strategy,
  num_samples: int,
  max_new_tokens: int,
  pad_id: int,
  phases: tuple[int, ...],
) -> Rollout:
  """The jitted body of ``generate``: prompts [P, S] (bucketed), prompt_ids [P], typed key [],
  stop_tokens [n_stop] (-1 = unused slot), temperatures [B] or None, budgets [B] (each row's
  token budget, <= T) or None -> Rollout of B = P * G rows. ``phases``: the cache lengths of the
  decode phases (``cache_phases``)."""
  rows = rows_of_call(
    prompt_tokens, prompt_mask, prompt_ids, key, stop_tokens, temperatures, budgets,
    num_samples=num_samples, max_new_tokens=max_new_tokens,
  )  # fmt: skip
  P, S = prompt_tokens.shape
  G, T = num_samples, max_new_tokens
  B = P * G
  temperatures, budgets, row_keys = rows.temperatures, rows.budgets, rows.keys
  if not phases or phases[-1] != S + T or list(phases) != sorted(set(phases)) or phases[0] <= S:
    raise ValueError(f"cache phases {phases} must increase from above {S} to S + T = {S + T}")
  # Mixed precision: the bfloat16 copy of the weights, made once for the whole call (the prefill
  # and every decode step then find them in the compute dtype; a no-op in float32).
  params = compute_params(params, config)
  # Each prompt is run through the model once (the stacked layer scan); its cache rows, next-token
  # logits and position are then repeated for its G samples (a G-times smaller prefill).
  logits, cache, start = _prefill(
    params, prompt_tokens, prompt_mask, config=config, cache_len=phases[0]
  )
  # Per-layer weights for the decode loop, sliced once here instead of out of the stack at every
  # decode step.
  params = with_unembed(unstack_layers(params, config), config)
  repeat = lambda a: _constrain_rows(jnp.repeat(a, G, axis=0))
  logits, start, cache = repeat(logits), repeat(start), _map_cache_rows(repeat, cache)

  def record(state: DecodeState, logits) -> DecodeState:
    t = state.t
    tok, smp_logp, mdl_logp, thr = _sample(strategy, logits, row_keys, t, temperatures)
    alive = ~state.ended
    columns = DecodeBuffers(
      tokens=jnp.where(alive, tok, pad_id),
      sampler_logp=jnp.where(alive, smp_logp, 0.0),
      model_logp=jnp.where(alive, mdl_logp, 0.0),
      threshold=jnp.where(alive, thr, 0.0),
      mask=alive,
    )
    write = lambda b, c: jax.lax.dynamic_update_index_in_dim(b, c, t, axis=1)
    stop = alive & is_stop(tok, stop_tokens)
    ended = state.ended | stop | (alive & (t + 1 >= budgets))
    buf = jax.tree.map(write, state.buf, columns)
    return DecodeState(
      buf=buf, done=state.done | stop, ended=ended, cache=state.cache, last=tok, t=t + 1
    )

  state = DecodeState(
    buf=empty_buffers(B, T, pad_id),
    done=jnp.zeros((B,), jnp.bool_),
    ended=jnp.zeros((B,), jnp.bool_),
    cache=cache,
    last=jnp.zeros((B,), jnp.int32),
    t=jnp.zeros((), jnp.int32),
  )
  state = record(state, logits)

  def body(state: DecodeState) -> DecodeState:
    # The previous token sits at position prompt_length + t - 1, in slot S + t - 1.
    logits, cache = _decode(params, state.cache, state.last, start + state.t - 1, config=config)
    return record(dataclasses.replace(state, cache=cache), logits)

  for length in phases:
    if length > state.cache.max_len:
      state = dataclasses.replace(state, cache=_constrain_cache(grow_cache(state.cache, length)))
    # Steps t < length - S + 1 write slots < length.
    end = min(T, length - S + 1)
    cond = lambda state, end=end: (state.t < end) & ~jnp.all(state.ended)
    state = jax.lax.while_loop(cond, body, state)
  return rows.rollout(prompt_tokens, prompt_mask, state.buf, state.done, strategy)


def is_stop(tokens, stop_tokens) -> jax.Array:
  """[B] bool: ``tokens`` [B] is one of ``stop_tokens`` [n] (-1 entries match nothing)."""
  return jnp.any(tokens[:, None] == stop_tokens[None, :], axis=1)


def empty_buffers(B: int, T: int, pad_id: int) -> DecodeBuffers:
  """``DecodeBuffers`` [B, T] before any token: pad ids, zeros, mask False (rows sharded)."""
  buf = DecodeBuffers(
    tokens=jnp.full((B, T), pad_id, jnp.int32),
    sampler_logp=jnp.zeros((B, T), jnp.float32),
    model_logp=jnp.zeros((B, T), jnp.float32),
    threshold=jnp.zeros((B, T), jnp.float32),
    mask=jnp.zeros((B, T), jnp.bool_),
  )
  return jax.tree.map(_constrain_rows, buf)


@dataclasses.dataclass(frozen=True)
class CallRows:
  """The B = P * G rows of a sampling call, group ordered (row b = prompt b // G, sample b % G):
  their prompt ids, sample ids, PRNG keys, temperatures ([B] or None) and token budgets [B]."""

  num_samples: int
  prompt_ids: jax.Array
  sample_ids: jax.Array
  keys: jax.Array
  temperatures: jax.Array | None
  budgets: jax.Array

  def rollout(self, prompt_tokens, prompt_mask, buf: DecodeBuffers, done, strategy) -> Rollout:
    """The ``Rollout`` of these rows from the prompts [P, S] and the written buffers."""
    G = self.num_samples
    mixed = self.temperatures is not None  # greedy rows truncate
    return Rollout(
      prompt_tokens=_constrain_rows(jnp.repeat(prompt_tokens, G, axis=0)),
      prompt_mask=_constrain_rows(jnp.repeat(prompt_mask, G, axis=0)),
      tokens=buf.tokens,
      sampler_logp=buf.sampler_logp,
      model_logp=buf.model_logp,
      completion_mask=buf.mask,
      lengths=jnp.sum(buf.mask, axis=1, dtype=jnp.int32),
      finished=done,
      truncated=~done,
      prompt_ids=self.prompt_ids,
      sample_ids=self.sample_ids,
      sampler_threshold=buf.threshold if strategy.truncates or mixed else None,
    )


def rows_of_call(
  prompt_tokens, prompt_mask, prompt_ids, key, stop_tokens, temperatures, budgets, *,
  num_samples: int, max_new_tokens: int,
) -> CallRows:  # fmt: skip
  """Checks the traced inputs of a sampling call and derives its ``CallRows``."""
  P, S = prompt_tokens.shape
  if prompt_mask.shape != (P, S) or prompt_ids.shape != (P,) or stop_tokens.ndim != 1:
    raise ValueError(
      f"prompt_tokens {prompt_tokens.shape}, prompt_mask {prompt_mask.shape}, prompt_ids "
      f"{prompt_ids.shape}, stop_tokens {stop_tokens.shape}: expected [P, S], [P, S], [P], [n]"
    )
  G, T = num_samples, max_new_tokens
  B = P * G
  if temperatures is not None:
    if temperatures.shape != (B,):
      raise ValueError(f"temperatures {temperatures.shape} must be [B] = ({B},)")
    temperatures = _constrain_rows(temperatures.astype(jnp.float32))
  if budgets is None:
    budgets = jnp.full((B,), T, jnp.int32)
  elif budgets.shape != (B,):
    raise ValueError(f"max_lengths {budgets.shape} must be [B] = ({B},)")
  budgets = _constrain_rows(jnp.clip(budgets.astype(jnp.int32), 1, T))
  row_prompt_ids = _constrain_rows(jnp.repeat(prompt_ids.astype(jnp.int32), G))
  sample_ids = _constrain_rows(jnp.tile(jnp.arange(G, dtype=jnp.int32), P))
  return CallRows(
    num_samples=G,
    prompt_ids=row_prompt_ids,
    sample_ids=sample_ids,
    keys=keys_lib.row_keys(key, row_prompt_ids, sample_ids),
    temperatures=temperatures,
    budgets=budgets,
  )


generate_jit = jax.jit(
  _generate,
  static_argnames=(
    "config",
    "strategy",
    "num_samples",
    "max_new_tokens",
    "pad_id",
    "phases",
  ),
)


def pad_to_bucket(
  prompt_tokens, prompt_mask, *, pad_id: int, buckets: Sequence[int] = DEFAULT_BUCKETS
) -> tuple[np.ndarray, np.ndarray]:
  """Re-pads left-padded prompts [P, S] on the host to [P, S_b], S_b the bucket of the longest.

  Raises if a row is empty or not left-padded (a real token after a padding token).
  """
  tokens = np.asarray(prompt_tokens)
  mask = np.asarray(prompt_mask).astype(bool)
  if tokens.ndim != 2 or tokens.shape != mask.shape:
    raise ValueError(f"prompt tokens {tokens.shape} and mask {mask.shape} must both be [P, S]")
  lengths = mask.sum(axis=1)
  if (lengths == 0).any():
    raise ValueError(f"prompts {np.flatnonzero(lengths == 0).tolist()} have no real token")
  S = tokens.shape[1]
  expected = np.arange(S)[None, :] >= (S - lengths)[:, None]
  if not (mask == expected).all():
    raise ValueError("prompts must be left-padded: every row's real tokens must end the row")
  S_b = bucket_length(int(lengths.max()), buckets)
  out_tokens = np.full((tokens.shape[0], S_b), pad_id, np.int32)
  out_mask = np.zeros((tokens.shape[0], S_b), bool)
  keep = min(S, S_b)
  out_tokens[:, S_b - keep :] = tokens[:, S - keep :]
  out_mask[:, S_b - keep :] = mask[:, S - keep :]
  out_tokens[~out_mask] = pad_id
  return out_tokens, out_mask


def row_temperatures(temperatures, *, num_prompts: int, num_samples: int) -> np.ndarray:
  """Per-row temperatures [B = P * G] float32 (rows group ordered) from [G] or [B] values >= 0.

  [G] is one temperature per sample index, repeated for every prompt.
  """
  t = np.asarray(temperatures, np.float32)
  P, G = num_prompts, num_samples
  if t.shape == (G,):
    t = np.tile(t, P)
  if t.shape != (P * G,):
    raise ValueError(f"temperatures {t.shape} must be [G] = ({G},) or [B] = ({P * G},)")
  if not np.isfinite(t).all() or (t < 0).any():
    raise ValueError(f"temperatures must be finite and >= 0 (0 = greedy), got {t.tolist()}")
  return t


def generate(
  params,
  prompt_tokens,
  prompt_mask,
  *,
  config: ModelConfig,
  num_samples: int,
  strategy: Strategy,
  key: jax.Array,
  max_new_tokens: int,
  stop_tokens: Sequence[int] | None = None,
  prompt_ids=None,
  pad_id: int | None = None,
  buckets: Sequence[int] = DEFAULT_BUCKETS,
  temperatures=None,
  phase_steps: int | None = DEFAULT_PHASE_STEPS,
  max_lengths=None,
) -> Rollout:
  """Samples ``num_samples`` completions for each prompt.

  Args:
    params: model params (placed with the sampling sharding rules when running under a mesh).
    prompt_tokens: [P, S] int left-padded prompt ids; prompt_mask: [P, S] bool (True = real).
    config: model config.
    num_samples: G, completions per prompt; rows are group ordered (row b = prompt b // G,
      sample b % G). Under a mesh, B = P * G should divide over the data axes to be sharded.
    strategy: a ``strategies`` dataclass (Greedy, Temperature, TopK, TopP, MinP, Combined).
    key: base PRNG key of this call (typed, ``jax.random.key``); e.g. ``keys.step_key(seed, step)``.
    max_new_tokens: T, the completion budget (also the padded completion length).
    stop_tokens: ids that end a completion (included in it); default ``config.eos_token_ids``.
    prompt_ids: [P] int ids of the prompts used for key derivation (default 0..P-1). Pass stable ids
      (e.g. dataset indices) to make a prompt's samples independent of the batch it is in.
    pad_id: id written after the end (default ``config.pad_token_id``, else 0).
    buckets: allowed padded prompt lengths; one compiled program per (bucket, P, G, T, strategy).
    temperatures: optional per-row temperatures replacing ``strategy.temperature`` (its top-k /
      top-p / min-p still apply, on logits / tau_b); 0 makes a row greedy. Shape [G] (one per
      sample index, the same for every prompt) or [B]; see ``row_temperatures``. E.g. ReMax's
      greedy baseline: ``num_samples=G + 1, temperatures=[tau] * G + [0]``. The rollout then
      always carries ``sampler_threshold``; score it with ``recompute_logprobs(...,
      temperatures=row_temperatures(...))``. Values are traced: new ones do not recompile.
    phase_steps: minimum decode steps per cache phase (``cache_phases``): the cache starts short
      and grows, so early steps do not attend over empty slots; each phase compiles one more
      decode body. None or 0: one phase.
    max_lengths: optional [B] int token budget of each row, in [1, max_new_tokens]: a row that
      reaches it without a stop token ends there, truncated (e.g. lengths imposed by a
      benchmark). Traced: new values do not recompile.
  Returns:
    ``Rollout`` with B = P * G rows, prompts re-padded to the bucket length.
  """
  call = prepare_call(
    prompt_tokens, prompt_mask, config=config, num_samples=num_samples, strategy=strategy,
    key=key, max_new_tokens=max_new_tokens, stop_tokens=stop_tokens, prompt_ids=prompt_ids,
    pad_id=pad_id, buckets=buckets, temperatures=temperatures, max_lengths=max_lengths,
  )  # fmt: skip
  return generate_jit(
    params,
    call.tokens,
    call.mask,
    call.prompt_ids,
    key,
    call.stops,
    call.temperatures,
    call.budgets,
    config=config,
    strategy=strategy,
    num_samples=num_samples,
    max_new_tokens=max_new_tokens,
    pad_id=call.pad_id,
    phases=cache_phases(call.tokens.shape[1], max_new_tokens, min_steps=phase_steps),
  )


@dataclasses.dataclass(frozen=True)
class PreparedCall:
  """The host-side inputs of a sampling call, checked: bucketed prompts [P, S_b], prompt ids
  [P], the stop ids padded with -1, the pad id, per-row temperatures and budgets ([B] or None)."""

  tokens: np.ndarray
  mask: np.ndarray
  prompt_ids: np.ndarray
  stops: np.ndarray
  pad_id: int
  temperatures: np.ndarray | None
  budgets: np.ndarray | None


def prepare_call(
  prompt_tokens, prompt_mask, *, config: ModelConfig, num_samples: int, strategy: Strategy,
  key, max_new_tokens: int, stop_tokens=None, prompt_ids=None, pad_id=None,
  buckets: Sequence[int] = DEFAULT_BUCKETS, temperatures=None, max_lengths=None,
) -> PreparedCall:  # fmt: skip
  """Checks the arguments of ``generate`` (and of ``continuous.generate``) on the host."""
  if num_samples < 1 or max_new_tokens < 1:
    raise ValueError(
      f"num_samples ({num_samples}) and max_new_tokens ({max_new_tokens}) must be >= 1"
    )
  if not jnp.issubdtype(getattr(key, "dtype", None), jax.dtypes.prng_key):
    raise TypeError("key must be a typed PRNG key from jax.random.key(...)")
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty and jax.sharding.AxisType.Explicit in mesh.axis_types:
    raise ValueError(
      f"generate needs a mesh with Auto axis types (rlvr_jax.sharding.make_mesh builds one); the "
      f"current mesh has axis types {mesh.axis_types}"
    )
  if pad_id is None:
    pad_id = config.pad_token_id if config.pad_token_id is not None else 0
  stops = np.asarray(config.eos_token_ids if stop_tokens is None else stop_tokens, np.int32)
  if stops.ndim != 1 or (stops < 0).any():
    raise ValueError(f"stop_tokens must be a flat sequence of ids >= 0, got {stops.tolist()}")
  # A traced array padded with -1 (matches no token) to a multiple of 8: new stop sets reuse the
  # compiled program.
  width = max(8, -(-len(stops) // 8) * 8)
  stops = np.pad(stops, (0, width - len(stops)), constant_values=-1)
  tokens, mask = pad_to_bucket(prompt_tokens, prompt_mask, pad_id=pad_id, buckets=buckets)
  P = tokens.shape[0]
  if prompt_ids is None:
    prompt_ids = np.arange(P, dtype=np.int32)
  prompt_ids = np.asarray(prompt_ids, np.int32)
  if prompt_ids.shape != (P,):
    raise ValueError(f"prompt_ids {prompt_ids.shape} must be [P] = ({P},)")
  if temperatures is not None:
    if isinstance(strategy, Greedy):
      raise ValueError("temperatures need a sampling strategy (e.g. Temperature), not Greedy()")
    temperatures = row_temperatures(temperatures, num_prompts=P, num_samples=num_samples)
  if max_lengths is not None:
    max_lengths = np.asarray(max_lengths, np.int32)
    B = P * num_samples
    if max_lengths.shape != (B,) or (max_lengths < 1).any() or (max_lengths > max_new_tokens).any():
      raise ValueError(
        f"max_lengths must be [B] = ({B},) token budgets in [1, max_new_tokens = "
        f"{max_new_tokens}], got shape {max_lengths.shape}"
      )
  return PreparedCall(tokens, mask, prompt_ids, stops, int(pad_id), temperatures, max_lengths)
