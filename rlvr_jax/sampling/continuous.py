"""Continuous batching: a fixed number of decode slots, refilled from a queue, in one jitted call.

``sampler.generate`` decodes its B = P * G rows as one static batch until the longest has ended:
with long-tailed completion lengths most of its slot-steps compute rows that have already
finished. ``generate`` here decodes with N <= B slots instead:

  jit:  prefill the P prompts once -> the prompt cache (one per prompt, not one per row)
        sample token 0 of all B rows from the prefill logits (as the static sampler does)
        queue = the rows that need more tokens, in row order; fill the N slots from it
        for each cache phase (the completion buffers grow, as the static cache does):
          while a slot is live:
            decode one token for every live slot (``model.decode_slots``: each slot attends to
              its prompt's keys / values and to its own completion's)
            sample, write to the row's outputs, end the rows that stopped or used their budget
            refill the freed slots from the queue: the row's prompt keys / values are copied in
              from the prompt cache (one copy per refilled slot), its completion buffer reset
  out:  the same ``Rollout`` as ``sampler.generate`` (rows in group order), and ``SlotStats``.

Every row's token t uses the key of (prompt id, sample id, t) (``keys``), whatever slot and
step it is decoded in, so a row's tokens are those of the static sampler; its log-probs agree
to float rounding, not bitwise: XLA computes a row's values with kernels chosen by the shapes of
the whole batch (a [n, 576] x [576, 1536] float32 matmul gives different bits for a row at
n = 8 and n = 64 on XLA:CPU), and the slot batch (N) and buffers differ from the static batch.
The tests check both (``tests/test_continuous_sampling.py``).

Memory: the prompt cache holds each prompt's keys / values once (P x S_b), and the N slots hold
the prompts and completions of the rows they decode: KV cache = P S_b + N (S_b + T_c) entries
per layer against the static sampler's B (S_b + T). The prompt is copied into a slot when the
slot is refilled, not read from the prompt cache at every step: a per-step gather of the
slots' prompts (the first version) copied N S_b entries per layer per step, which on XLA made
a step up to a third slower than the static one on equal lengths.

Prefix forks: ``fork_prefixes`` turns (row, position) pairs of a rollout into prompts of their
prefixes, and ``generate`` on them samples K continuations per prefix, the prefix stored once and
read by its K continuations (the primitive of tree / segment rollouts).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.model import (
  ModelConfig,
  compute_params,
  decode_slots,
  fill_slot_prompts,
  grow_slot_cache,
  init_slot_cache,
  logits_from_hidden,
  unstack_layers,
  with_unembed,
)
from rlvr_jax.sampling import sampler as static
from rlvr_jax.sampling.strategies import Strategy
from rlvr_jax.types import Rollout, pytree_dataclass


@pytree_dataclass
class SlotStats:
  """What a continuous call did (scalars, int32).

  Attributes:
    steps: decode steps (iterations of the slot loop).
    slot_steps: steps x slots: the rows' worth of decode work done.
    live_slot_steps: slot-steps of slots that held a row (each produced one of its tokens).
    refills: rows taken from the queue into a slot after the first fill.
  """

  steps: jax.Array
  slot_steps: jax.Array
  live_slot_steps: jax.Array
  refills: jax.Array


@pytree_dataclass
class SlotState:
  """The carry of the slot loop (N slots, B rows).

  Attributes:
    cache: the ``SlotCache`` (completion keys / values of each slot).
    row: [N] int32 the row a slot decodes, -1 when it is empty.
    t: [N] int32 the completion position of the slot's next token.
    last: [N] int32 the slot's token at position t - 1 (fed to the next decode step).
    next: [] int32 the next queue entry to take.
    buf: the ``DecodeBuffers`` [B, T] of every row.
    done: [B] bool, the row sampled a stop token.
    stats: ``SlotStats`` so far.
  """

  cache: object
  row: jax.Array
  t: jax.Array
  last: jax.Array
  next: jax.Array
  buf: static.DecodeBuffers
  done: jax.Array
  stats: SlotStats


def completion_phases(max_new_tokens: int, *, min_steps: int | None) -> tuple[int, ...]:
  """Lengths of the slots' completion buffers, phase by phase (as ``sampler.cache_phases`` for
  the static cache, from 0 prompt slots): a phase ends when a slot's next column is past it."""
  return static.cache_phases(0, max_new_tokens, min_steps=min_steps)


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
  num_slots: int,
  phases: tuple[int, ...],
) -> tuple[Rollout, SlotStats]:
  """The jitted body of ``generate`` (arguments as ``sampler._generate``, plus ``num_slots``;
  ``phases`` are the completion buffer lengths, ``completion_phases``)."""
  rows = static.rows_of_call(
    prompt_tokens, prompt_mask, prompt_ids, key, stop_tokens, temperatures, budgets,
    num_samples=num_samples, max_new_tokens=max_new_tokens,
  )  # fmt: skip
  P, S = prompt_tokens.shape
  G, T, N = num_samples, max_new_tokens, num_slots
  B = P * G
  if not phases or phases[-1] != T or list(phases) != sorted(set(phases)):
    raise ValueError(f"completion phases {phases} must increase to max_new_tokens = {T}")
  params = compute_params(params, config)
  # The prompt cache: each prompt's keys / values once, S slots (no room for completions).
  logits, prompt_cache, start = static._prefill(
    params, prompt_tokens, prompt_mask, config=config, cache_len=S
  )
  params = with_unembed(unstack_layers(params, config), config)

  # Token 0 of every row from its prompt's prefill logits, exactly as the static sampler.
  repeat = lambda a: static._constrain_rows(jnp.repeat(a, G, axis=0))
  tok0, slogp0, mlogp0, thr0 = static._sample(
    strategy, repeat(logits), rows.keys, 0, rows.temperatures
  )
  stop0 = static.is_stop(tok0, stop_tokens)
  write0 = lambda b, c: b.at[:, 0].set(c)
  buf = jax.tree.map(
    write0,
    static.empty_buffers(B, T, pad_id),
    static.DecodeBuffers(tokens=tok0, sampler_logp=slogp0, model_logp=mlogp0, threshold=thr0,
                         mask=jnp.ones((B,), bool)),
  )  # fmt: skip
  # The queue: rows that need a decode step (no stop at token 0, a budget above 1), in order.
  needs = ~stop0 & (rows.budgets > 1)
  queue = jnp.argsort(~needs, stable=True).astype(jnp.int32)
  queued = jnp.sum(needs, dtype=jnp.int32)

  def take(state_row, state_t, state_last, nxt, free):
    """Fills the ``free`` slots with the next queued rows (in slot order)."""
    rank = jnp.cumsum(free.astype(jnp.int32)) - 1
    entry = nxt + rank
    fill = free & (entry < queued)
    new_row = jnp.take(queue, jnp.minimum(entry, B - 1))
    row = jnp.where(fill, new_row, state_row)
    t = jnp.where(fill, 1, state_t)
    last = jnp.where(fill, jnp.take(tok0, new_row), state_last)
    return row, t, last, fill, nxt + jnp.sum(fill, dtype=jnp.int32)

  empty = jnp.full((N,), -1, jnp.int32)
  row, t, last, _, nxt = take(
    empty, jnp.zeros((N,), jnp.int32), jnp.zeros((N,), jnp.int32), jnp.zeros((), jnp.int32),
    jnp.ones((N,), bool),
  )  # fmt: skip
  cache = init_slot_cache(prompt_cache, jnp.maximum(row, 0) // G, phases[0])
  zero = jnp.zeros((), jnp.int32)
  state = SlotState(
    cache=cache,
    row=row,
    t=t,
    last=last,
    next=nxt,
    buf=buf,
    done=stop0,
    stats=SlotStats(steps=zero, slot_steps=zero, live_slot_steps=zero, refills=zero),
  )

  def body(s: SlotState) -> SlotState:
    live = s.row >= 0
    r = jnp.maximum(s.row, 0)
    prompt = r // G
    feed = jnp.where(live, jnp.take(start, prompt) + s.t - 1, -1)
    column = jnp.where(live, s.t - 1, 0)
    hidden, cache = decode_slots(params, s.last, feed, column, s.cache, config=config)
    logits = logits_from_hidden(params, hidden, config)
    temps = None if rows.temperatures is None else jnp.take(rows.temperatures, r)
    tok, slogp, mlogp, thr = static._sample(strategy, logits, jnp.take(rows.keys, r), s.t, temps)
    # Empty slots write out of bounds (row B): dropped.
    dest = jnp.where(live, s.row, B)
    put = lambda b, c: b.at[dest, s.t].set(c, mode="drop")
    buf = jax.tree.map(
      put, s.buf,
      static.DecodeBuffers(tokens=tok, sampler_logp=slogp, model_logp=mlogp, threshold=thr,
                           mask=jnp.ones((N,), bool)),
    )  # fmt: skip
    stop = live & static.is_stop(tok, stop_tokens)
    done = s.done.at[dest].set(stop, mode="drop")
    ended = live & (stop | (s.t + 1 >= jnp.take(rows.budgets, r)))
    row = jnp.where(ended, -1, s.row)
    row, t, last, fill, nxt = take(row, s.t + 1, tok, s.next, row < 0)
    cache = fill_slot_prompts(cache, fill, jnp.maximum(row, 0) // G, prompt_cache)
    refilled = nxt - s.next
    stats = SlotStats(
      steps=s.stats.steps + 1,
      slot_steps=s.stats.slot_steps + N,
      live_slot_steps=s.stats.live_slot_steps + jnp.sum(live, dtype=jnp.int32),
      refills=s.stats.refills + refilled,
    )
    return SlotState(
      cache=cache, row=row, t=t, last=last, next=nxt, buf=buf, done=done, stats=stats
    )

  for length in phases:
    if length > state.cache.max_len:
      state = dataclasses.replace(state, cache=grow_slot_cache(state.cache, length))
    # A live slot's next decode writes column t - 1: the phase holds it while t <= length.
    cond = lambda s, length=length: jnp.any(s.row >= 0) & jnp.all((s.row < 0) | (s.t <= length))
    state = jax.lax.while_loop(cond, body, state)
  rollout = rows.rollout(prompt_tokens, prompt_mask, state.buf, state.done, strategy)
  return rollout, state.stats


generate_jit = jax.jit(
  _generate,
  static_argnames=(
    "config",
    "strategy",
    "num_samples",
    "max_new_tokens",
    "pad_id",
    "num_slots",
    "phases",
  ),
)


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
  num_slots: int | None = None,
  stop_tokens: Sequence[int] | None = None,
  prompt_ids=None,
  pad_id: int | None = None,
  buckets: Sequence[int] = static.DEFAULT_BUCKETS,
  temperatures=None,
  phase_steps: int | None = static.DEFAULT_PHASE_STEPS,
  max_lengths=None,
  with_stats: bool = False,
):
  """``sampler.generate`` with ``num_slots`` decode slots refilled from a queue of the rows.

  Same arguments and the same ``Rollout`` as ``sampler.generate`` (rows in group order, the same
  tokens: see the module docstring), plus:

  Args:
    num_slots: N, the rows decoded at once (default: all B rows, no queue). Under a mesh, N
      should divide over the data axes.
    phase_steps: as in ``sampler.generate``, for the slots' completion buffers.
    with_stats: also return the call's ``SlotStats`` (host ints).
  Returns:
    the ``Rollout``, or (rollout, stats dict) with ``with_stats``.
  """
  call = static.prepare_call(
    prompt_tokens, prompt_mask, config=config, num_samples=num_samples, strategy=strategy,
    key=key, max_new_tokens=max_new_tokens, stop_tokens=stop_tokens, prompt_ids=prompt_ids,
    pad_id=pad_id, buckets=buckets, temperatures=temperatures, max_lengths=max_lengths,
  )  # fmt: skip
  B = call.tokens.shape[0] * num_samples
  num_slots = B if num_slots is None else int(num_slots)
  if not 1 <= num_slots <= B:
    raise ValueError(f"num_slots must be in [1, B = {B}], got {num_slots}")
  rollout, stats = generate_jit(
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
    num_slots=num_slots,
    phases=completion_phases(max_new_tokens, min_steps=phase_steps),
  )
  if not with_stats:
    return rollout
  return rollout, {f: int(getattr(stats, f)) for f in stats.__dataclass_fields__}


def kv_entries_per_row(
  *, num_prompts: int, num_samples: int, prompt_len: int, max_new_tokens: int, num_slots: int
) -> dict:
  """KV cache entries (per layer and kv head) per row of a call, static against continuous.

  static: B (S_b + T) (every row holds its prompt); continuous: P S_b + N (S_b + T) (the
  prompt cache, and each slot's prompt and completion); both divided by B.
  """
  P, G, S, T, N = num_prompts, num_samples, prompt_len, max_new_tokens, num_slots
  B = P * G
  return {"static": (B * (S + T)) / B, "continuous": (P * S + N * (S + T)) / B}


def fork_prefixes(
  rollout: Rollout, rows: Sequence[int], positions: Sequence[int], *, pad_id: int = 0
) -> tuple[np.ndarray, np.ndarray]:
  """Prompts of the prefixes (row, position): the row's prompt and its first ``position``
  completion tokens, left-padded into [R, S] ids and mask (host arrays).

  ``generate`` on them with ``num_samples=K`` samples K continuations of each prefix; the
  prefix's tokens keep their positions (a prompt's tokens are numbered from 0), so a
  continuation's log-probs are those of the whole sequence (prompt, completion[:position],
  continuation) in one forward pass (``tests/test_continuous_sampling.py``).
  """
  prompt_tokens = np.asarray(rollout.prompt_tokens)
  prompt_mask = np.asarray(rollout.prompt_mask).astype(bool)
  tokens = np.asarray(rollout.tokens)
  lengths = np.asarray(rollout.lengths)
  rows, positions = np.asarray(rows, np.int64), np.asarray(positions, np.int64)
  if rows.shape != positions.shape or rows.ndim != 1:
    raise ValueError(f"rows {rows.shape} and positions {positions.shape} must both be [R]")
  bad = [(int(r), int(p)) for r, p in zip(rows, positions, strict=True)
         if not (0 <= r < len(tokens) and 0 <= p <= lengths[r])]  # fmt: skip
  if bad:
    raise ValueError(
      f"fork points (row, position) {bad[:5]} are outside the rollout (a position must be in "
      "[0, the row's length])"
    )
  seqs = [
    np.concatenate([prompt_tokens[r][prompt_mask[r]], tokens[r, :p]])
    for r, p in zip(rows, positions, strict=True)
  ]
  return left_pad_sequences(seqs, pad_id=pad_id)


def left_pad_sequences(seqs: Sequence, *, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Token sequences of any lengths as left-padded [R, S] int32 ids and bool mask (S = the
  longest), the prompt layout ``generate`` takes."""
  width = max(len(x) for x in seqs)
  ids = np.full((len(seqs), width), pad_id, np.int32)
  mask = np.zeros((len(seqs), width), bool)
  for i, x in enumerate(seqs):
    ids[i, width - len(x) :] = x
    mask[i, width - len(x) :] = True
  return ids, mask


__all__ = [
  "SlotStats",
  "completion_phases",
  "fork_prefixes",
  "generate",
  "kv_entries_per_row",
]
