"""Multi-turn episodes on decode slots: continuous batching for environments.

``multiturn_rollout.rollout_episodes`` decodes B episodes in lockstep: one shared cache write
index, so a row that waits (its turn ended, its environment is stepping, its observation is
shorter than the bucket) writes a *hole*, and a turn lasts as long as its longest row. Here N
slots (N <= B) each hold one episode at a time, with a cache row that fills at its own pace
(``model.forward_at_columns``: row n writes at its own column, nothing is written for a row that
waits), and the host loop is event-driven:

  admit:   a free slot takes the next queued episode: its prompt (but the last token) is
           prefilled (``forward_into_new_cache`` of the admitted rows only) and copied into the
           slot's row, whose other columns are emptied; its first turn begins
  decode:  ``decode_chunk`` steps every slot in its turn, up to ``chunk_steps`` steps; a slot whose
           turn ended is read by the host and its action goes to the ``EnvPool`` at once, while
           the other slots decode on (chunk k + 1 is dispatched before chunk k is read)
  append:  an observation that came back is appended to its slot's row (``append``: one forward
           of the rows that have one), and the slot's next turn begins, while others decode
  finish:  a slot whose episode ended is free: the next queued episode is admitted

The token at stream position p of an episode uses ``fold_in(row_key, p - prompt_length)``, the
positions are the compacted stream's and attention sees exactly [prompt, a_1, o_1, a_2, ...], as
in the lockstep sampler: the same episodes, token for token (``tests/test_multiturn_slots.py``),
with model log-probs within float rounding (XLA's kernels depend on the batch shape).

What it saves: a slot's cache row holds only its episode's tokens (prompt + max_tokens columns,
never holes), the host never waits for the slowest row of a turn, and with N < B the episodes of
a batch share N rows of cache. What a slot-step costs is the same as a lockstep step: a slot that
waits for its environment still takes part in the decode step (its token is dropped); the
useful fraction (``metrics['useful_frac']``: slot-steps of slots in their turn / all slot-steps)
says how much of the decode compute sampled tokens.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.envs import EnvPool, reset_episodes
from rlvr_jax.model import (
  KVCache,
  ModelConfig,
  forward_at_columns,
  forward_into_new_cache,
  init_cache,
  logits_from_hidden,
)
from rlvr_jax.sampling import keys as keys_lib
from rlvr_jax.sampling import multiturn as mt
from rlvr_jax.sampling.multiturn_rollout import (
  EpisodeBatch,
  _left_pad,
  _unstack,
  observation_batch,
  observe,
  take_action,
)
from rlvr_jax.sampling.sampler import DEFAULT_BUCKETS, bucket_length, prompt_positions
from rlvr_jax.sampling.strategies import Strategy
from rlvr_jax.types import pytree_dataclass


@pytree_dataclass
class SlotTurns:
  """What the device carries for N slots (all [N] unless noted).

  Attributes:
    key_data: [N, 2] uint32 key data of each slot's episode key (``keys.row_keys``).
    last, pos, start: the pending token, its stream position and the prompt length.
    fill: int32 the next column of the slot's cache row (its stream so far minus the pending
      token, prompt padding included).
    in_turn, budget, stopped, window, count: as ``multiturn.TurnState``, per slot; ``count`` is
      also the column of the turn buffers.
    serial: int32 turns begun in this slot (the host reads a snapshot of a turn only once).
    tokens, sampler_logp, model_logp, threshold: [N, T_turn] this turn's samples.
    steps, live: int32 [] decode steps so far, and slot-steps of slots in their turn.
  """

  key_data: jax.Array
  last: jax.Array
  pos: jax.Array
  start: jax.Array
  fill: jax.Array
  in_turn: jax.Array
  budget: jax.Array
  stopped: jax.Array
  window: jax.Array
  count: jax.Array
  serial: jax.Array
  tokens: jax.Array
  sampler_logp: jax.Array
  model_logp: jax.Array
  threshold: jax.Array
  steps: jax.Array
  live: jax.Array


def _sharded(state: SlotTurns) -> SlotTurns:
  return SlotTurns(**{
    f: mt._rows(getattr(state, f)) if getattr(state, f).ndim else getattr(state, f)
    for f in state.__dataclass_fields__
  })  # fmt: skip


@functools.partial(
  jax.jit, static_argnames=("config", "num_slots", "cache_len", "turn_tokens", "window", "pad_id")
)
def init_slots(
  *, config: ModelConfig, num_slots: int, cache_len: int, turn_tokens: int, window: int,
  pad_id: int,
):  # fmt: skip
  """N empty slots: a cache of N rows x ``cache_len`` columns and a ``SlotTurns`` in no turn."""
  N, zeros = num_slots, lambda dtype=jnp.int32: jnp.zeros((num_slots,), dtype)
  state = SlotTurns(
    key_data=jnp.zeros((N, 2), jnp.uint32), last=zeros(), pos=zeros(), start=zeros(),
    fill=zeros(), in_turn=zeros(bool), budget=zeros(), stopped=zeros(bool),
    window=jnp.full((N, window), -2, jnp.int32), count=zeros(), serial=zeros(),
    tokens=jnp.full((N, turn_tokens), pad_id, jnp.int32),
    sampler_logp=jnp.zeros((N, turn_tokens), jnp.float32),
    model_logp=jnp.zeros((N, turn_tokens), jnp.float32),
    threshold=jnp.zeros((N, turn_tokens), jnp.float32),
    steps=jnp.zeros((), jnp.int32), live=jnp.zeros((), jnp.int32),
  )  # fmt: skip
  return mt._rows_cache(init_cache(config, N, cache_len)), _sharded(state)


@functools.partial(jax.jit, static_argnames=("config",), donate_argnames=("cache",))
def admit(params, cache: KVCache, state: SlotTurns, slot_ids, tokens, mask, key_data, *, config):
  """Puts A new episodes into the slots ``slot_ids`` [A] (an id >= N: an unused row).

  ``tokens`` / ``mask`` [A, S] are their left-padded prompts (S >= 2, last column real): all but
  the last token are prefilled (the stacked ``scan`` forward, as ``multiturn.start_episodes``)
  and copied into the slot's cache row (the rest of the row emptied); the last is pending.
  ``params``: the stacked params; ``key_data`` [A, 2]: the episodes' row keys' data.
  """
  A, S = tokens.shape
  if mask.shape != (A, S) or S < 2 or slot_ids.shape != (A,):
    raise ValueError(f"admit: prompts {tokens.shape}, mask {mask.shape}, slots {slot_ids.shape}")
  positions = prompt_positions(mask.astype(bool))
  _, fresh = forward_into_new_cache(
    params, tokens[:, :-1].astype(jnp.int32), positions[:, :-1], config=config, max_len=S - 1
  )
  put = lambda buf, new: buf.at[slot_ids, :, : S - 1, :].set(new.astype(buf.dtype), mode="drop")
  row_positions = jnp.full((A, cache.max_len), -1, jnp.int32).at[:, : S - 1].set(fresh.positions)
  cache = KVCache(
    k=tuple(map(put, cache.k, fresh.k)),
    v=tuple(map(put, cache.v, fresh.v)),
    positions=cache.positions.at[slot_ids].set(row_positions, mode="drop"),
    index=cache.index,
  )
  at = lambda name, value: getattr(state, name).at[slot_ids].set(value, mode="drop")
  state = dataclasses.replace(
    state, key_data=at("key_data", key_data), last=at("last", tokens[:, -1]),
    pos=at("pos", positions[:, -1]), start=at("start", positions[:, -1] + 1),
    fill=at("fill", S - 1), in_turn=at("in_turn", False),
  )  # fmt: skip
  return mt._rows_cache(cache), _sharded(state)


@functools.partial(jax.jit, static_argnames=("pad_id",))
def begin_turns(state: SlotTurns, rows, budget, *, pad_id: int) -> SlotTurns:
  """Starts a turn in the slots ``rows`` [N] bool with ``budget`` [N] tokens each; the other
  slots keep theirs (in turn or not)."""
  rows = jnp.asarray(rows, bool)
  r = rows[:, None]
  budget = jnp.asarray(budget, jnp.int32)
  return _sharded(dataclasses.replace(
    state,
    in_turn=jnp.where(rows, budget > 0, state.in_turn),
    budget=jnp.where(rows, budget, state.budget),
    stopped=state.stopped & ~rows,
    window=jnp.where(r, -2, state.window),
    count=jnp.where(rows, 0, state.count),
    serial=state.serial + rows.astype(jnp.int32),
    tokens=jnp.where(r, pad_id, state.tokens),
    sampler_logp=jnp.where(r, 0.0, state.sampler_logp),
    model_logp=jnp.where(r, 0.0, state.model_logp),
    threshold=jnp.where(r, 0.0, state.threshold),
  ))  # fmt: skip


@functools.partial(
  jax.jit, static_argnames=("config", "strategy", "steps"), donate_argnames=("cache",)
)
def decode_chunk(
  params, cache: KVCache, state: SlotTurns, stops, *, config: ModelConfig, strategy: Strategy,
  steps: int,
):  # fmt: skip
  """Up to ``steps`` decode steps of every slot in its turn (fewer when none is).

  A slot in its turn feeds its pending token at its column ``fill`` and samples the next; a slot
  that is not writes nothing. ``params``: the decode layout (``unstack_layers``); ``stops``: a
  ``multiturn.stop_table``. Returns (cache, state).
  """
  N, T = state.tokens.shape
  if stops.ndim != 2 or stops.shape[1] != state.window.shape[1]:
    raise ValueError(f"stops {stops.shape} must be [n, W] with W = {state.window.shape[1]}")
  keys = jax.random.wrap_key_data(state.key_data)
  rows = jnp.arange(N)

  def body(carry):
    cache, s, i = carry
    alive = s.in_turn
    columns = jnp.where(alive, s.fill, cache.max_len)  # out of range: nothing written
    positions = jnp.where(alive, s.pos, -1)
    hidden, cache = forward_at_columns(
      params, s.last[:, None], positions[:, None], columns[:, None], cache, config=config
    )
    logits = logits_from_hidden(params, hidden[:, 0, :], config)
    tok, slogp, mlogp, thr = mt._sample_rows(
      strategy, logits, keys_lib.position_keys(keys, s.pos + 1 - s.start)
    )
    col = jnp.minimum(s.count, T - 1)
    put = lambda buf, x: buf.at[rows, col].set(jnp.where(alive, x, buf[rows, col]))
    window = jnp.where(
      alive[:, None], jnp.concatenate([s.window[:, 1:], tok[:, None]], 1), s.window
    )
    match = jnp.all((stops[None] == -1) | (window[:, None, :] == stops[None]), axis=-1)
    stop = alive & jnp.any(match, axis=-1)
    step = alive.astype(jnp.int32)
    count = s.count + step
    s = dataclasses.replace(
      s, last=jnp.where(alive, tok, s.last), pos=s.pos + step, fill=s.fill + step,
      in_turn=alive & ~stop & (count < s.budget), stopped=s.stopped | stop, window=window,
      count=count, tokens=put(s.tokens, tok), sampler_logp=put(s.sampler_logp, slogp),
      model_logp=put(s.model_logp, mlogp), threshold=put(s.threshold, thr),
      steps=s.steps + 1, live=s.live + jnp.sum(step),
    )  # fmt: skip
    return cache, s, i + 1

  cond = lambda carry: (carry[2] < steps) & jnp.any(carry[1].in_turn)
  cache, state, _ = jax.lax.while_loop(cond, body, (cache, state, jnp.zeros((), jnp.int32)))
  return mt._rows_cache(cache), _sharded(state)


@functools.partial(jax.jit, static_argnames=("config",), donate_argnames=("cache",))
def append(params, cache: KVCache, state: SlotTurns, obs, obs_len, *, config: ModelConfig):
  """Appends observations [N, W_obs] (``obs_len`` [N] tokens each; 0: none) after each slot's
  pending token, at the slot's own columns, in one forward; ``obs[n, len - 1]`` becomes the
  pending token. Returns (cache, state)."""
  N, W = obs.shape
  obs, obs_len = mt._rows(obs.astype(jnp.int32)), mt._rows(obs_len.astype(jnp.int32))
  j = jnp.arange(W, dtype=jnp.int32)[None, :]
  real = j < obs_len[:, None]
  fed = jnp.concatenate([state.last[:, None], obs[:, :-1]], axis=1)
  positions = jnp.where(real, state.pos[:, None] + j, -1)
  columns = jnp.where(real, state.fill[:, None] + j, cache.max_len)
  _, cache = forward_at_columns(params, fed, positions, columns, cache, config=config)
  new_last = jnp.take_along_axis(obs, jnp.maximum(obs_len - 1, 0)[:, None], axis=1)[:, 0]
  state = dataclasses.replace(
    state, last=jnp.where(obs_len > 0, new_last, state.last), pos=state.pos + obs_len,
    fill=state.fill + obs_len,
  )  # fmt: skip
  return mt._rows_cache(cache), _sharded(state)


def _pow2(n: int, cap: int) -> int:
  return min(cap, 1 << max(0, n - 1).bit_length())


def rollout_episodes_on_slots(
  params,
  pool: EnvPool,
  renderer,
  *,
  config: ModelConfig,
  strategy: Strategy,
  key: jax.Array,
  seeds: Sequence[int | None],
  decode: Callable[[list[int]], str],
  max_tokens: int,
  turn_tokens: int,
  stop_sequences: Sequence[Sequence[int]],
  pad_id: int,
  eos_ids: Sequence[int] = (),
  max_turns: int | None = None,
  prompt_ids=None,
  sample_ids=None,
  specs=None,
  num_slots: int = 0,
  chunk_steps: int = 16,
  obs_buckets: Sequence[int] = DEFAULT_BUCKETS,
  buckets: Sequence[int] = DEFAULT_BUCKETS,
  cache_buckets: Sequence[int] = DEFAULT_BUCKETS,
) -> EpisodeBatch:
  """``multiturn_rollout.rollout_episodes`` on ``num_slots`` decode slots (0: one per episode).

  Same arguments and result (the episodes, their log-probs and thresholds, metrics); the metrics
  add ``slots``, ``decode_steps``, ``useful_frac`` and ``admissions``. See the module docstring.
  """
  t_start = time.perf_counter()
  B = len(seeds)
  N = min(num_slots, B) if num_slots else B
  if N < 1 or turn_tokens < 1 or chunk_steps < 1:
    raise ValueError(
      f"need >= 1 slot, turn token and chunk step: {N}, {turn_tokens}, {chunk_steps}"
    )
  episodes = reset_episodes(
    pool, renderer, seeds, specs, max_tokens=max_tokens, max_turns=max_turns
  )
  prompt_ids = np.arange(B) if prompt_ids is None else np.asarray(prompt_ids)
  sample_ids = np.zeros(B) if sample_ids is None else np.asarray(sample_ids)
  key_data = np.asarray(jax.random.key_data(keys_lib.row_keys(
    key, np.asarray(prompt_ids, np.int32), np.asarray(sample_ids, np.int32)
  )))  # fmt: skip
  stops = mt.stop_table(stop_sequences)
  prompts, prompt_mask = _left_pad([e.prompt_ids or [pad_id] for e in episodes], pad_id, buckets)
  S = prompts.shape[1]
  # A row holds prompt[:-1] and at most max_tokens stream tokens but the pending one.
  cache, state = init_slots(
    config=config, num_slots=N, cache_len=bucket_length(S - 1 + max_tokens, cache_buckets),
    turn_tokens=turn_tokens, window=stops.shape[1], pad_id=pad_id,
  )  # fmt: skip
  dec_params = _unstack(params, config)
  eos = set(int(i) for i in eos_ids)
  model_logp = [[] for _ in range(B)]
  threshold = [[] for _ in range(B)]
  stats = {"decode_s": 0.0, "env_wait_s": 0.0, "append_s": 0.0, "admit_s": 0.0, "turns": 0}
  stats.update(env_submits=0, admissions=0)
  step_times = []

  queue = collections.deque(b for b, e in enumerate(episodes) if not e.done)
  slot_of = {}  # episode -> slot
  episode_in = [-1] * N  # slot -> episode (-1: free)
  decoding = set()  # slots whose turn the host has not read back yet
  serial = np.zeros(N, np.int64)  # turns begun per slot, as the device counts them
  ended = {}  # episode -> its action ended with an end-of-sequence token
  futures = []

  def begin(slots):
    nonlocal state
    rows, budget = np.zeros(N, bool), np.zeros(N, np.int32)
    for n in slots:
      rows[n] = True
      budget[n] = min(turn_tokens, episodes[episode_in[n]].remaining_tokens)
      serial[n] += 1
      decoding.add(n)
      stats["turns"] += 1
    state = begin_turns(state, rows, budget, pad_id=pad_id)

  def admit_free():
    nonlocal cache, state
    free = [n for n in range(N) if episode_in[n] < 0]
    take = [queue.popleft() for _ in range(min(len(free), len(queue)))]
    if not take:
      return
    t0 = time.perf_counter()
    A = _pow2(len(take), N)
    slot_ids = np.full(A, N, np.int32)  # N: an unused row (dropped)
    rows = np.zeros(A, np.int32)
    for i, (n, b) in enumerate(zip(free, take, strict=False)):
      slot_ids[i], rows[i], episode_in[n], slot_of[b] = n, b, b, n
    tokens, mask = prompts[rows], prompt_mask[rows]
    cache, state = admit(
      params, cache, state, slot_ids, tokens, mask, key_data[rows], config=config
    )
    stats["admissions"] += len(take)
    begin(free[: len(take)])
    stats["admit_s"] += time.perf_counter() - t0

  def read(snapshot):
    """Records the turns that ended in ``snapshot`` and sends their actions to the envs."""
    host = jax.device_get(snapshot)
    texts = {}
    for n in sorted(decoding):
      if host.in_turn[n] or host.serial[n] != serial[n]:
        continue
      decoding.discard(n)
      b = episode_in[n]
      action = take_action(host, n, episodes[b], model_logp[b], threshold[b], eos, decode)
      if action is not None:
        texts[b], ended[b] = action
      else:
        episode_in[n] = -1  # cut by the context limit: the episode is over
    if texts:
      t0 = time.perf_counter()
      future = pool.submit_step(texts)
      future.add_done_callback(lambda f: step_times.append(time.perf_counter() - t0))
      futures.append(future)
      stats["env_submits"] += 1
    return host

  def take_results(block: bool):
    """Env results that are back (waiting for the first when ``block``): episodes that go on get
    their observation appended and their next turn; the slots of the others are freed."""
    nonlocal cache, state
    if block:
      t0 = time.perf_counter()
      concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_COMPLETED)
      stats["env_wait_s"] += time.perf_counter() - t0
    done = [f for f in futures if f.done()]
    if not done:
      return
    for f in done:
      futures.remove(f)
    obs_rows = {}
    for f in done:
      for b, result in f.result().items():
        obs_ids = observe(renderer, episodes[b], result, ended[b])
        n = slot_of[b]
        if episodes[b].done:
          episode_in[n] = -1
        elif obs_ids:
          obs_rows[n] = obs_ids
        else:  # an empty observation: the next turn goes on from the pending token
          begin([n])
    if obs_rows:
      t0 = time.perf_counter()
      obs, obs_len = observation_batch(obs_rows, N, pad_id, obs_buckets)
      cache, state = append(dec_params, cache, state, obs, obs_len, config=config)
      begin(sorted(obs_rows))
      stats["append_s"] += time.perf_counter() - t0

  snapshots = collections.deque()
  while True:
    take_results(block=False)
    admit_free()
    if not decoding and not snapshots and not futures and not queue:
      if all(n < 0 for n in episode_in):
        break
    dispatched = False
    if decoding:
      t0 = time.perf_counter()
      cache, state = decode_chunk(
        dec_params, cache, state, stops, config=config, strategy=strategy, steps=chunk_steps
      )
      snapshots.append(state)
      dispatched = True
      stats["decode_s"] += time.perf_counter() - t0
    if snapshots and (len(snapshots) > 1 or not dispatched):
      t0 = time.perf_counter()
      read(snapshots.popleft())
      stats["decode_s"] += time.perf_counter() - t0
    elif not dispatched and futures:
      take_results(block=True)
  host = jax.device_get(state)
  stats["env_step_s"] = float(np.mean(step_times)) if step_times else 0.0
  stats["slots"] = N
  stats["cache_slots"] = cache.max_len
  stats["decode_steps"] = int(host.steps)
  stats["useful_frac"] = float(host.live) / max(1, int(host.steps) * N)
  stats["total_s"] = time.perf_counter() - t_start
  return EpisodeBatch(episodes, model_logp, threshold, stats)
