"""The ``config.env`` block: multi-turn episodes (issue 16; ``train/multiturn.py``), its fields and
its validation (called by ``config.validate`` when ``env.id`` is set)."""

from __future__ import annotations

from ml_collections import ConfigDict

from rlvr_jax import advantages
from rlvr_jax.train import methods

ENV_RETURNS = ("final", "sum", "discounted")
ENV_RENDERERS = ("auto", "plain", "chat")


def env_section() -> ConfigDict:
  """The ``env`` block: multi-turn episodes instead of single-turn prompts when ``id`` is set.

  id: ``gem:<id>``, ``package.module:Name`` or a built-in (``envs.BUILTINS``); kwargs: its
  constructor arguments; tools: ``ToolEnv`` tool names. max_turns / max_tokens (context after the
  prompt) / turn_tokens (per turn) bound an episode; stop_strings end a turn besides EOS.
  Credit is ``rl.advantage``: a sequence estimator runs on the episode return (``return_mode``
  final / sum / discounted with ``gamma``), a turn estimator (one that reads ``turn_rewards``)
  on each turn's reward and gives each turn's tokens their own advantage. teacher:
  ``module:function`` making a policy for the warm-start demonstrations (``warm_start.num_steps``
  batches of episodes).
  """
  return ConfigDict(
    dict(
      id="",
      kwargs=ConfigDict(),
      tools=(),
      max_turns=5,
      max_tokens=64,
      turn_tokens=8,
      stop_strings=(),
      renderer="auto",
      plain_template="\n{obs}\n",
      return_mode="final",
      gamma=1.0,
      num_workers=2,
      step_timeout_s=10.0,
      reset_timeout_s=60.0,
      chunk_steps=8,
      seed=0,
      num_eval=64,
      teacher="",
      teacher_kwargs=ConfigDict(),
    )
  )


def validate_env(c, error) -> None:
  """Raises ``error(field, message)`` for a bad ``env`` block (called only when ``env.id`` is
  set); an unknown id names the closest choices."""

  def _need(cond: bool, field: str, msg: str) -> None:
    if not cond:
      raise error(field, msg)

  from rlvr_jax import envs  # plain Python, no jax; imported when an env is configured

  e = c.env
  try:
    envs.check_spec(envs.EnvSpec(e.id, dict(e.kwargs), tools=tuple(e.tools)))
  except envs.EnvConfigError as err:
    raise error("env.id", str(err)) from None
  _need(e.return_mode in ENV_RETURNS, "env.return_mode", f"{e.return_mode!r} not in {ENV_RETURNS}")
  _need(e.renderer in ENV_RENDERERS, "env.renderer", f"{e.renderer!r} not in {ENV_RENDERERS}")
  _need(e.max_turns >= 1, "env.max_turns", "must be >= 1")
  _need(e.turn_tokens >= 1, "env.turn_tokens", "must be >= 1")
  _need(e.max_tokens >= e.turn_tokens, "env.max_tokens", "must be >= env.turn_tokens")
  _need(0.0 < e.gamma <= 1.0, "env.gamma", f"must be in (0, 1], got {e.gamma}")
  _need(e.num_workers >= 1, "env.num_workers", "must be >= 1")
  _need(e.step_timeout_s > 0 and e.reset_timeout_s > 0, "env.step_timeout_s", "must be > 0")
  _need(e.chunk_steps >= 1, "env.chunk_steps", "must be >= 1")
  _need(e.num_eval >= 1, "env.num_eval", "must be >= 1")
  fits = sorted(n for n, spec in advantages.ESTIMATORS.items() if _fits_episodes(spec))
  _need(
    _fits_episodes(methods.estimator(c.rl.advantage)),
    "rl.advantage",
    f"multi-turn episodes take a stateless estimator without extra outputs that reads only "
    f"{sorted(methods.EPISODE_READS)} ({', '.join(fits)}); got {c.rl.advantage!r}",
  )
  _need(c.rl.zero_variance != "refill", "rl.zero_variance", "'refill' is single-turn only")


def _fits_episodes(spec) -> bool:
  """An estimator the episode collector can run: its reads are what episodes give (returns,
  action mask, turn rewards, turn index), no extra outputs, no state."""
  return set(spec.reads) <= methods.EPISODE_READS and not spec.outputs and spec.init_state is None
