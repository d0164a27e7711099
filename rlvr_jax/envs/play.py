"""The host-side episode loop: reset, act, step, render, until every episode is done.

:func:`play_episodes` drives a batch of episodes with any ``policy_fn`` that maps token contexts to
actions. It is the reference loop of a multi-turn rollout and what tests and small runs use; the
sampler's continuation (decoding from the KV cache, stepping the environments of finished rows
while others decode) follows the same per-row protocol:

  1. ``pool.reset(seeds)`` -> ``renderer.prompt_ids(observation)`` -> ``Episode``;
  2. per turn, for the rows not done: the policy's action ids (budget ``remaining_tokens``) ->
     ``episode.add_action``; rows whose action fit are stepped with the decoded text;
  3. ``episode.add_step(result, renderer.observation_ids(obs, role, action_ended))``;
  4. ``collate(episodes)`` -> the trainer's arrays.

Episodes whose reset failed are marked failed and never acted on; the others end at different
turns, and the loop only sends live rows to the policy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rlvr_jax.envs.episode import Episode
from rlvr_jax.envs.pool import EnvPool

# policy_fn({row: context ids}, {row: max new tokens}) -> {row: (action ids, action log-probs or None)}
PolicyFn = Callable[
  [dict[int, list[int]], dict[int, int]], dict[int, tuple[list[int], list[float] | None]]
]


def reset_episodes(pool, renderer, seeds, specs=None, *, max_tokens: int, max_turns=None):
  """Resets one environment per seed and opens its ``Episode`` on the rendered first observation
  (an episode whose reset failed is marked failed, with an empty prompt)."""
  episodes = []
  for start in pool.reset(seeds, specs):
    prompt = [] if start.failed else renderer.prompt_ids(start.observation)
    episode = Episode(prompt, max_tokens=max_tokens, max_turns=max_turns)
    if start.failed:
      episode.fail(start.failure)
    episodes.append(episode)
  return episodes


def play_episodes(
  pool: EnvPool,
  renderer,
  policy_fn: PolicyFn,
  *,
  seeds: Sequence[int | None],
  decode: Callable[[list[int]], str],
  eos_ids: Sequence[int] = (),
  specs=None,
  max_tokens: int,
  max_turns: int | None = None,
) -> list[Episode]:
  """Plays one episode per seed to the end; returns the episodes (group ordered as the seeds).

  Args:
    pool: the environments.
    renderer: ``ChatRenderer`` or ``PlainRenderer``.
    policy_fn: maps each live row's full context (prompt + stream so far) to its next action.
    seeds: one per episode (rows are group ordered: give the G rollouts of a prompt the same
      seed to play the same instance).
    decode: action ids -> the text the environment receives (stop tokens stripped).
    eos_ids: stop tokens; an action ending with one needs no end-of-turn text from the renderer.
    specs: per-episode ``EnvSpec`` (default: the pool's).
    max_tokens: stream budget after the prompt (context limit).
    max_turns: turn limit.
  """
  episodes = reset_episodes(
    pool, renderer, seeds, specs, max_tokens=max_tokens, max_turns=max_turns
  )
  eos = set(eos_ids)
  while True:
    live = [b for b, e in enumerate(episodes) if not e.done]
    if not live:
      return episodes
    contexts = {b: episodes[b].prompt_ids + episodes[b].stream()[0].tolist() for b in live}
    actions = policy_fn(contexts, {b: episodes[b].remaining_tokens for b in live})
    missing = set(live) - set(actions)
    if missing:
      raise ValueError(f"policy_fn returned no action for rows {sorted(missing)}")
    texts, ended = {}, {}
    for b in live:
      ids, logp = actions[b]
      ids = list(ids)
      if episodes[b].add_action(ids, logp):
        ended[b] = bool(ids) and ids[-1] in eos
        texts[b] = decode([i for i in ids if i not in eos])
    for b, result in pool.step(texts).items():
      role = result.info.get("role", "user") if not result.failed else "user"
      obs_ids = [] if result.done else renderer.observation_ids(
        result.observation, role=role, action_ended=ended[b]
      )  # fmt: skip
      episodes[b].add_step(result, obs_ids)
