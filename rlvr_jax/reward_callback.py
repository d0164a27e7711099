"""Calling the host reward runtime from inside a jitted function, via ``jax.experimental.io_callback``.

Most trainers should not need this: decoding and scoring on the host after ``generate`` returns,
with ``RewardRuntime.submit`` overlapping the next device step, keeps the device busy. This adapter
is for users who want a single jitted function that samples and scores; the device waits while
the host scores (the callback is blocking).

    reward_cb = make_reward_callback(reward_fn, decode_fn=tok.decode, examples=records,
                                     runtime=runtime, group_size=G)
    @jax.jit
    def step(tokens, lengths, example_ids):
      rewards = reward_cb(tokens, lengths, example_ids)   # [B] float32, NaN where failed
      ...
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from rlvr_jax.rewards import RewardResult, RewardRuntime


class RewardCallback:
  """Callable ``(tokens [B, T] int, lengths [B] int, example_ids [B] int) -> rewards [B] f32``.

  Args:
    reward_fn: a reward function or ItemReward (see ``rlvr_jax.rewards.protocol``).
    decode_fn: host function from a 1-D numpy array of token ids to text.
    examples: host-side example records (dicts); ``example_ids[b]`` indexes them. The key
      ``prompt_key`` gives the prompt text, ``field_names`` the example fields passed on.
    runtime: a RewardRuntime (process pool, timeouts); None scores in-process, without isolation.
    group_size: G, passed to group-aware rewards.
  Attributes:
    last_result: the RewardResult of the most recent call (failures, metrics), host side.
  """

  def __init__(
    self,
    reward_fn: Any,
    *,
    decode_fn: Callable[[np.ndarray], str],
    examples: Sequence[dict],
    runtime: RewardRuntime | None = None,
    group_size: int | None = None,
    field_names: Sequence[str] | None = None,
    prompt_key: str = "prompt_text",
  ):
    self.reward_fn = reward_fn
    self.decode_fn = decode_fn
    self.examples = examples
    self.runtime = runtime
    self.group_size = group_size
    if field_names is None:
      field_names = sorted(set(examples[0]) - {prompt_key}) if examples else []
    self.field_names = tuple(field_names)
    self.prompt_key = prompt_key
    self.last_result: RewardResult | None = None

  def _host(self, tokens: np.ndarray, lengths: np.ndarray, example_ids: np.ndarray) -> np.ndarray:
    tokens, lengths, example_ids = np.asarray(tokens), np.asarray(lengths), np.asarray(example_ids)
    completions = [self.decode_fn(tokens[b, : int(lengths[b])]) for b in range(tokens.shape[0])]
    rows = [self.examples[int(i)] for i in example_ids]
    prompts = [str(row.get(self.prompt_key, "")) for row in rows]
    fields = {name: [row[name] for row in rows] for name in self.field_names}
    fields["completion_lengths"] = lengths.astype(np.int64)
    if self.group_size is not None:
      fields["group_size"] = self.group_size
    if self.runtime is not None:
      result = self.runtime.run(self.reward_fn, prompts, completions, **fields)
    else:
      rewards = np.asarray(self.reward_fn(prompts, completions, **fields), dtype=np.float32)
      result = RewardResult(rewards=rewards, failures=[], metrics={})
    self.last_result = result
    return np.asarray(result.rewards, dtype=np.float32)

  def __call__(self, tokens: jax.Array, lengths: jax.Array, example_ids: jax.Array) -> jax.Array:
    if tokens.ndim != 2:
      raise ValueError(f"tokens must be [B, T], got shape {tokens.shape}")
    num_rows = tokens.shape[0]
    if lengths.shape != (num_rows,) or example_ids.shape != (num_rows,):
      raise ValueError(
        f"lengths {lengths.shape} and example_ids {example_ids.shape} must be [B]=({num_rows},) "
        f"for tokens {tokens.shape}"
      )
    out = jax.ShapeDtypeStruct((num_rows,), jnp.float32)
    return io_callback(self._host, out, tokens, lengths, example_ids, ordered=False)


def make_reward_callback(reward_fn: Any, **kwargs: Any) -> RewardCallback:
  """Shorthand for :class:`RewardCallback` (same arguments)."""
  return RewardCallback(reward_fn, **kwargs)
