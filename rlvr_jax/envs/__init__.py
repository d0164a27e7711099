"""Environments for multi-turn, tool-using episodes (host side; plain Python, no jax).

Typical use (``play_episodes`` runs this loop; the sampler's continuation follows it per row)::

  from rlvr_jax import envs
  pool = envs.EnvPool(envs.EnvSpec("gem:game:GuessTheNumber-v0-easy"), num_workers=2)
  renderer = envs.ChatRenderer(tokenizer)            # or envs.PlainRenderer(char_tokenizer)
  starts = pool.reset(seeds)                         # one episode per row, seeded
  episodes = [envs.Episode(renderer.prompt_ids(s.observation), max_tokens=1024) for s in starts]
  # per turn, for the rows not done: episodes[b].add_action(action_ids, action_logp)
  future = pool.submit_step({b: action_text[b] for b in rows})   # overlaps device work
  for b, result in future.result().items():
    obs_ids = renderer.observation_ids(result.observation, role=result.info.get("role", "user"))
    episodes[b].add_step(result, obs_ids)
  batch = envs.collate(episodes, pad_id=tokenizer.pad_id)  # tokens, policy_mask, turn_index, ...
"""

from rlvr_jax.envs.builtin import GuessNumberEnv, QuestionEnv, ScriptedEnv
from rlvr_jax.envs.episode import Episode, Turn, collate
from rlvr_jax.envs.play import play_episodes, reset_episodes
from rlvr_jax.envs.pool import EnvPool
from rlvr_jax.envs.protocol import (
  CAUSES,
  Env,
  EnvFailure,
  MalformedStepError,
  ResetResult,
  StepResult,
  check_reset,
  check_step,
)
from rlvr_jax.envs.registry import BUILTINS, EnvConfigError, EnvSpec, check_spec, make_env
from rlvr_jax.envs.render import ChatRenderer, PlainRenderer
from rlvr_jax.envs.tools import ToolCall, ToolEnv, calculator, execute, parse_tool_call

__all__ = [
  "BUILTINS",
  "CAUSES",
  "ChatRenderer",
  "Env",
  "EnvConfigError",
  "EnvFailure",
  "EnvPool",
  "EnvSpec",
  "Episode",
  "GuessNumberEnv",
  "MalformedStepError",
  "PlainRenderer",
  "QuestionEnv",
  "ResetResult",
  "ScriptedEnv",
  "StepResult",
  "ToolCall",
  "ToolEnv",
  "Turn",
  "calculator",
  "check_reset",
  "check_spec",
  "check_step",
  "collate",
  "execute",
  "make_env",
  "parse_tool_call",
  "play_episodes",
  "reset_episodes",
]
