"""Multi-turn continuation of the KV-cache sampler: decode a turn, append an observation, repeat.

A batch of B episodes shares one KV cache whose write slot (``KVCache.index``) advances in
lockstep for every row; each row keeps its own RoPE position. A row that is not producing tokens
at a step (its turn ended, its episode is over, its observation is shorter than the bucket) writes
a *hole*: a slot with position -1, which ``model.forward`` never attends to. The attention of
every real token therefore sees exactly the compacted stream [prompt, a_1, o_1, a_2, ...] at
positions 0, 1, 2, ..., which is what the trainer's single forward pass over the collated stream
sees: log-probs agree to float tolerance (``tests/test_multiturn_sampling.py``).

The *pending token*: the last token of the stream so far (the prompt's last, an action's last,
an observation's last) is never in the cache between calls; it is fed by the next call. So:

  start_episodes:  prefill prompt[:-1] (stacked scan); pending = prompt[-1]
  decode_chunk:    while a row is in its turn (and at most ``steps`` times):
                     feed every in-turn row's pending token (holes elsewhere) -> logits -> sample;
                     the sample becomes the pending token; the turn of a row ends on a stop
                     sequence (EOS, stop tokens, tokenised stop strings) or its turn budget
  append:          feed [pending, obs[:-1]] per row at the row's positions (holes after its
                   length, and for rows without an observation); pending = obs[-1]

No history is ever re-fed. Every decode step and every append costs the same as in the
single-turn sampler; the price of lockstep slots is the holes (slots of rows that wait while
others decode), bounded by the turn budget per turn, and the recompiles are bounded by bucketing:
the cache grows to ``DEFAULT_BUCKETS`` lengths (``ensure_capacity``) and observations are padded
to bucket widths, so shapes repeat across turns and batches.

Randomness: the token at position p of row b uses ``fold_in(row_key_b, p - prompt_length_b)``
(its index in the stream after the prompt), so samples do not depend on the batch, the other rows'
turn lengths or the device layout. Under a mesh the rows (and cache) are sharded by the ``batch``
rule of ``sharding.SAMPLE_RULES``, as in ``sampler.generate``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax import sharding as sharding_lib
from rlvr_jax.model import (
  KVCache,
  ModelConfig,
  forward,
  forward_into_new_cache,
  grow_cache,
  logits_from_hidden,
)
from rlvr_jax.sampling.sampler import DEFAULT_BUCKETS, bucket_length, prompt_positions
from rlvr_jax.sampling.strategies import Greedy, Strategy
from rlvr_jax.types import pytree_dataclass

_NEVER = -3  # a stop-sequence entry that matches no token (unused rows of the stop table)


@pytree_dataclass
class TurnState:
  """What the device carries between calls (all [B] unless noted; B = episodes).

  Attributes:
    last: int32 pending token (the stream's last token, not yet in the cache).
    pos: int32 its position in the compacted stream (prompt tokens are 0..len-1).
    start: int32 the prompt length (key index of a token at position p is p - start).
    in_turn: bool, the row is sampling this turn.
    budget: int32 most tokens this turn (turn budget, or the room left in the context).
    stopped: bool, the turn ended on a stop sequence (not on the budget).
    window: [B, W] int32 last W tokens sampled this turn (stop-sequence matching).
    t: int32 [] steps of this turn so far (= the column of this turn's buffers).
    tokens, sampler_logp, model_logp, threshold: [B, T_turn] this turn's samples (column t = step
      t; rows not in turn keep pad / 0); ``count`` [B] int32 tokens each row sampled this turn.
  """

  last: jax.Array
  pos: jax.Array
  start: jax.Array
  in_turn: jax.Array
  budget: jax.Array
  stopped: jax.Array
  window: jax.Array
  t: jax.Array
  count: jax.Array
  tokens: jax.Array
  sampler_logp: jax.Array
  model_logp: jax.Array
  threshold: jax.Array


def _rows(x: jax.Array) -> jax.Array:
  """Shards axis 0 (rows) by the ``batch`` rule of ``SAMPLE_RULES`` over the current mesh."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  axes = ("batch",) + (None,) * (x.ndim - 1)
  spec = sharding_lib.logical_to_spec(axes, sharding_lib.SAMPLE_RULES, shape=x.shape, mesh=mesh)
  return jax.lax.with_sharding_constraint(x, spec)


def _rows_cache(cache: KVCache) -> KVCache:
  return KVCache(
    k=tuple(map(_rows, cache.k)),
    v=tuple(map(_rows, cache.v)),
    positions=_rows(cache.positions),
    index=cache.index,
  )


def stop_table(sequences, *, width: int | None = None) -> np.ndarray:
  """Stop sequences (each a non-empty sequence of ids; a stop token is a 1-long one) -> the
  [n, W] int32 table ``decode_chunk`` matches: right-aligned, -1 (any token) on the left, rows
  padded to a multiple of 8 with never-matching rows (new stop sets reuse the program)."""
  seqs = [tuple(int(i) for i in s) for s in sequences]
  if any(len(s) == 0 or min(s) < 0 for s in seqs):
    raise ValueError(f"stop sequences must be non-empty and ids >= 0, got {seqs}")
  W = max([len(s) for s in seqs] + [1]) if width is None else width
  if any(len(s) > W for s in seqs):
    raise ValueError(f"a stop sequence is longer than width {W}: {seqs}")
  n = max(8, -(-len(seqs) // 8) * 8)
  table = np.full((n, W), _NEVER, np.int32)
  for i, s in enumerate(seqs):
    table[i] = -1
    table[i, W - len(s) :] = s
  return table


def _empty_turn(B: int, turn_tokens: int, window: int, pad_id: int) -> dict:
  return dict(
    in_turn=jnp.zeros((B,), bool),
    budget=jnp.zeros((B,), jnp.int32),
    stopped=jnp.zeros((B,), bool),
    window=jnp.full((B, window), -2, jnp.int32),
    t=jnp.zeros((), jnp.int32),
    count=jnp.zeros((B,), jnp.int32),
    tokens=jnp.full((B, turn_tokens), pad_id, jnp.int32),
    sampler_logp=jnp.zeros((B, turn_tokens), jnp.float32),
    model_logp=jnp.zeros((B, turn_tokens), jnp.float32),
    threshold=jnp.zeros((B, turn_tokens), jnp.float32),
  )


@functools.partial(
  jax.jit, static_argnames=("config", "cache_len", "turn_tokens", "window", "pad_id")
)
def start_episodes(
  params, tokens, mask, *, config: ModelConfig, cache_len: int, turn_tokens: int, window: int,
  pad_id: int,
):  # fmt: skip
  """Prefills B left-padded prompts [B, S] (S >= 2, last column real) but their last token.

  Returns (cache with index S - 1 and ``cache_len`` slots, ``TurnState`` with no row in turn).
  """
  B, S = tokens.shape
  if mask.shape != (B, S) or S < 2:
    raise ValueError(f"prompts {tokens.shape} / mask {mask.shape} must be [B, S] with S >= 2")
  tokens, mask = _rows(tokens.astype(jnp.int32)), _rows(mask.astype(bool))
  positions = prompt_positions(mask)
  _, cache = forward_into_new_cache(
    params, tokens[:, :-1], positions[:, :-1], config=config, max_len=cache_len
  )
  state = TurnState(
    last=tokens[:, -1],
    pos=positions[:, -1],
    start=positions[:, -1] + 1,
    **{
      k: _rows(v) if v.ndim else v for k, v in _empty_turn(B, turn_tokens, window, pad_id).items()
    },
  )
  return _rows_cache(cache), state


@functools.partial(jax.jit, static_argnames=("pad_id",))
def begin_turn(state: TurnState, active, budget, *, pad_id: int) -> TurnState:
  """Starts a turn for the rows ``active`` [B] with ``budget`` [B] tokens each (> 0)."""
  B, T = state.tokens.shape
  fresh = _empty_turn(B, T, state.window.shape[1], pad_id)
  fresh = {k: _rows(v) if v.ndim else v for k, v in fresh.items()}
  budget = jnp.asarray(budget, jnp.int32)
  fresh.update(in_turn=_rows(jnp.asarray(active, bool) & (budget > 0)), budget=_rows(budget))
  return TurnState(last=state.last, pos=state.pos, start=state.start, **fresh)


def _sample_rows(strategy: Strategy, logits, keys):
  """(tokens, sampler_logp, model_logp, threshold), all [B], with one key per row."""
  pick = lambda a, tok: jnp.take_along_axis(a, tok[:, None], axis=-1)[:, 0]
  logits = logits.astype(jnp.float32)
  if isinstance(strategy, Greedy):
    tok, threshold = strategy.choose(logits)
    sampler_logp = jnp.zeros(tok.shape, jnp.float32)  # a point mass
  else:
    logp, threshold = strategy.log_probs(logits)
    tok = jax.vmap(strategy.sample)(keys, logp)
    sampler_logp = pick(logp, tok)
  model_logp = pick(logits, tok) - jax.nn.logsumexp(logits, axis=-1)
  return tok, sampler_logp, model_logp, threshold


@functools.partial(
  jax.jit, static_argnames=("config", "strategy", "steps"), donate_argnames=("cache",)
)
def decode_chunk(
  params, cache: KVCache, state: TurnState, stops, row_keys, *, config: ModelConfig,
  strategy: Strategy, steps: int,
):  # fmt: skip
  """Up to ``steps`` decode steps of the current turn (fewer when no row is in its turn).

  Args:
    params: ``model.unstack_layers``-ed params (the decode layout).
    cache: donated; needs ``state.t`` + ``steps`` free slots past its index (``ensure_capacity``).
    state: from ``begin_turn`` or a previous chunk (not donated: the host reads it while the next
      chunk runs).
    stops: [n, W] int32 ``stop_table``; row_keys: [B] typed keys (``keys.row_keys``).
  Returns:
    (cache, state).
  """
  T = state.tokens.shape[1]
  if stops.ndim != 2 or stops.shape[1] != state.window.shape[1]:
    raise ValueError(f"stops {stops.shape} must be [n, W] with W = {state.window.shape[1]}")
  end = state.t + steps

  def body(carry):
    cache, s = carry
    feed_pos = jnp.where(s.in_turn, s.pos, -1)  # holes for rows not in turn
    hidden, cache = forward(params, s.last[:, None], feed_pos[:, None], config=config, cache=cache)
    logits = logits_from_hidden(params, hidden[:, 0, :], config)
    keys = jax.vmap(jax.random.fold_in)(row_keys, s.pos + 1 - s.start)
    tok, slogp, mlogp, thr = _sample_rows(strategy, logits, keys)
    alive = s.in_turn
    col = jnp.minimum(s.t, T - 1)
    put = lambda buf, x, fill: jax.lax.dynamic_update_index_in_dim(
      buf, jnp.where(alive, x, fill), col, axis=1
    )
    kept = jax.lax.dynamic_index_in_dim(s.tokens, col, axis=1, keepdims=False)
    tokens = jax.lax.dynamic_update_index_in_dim(s.tokens, jnp.where(alive, tok, kept), col, 1)
    window = jnp.where(
      alive[:, None], jnp.concatenate([s.window[:, 1:], tok[:, None]], 1), s.window
    )
    match = jnp.all((stops[None] == -1) | (window[:, None, :] == stops[None]), axis=-1)
    stop = alive & jnp.any(match, axis=-1)
    count = s.count + alive.astype(jnp.int32)
    s = TurnState(
      last=jnp.where(alive, tok, s.last),
      pos=s.pos + alive.astype(jnp.int32),
      start=s.start,
      in_turn=alive & ~stop & (count < s.budget),
      budget=s.budget,
      stopped=s.stopped | stop,
      window=window,
      t=s.t + 1,
      count=count,
      tokens=tokens,
      sampler_logp=put(s.sampler_logp, slogp, 0.0),
      model_logp=put(s.model_logp, mlogp, 0.0),
      threshold=put(s.threshold, thr, 0.0),
    )
    return cache, s

  cond = lambda carry: (carry[1].t < end) & (carry[1].t < T) & jnp.any(carry[1].in_turn)
  return jax.lax.while_loop(cond, body, (cache, state))


@functools.partial(jax.jit, static_argnames=("config",), donate_argnames=("cache",))
def append(params, cache: KVCache, state: TurnState, obs, obs_len, *, config: ModelConfig):
  """Appends each row's observation [W_obs] after its pending token, in one forward of W_obs tokens.

  Row b feeds [pending_b, obs_b[0], ..., obs_b[n_b - 2]] at positions pos_b, pos_b + 1, ...
  (n_b = ``obs_len[b]``; holes after them), and ``obs_b[n_b - 1]`` becomes its pending token.
  Rows with n_b = 0 (episode over, or an empty observation) feed only holes and keep their state.

  Args:
    obs: [B, W_obs] int32 observation ids, left-aligned; obs_len: [B] int32 (<= W_obs).
  Returns:
    (cache with index + W_obs, state).
  """
  B, W_obs = obs.shape
  obs, obs_len = _rows(obs.astype(jnp.int32)), _rows(obs_len.astype(jnp.int32))
  j = jnp.arange(W_obs, dtype=jnp.int32)[None, :]
  shifted = jnp.concatenate([state.last[:, None], obs[:, :-1]], axis=1)
  positions = jnp.where(j < obs_len[:, None], state.pos[:, None] + j, -1)
  _, cache = forward(params, shifted, positions, config=config, cache=cache)
  has = obs_len > 0
  new_last = jnp.take_along_axis(obs, jnp.maximum(obs_len - 1, 0)[:, None], axis=1)[:, 0]
  state = TurnState(
    **{
      **{f: getattr(state, f) for f in state.__dataclass_fields__},
      "last": jnp.where(has, new_last, state.last),
      "pos": state.pos + obs_len,
    }
  )
  return _rows_cache(cache), state


@functools.partial(jax.jit, static_argnames=("max_len",))
def _grow(cache: KVCache, *, max_len: int) -> KVCache:
  return _rows_cache(grow_cache(cache, max_len))


def ensure_capacity(cache: KVCache, needed: int, buckets=DEFAULT_BUCKETS) -> KVCache:
  """``cache`` grown (one copy) to the smallest bucket >= ``needed`` slots when it is shorter."""
  if cache.max_len >= needed:
    return cache
  return _grow(cache, max_len=bucket_length(needed, buckets))
