"""Multi-turn rollouts on the device: ``envs`` episodes driven by ``sampling.multiturn``.

``rollout_episodes`` follows the per-row protocol of ``envs.play_episodes`` (the reference loop)
with the policy's turns decoded from the KV cache:

  reset every episode (pool) -> render prompts -> ``start_episodes`` (one prefill)
  per turn:
    ``begin_turn`` for the live rows, budget = min(turn_tokens, room left in the context)
    ``decode_chunk`` calls of ``chunk_steps`` steps, pipelined: chunk k + 1 is dispatched before
      the host reads chunk k, and the rows whose turn ended in chunk k are submitted to the
      ``EnvPool`` at once, so their environment steps run while the device decodes the others
    observations rendered (``renderer.observation_ids``) and ``append``-ed in one forward
  until every episode is done (terminated, truncated by the env / turn limit / context limit, or
  failed). Environment failures (hang, crash, exception, malformed tuple) come back from the pool
  as failed steps: the episode is marked failed with its cause and its row stops; the others go on.

The result carries the ``envs.Episode`` records (token stream, masks, rewards, flags) plus the
model log-probs and truncation thresholds of every action token, and timing metrics.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np

from rlvr_jax.envs import EnvPool, Episode, collate, reset_episodes
from rlvr_jax.model import ModelConfig, compute_params, unstack_layers, with_unembed
from rlvr_jax.sampling import keys as keys_lib
from rlvr_jax.sampling import multiturn as mt
from rlvr_jax.sampling.sampler import DEFAULT_BUCKETS, bucket_length
from rlvr_jax.sampling.strategies import Strategy


@dataclasses.dataclass
class EpisodeBatch:
  """B episodes (group ordered) with the sampler's per-token extras, one array per turn."""

  episodes: list[Episode]
  model_logp: list[list[np.ndarray]]
  threshold: list[list[np.ndarray]]
  metrics: dict

  def collate(self, *, pad_id: int, num_tokens: int | None = None, num_turns=None) -> dict:
    """``envs.collate`` plus ``model_logp`` and ``sampler_threshold`` [B, T] on action tokens."""
    out = collate(self.episodes, pad_id=pad_id, num_tokens=num_tokens, num_turns=num_turns)
    for name, per_row in (("model_logp", self.model_logp), ("sampler_threshold", self.threshold)):
      arr = np.zeros(out["tokens"].shape, np.float32)
      for b, turns in enumerate(per_row):
        vals = np.concatenate(turns) if turns else np.zeros((0,), np.float32)
        arr[b, np.flatnonzero(out["policy_mask"][b])] = vals
      out[name] = arr
    return out


# The decode layout, once per rollout: per-layer weights, in the compute dtype (mixed precision),
# with the materialised unembedding (``with_unembed``).
_unstack = jax.jit(
  lambda params, config: with_unembed(
    unstack_layers(compute_params(params, config), config), config
  ),
  static_argnums=1,
)


def take_action(host, row, episode, logps, thresholds, eos, decode):
  """Adds the turn that row ``row`` of the device snapshot ``host`` (a ``TurnState`` or
  ``SlotTurns``) sampled to ``episode``, and its model log-probs and thresholds to ``logps`` /
  ``thresholds``. Returns (the text the environment receives, whether the action ended with an
  end-of-sequence id), or None when the context limit cut the action (no environment step)."""
  n = int(host.count[row])
  ids = host.tokens[row, :n].tolist()
  ok = episode.add_action(ids, host.sampler_logp[row, :n].tolist())
  logps.append(host.model_logp[row, :n].copy())
  thresholds.append(host.threshold[row, :n].copy())
  if not ok:
    return None
  ended = bool(host.stopped[row]) and bool(ids) and ids[-1] in eos
  return decode([i for i in ids if i not in eos]), ended


def observe(renderer, episode, result, action_ended: bool) -> list[int]:
  """Records the environment step ``result`` in ``episode``; returns the rendered observation
  ids (empty when the step ended the episode)."""
  role = result.info.get("role", "user") if not result.failed else "user"
  obs_ids = [] if result.done else renderer.observation_ids(
    result.observation, role=role, action_ended=action_ended
  )  # fmt: skip
  episode.add_step(result, obs_ids)
  return obs_ids


def observation_batch(obs_rows: dict, num_rows: int, pad_id: int, buckets):
  """{row: observation ids} -> (obs [num_rows, W] left-aligned, obs_len [num_rows]), W the bucket
  of the longest observation; rows without one have length 0."""
  W = bucket_length(max(len(o) for o in obs_rows.values()), buckets)
  obs = np.full((num_rows, W), pad_id, np.int32)
  obs_len = np.zeros(num_rows, np.int32)
  for row, o in obs_rows.items():
    obs[row, : len(o)], obs_len[row] = o, len(o)
  return obs, obs_len


def _left_pad(rows: Sequence[Sequence[int]], pad_id: int, buckets) -> tuple[np.ndarray, np.ndarray]:
  S = bucket_length(max(2, max(len(r) for r in rows)), buckets)
  tokens = np.full((len(rows), S), pad_id, np.int32)
  mask = np.zeros((len(rows), S), bool)
  for b, r in enumerate(rows):
    if r:
      tokens[b, S - len(r) :], mask[b, S - len(r) :] = r, True
  return tokens, mask


def rollout_episodes(
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
  chunk_steps: int = 16,
  obs_buckets: Sequence[int] = DEFAULT_BUCKETS,
  buckets: Sequence[int] = DEFAULT_BUCKETS,
  cache_buckets: Sequence[int] = DEFAULT_BUCKETS,
) -> EpisodeBatch:
  """Plays one episode per seed with the model as the policy (see the module docstring).

  Args:
    params: model params (stacked, as the trainer holds them; placed for sampling under a mesh).
    pool, renderer: the environments and the observation renderer (``envs``).
    config, strategy, key: model config, sampling strategy, base key of this call.
    seeds: one per episode; rows are group ordered (give a group's G rows the same seed).
    decode: action ids -> the text the environment receives (``eos_ids`` are stripped first).
    max_tokens: context limit after the prompt (actions + observations; ``Episode``).
    turn_tokens: most tokens per turn (static: the width of a turn's buffers).
    stop_sequences: id sequences that end a turn (EOS as ``[eos]``, tokenised stop strings); the
      stop sequence is part of the action.
    pad_id, eos_ids: padding id; ids stripped from the env's text (the renderer then knows the
      action ended with its end-of-turn token).
    max_turns: turn limit (None: none).
    prompt_ids, sample_ids: [B] ints for the per-row keys (default: row // 1 and 0).
    specs: per-episode ``EnvSpec``s (default: the pool's).
    chunk_steps: decode steps per device call (smaller: earlier env steps, more host syncs).
    obs_buckets, buckets, cache_buckets: allowed observation widths, prompt lengths and cache
      lengths (one compiled decode chunk per cache length: fewer buckets, fewer compiles, more
      empty slots attended).
  """
  t_start = time.perf_counter()
  B = len(seeds)
  episodes = reset_episodes(
    pool, renderer, seeds, specs, max_tokens=max_tokens, max_turns=max_turns
  )
  prompt_ids = np.arange(B) if prompt_ids is None else np.asarray(prompt_ids)
  sample_ids = np.zeros(B) if sample_ids is None else np.asarray(sample_ids)
  row_keys = keys_lib.row_keys(
    key, np.asarray(prompt_ids, np.int32), np.asarray(sample_ids, np.int32)
  )
  stops = mt.stop_table(stop_sequences)
  tokens, mask = _left_pad([e.prompt_ids or [pad_id] for e in episodes], pad_id, buckets)
  index = tokens.shape[1] - 1
  cache, state = mt.start_episodes(
    params, tokens, mask, config=config, cache_len=bucket_length(index + turn_tokens, cache_buckets),
    turn_tokens=turn_tokens, window=stops.shape[1], pad_id=pad_id,
  )  # fmt: skip
  params = _unstack(params, config)
  eos = set(int(i) for i in eos_ids)
  model_logp = [[] for _ in range(B)]
  threshold = [[] for _ in range(B)]
  stats = {"decode_s": 0.0, "env_wait_s": 0.0, "env_step_s": [], "append_s": 0.0, "turns": 0}
  stats["holes"] = 0
  stats["decode_steps"] = 0  # decode steps of the whole batch (each one step of every row)
  stats["env_submits"] = 0  # env step batches sent; > turns when some went while decoding went on

  def submit(texts):
    t0 = time.perf_counter()
    future = pool.submit_step(dict(texts))
    future.add_done_callback(lambda f: stats["env_step_s"].append(time.perf_counter() - t0))
    return future

  while True:
    live = [b for b, e in enumerate(episodes) if not e.done]
    if not live:
      break
    stats["turns"] += 1
    active = np.zeros(B, bool)
    active[live] = True
    budget = np.zeros(B, np.int32)
    for b in live:
      budget[b] = min(turn_tokens, episodes[b].remaining_tokens)
    t0 = time.perf_counter()
    cache = mt.ensure_capacity(cache, index + turn_tokens, cache_buckets)
    state = mt.begin_turn(state, active, budget, pad_id=pad_id)
    futures, ended, handled = [], {}, set()
    cur = state
    cache, nxt = mt.decode_chunk(
      params, cache, cur, stops, row_keys, config=config, strategy=strategy, steps=chunk_steps
    )
    while True:
      # Dispatched before reading ``nxt`` (asynchronous): the device decodes chunk k + 1 while the
      # host submits the env steps of the rows that finished in chunk k.
      cache, after = mt.decode_chunk(
        params, cache, nxt, stops, row_keys, config=config, strategy=strategy, steps=chunk_steps
      )
      host = jax.device_get(nxt)
      texts = {}
      for b in live:
        if b not in handled and not host.in_turn[b]:
          handled.add(b)
          action = take_action(host, b, episodes[b], model_logp[b], threshold[b], eos, decode)
          if action is not None:
            texts[b], ended[b] = action
      if texts:
        futures.append(submit(texts))
        stats["env_submits"] += 1
      if not host.in_turn.any():
        state = after
        break
      nxt = after
    steps = int(host.t)
    index += steps
    stats["decode_steps"] += steps
    stats["holes"] += int(steps * B - host.count.sum())
    stats["decode_s"] += time.perf_counter() - t0
    t0 = time.perf_counter()
    results = {}
    for future in futures:
      results.update(future.result())
    stats["env_wait_s"] += time.perf_counter() - t0
    obs_rows = {}
    for b, result in results.items():
      obs_ids = observe(renderer, episodes[b], result, ended[b])
      if not episodes[b].done and obs_ids:
        obs_rows[b] = obs_ids
    if obs_rows:
      t0 = time.perf_counter()
      obs, obs_len = observation_batch(obs_rows, B, pad_id, obs_buckets)
      W_obs = obs.shape[1]
      cache = mt.ensure_capacity(cache, index + W_obs, cache_buckets)
      cache, state = mt.append(params, cache, state, obs, obs_len, config=config)
      index += W_obs
      stats["holes"] += int(W_obs * B - obs_len.sum())
      stats["append_s"] += time.perf_counter() - t0
  step_times = stats.pop("env_step_s")
  stats["env_step_s"] = float(np.mean(step_times)) if step_times else 0.0
  stats["cache_slots"] = index
  stats["total_s"] = time.perf_counter() - t_start
  return EpisodeBatch(episodes, model_logp, threshold, stats)
