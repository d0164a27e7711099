"""Multi-turn rollout collection: environment episodes -> the train step's batch (issue 16).

``MultiTurnCollector.collect`` plays P groups of G episodes (the G rows of a group share the
environment seed, so they play the same instance) with ``sampling.multiturn_rollout`` and returns
the same ``rollout.RolloutBatch`` the single-turn collector does:

  * ``tokens`` [B, T]: the interleaved stream a_1, o_1, a_2, ... (T = ``env.max_tokens``, static),
    ``prompt_tokens`` the rendered reset observation; the trainer's positions (prompt length + t)
    are the compacted stream's, which the sampler used, so its log-probs match;
  * ``completion_mask`` = ``policy_mask`` (action tokens only: observations are context, never
    trained, never counted in the normalisers) and False on failed episodes (excluded from the
    update, counted in ``env/fail_frac`` and ``env/fail/<cause>``) and on masked groups;
  * ``advantages``: the ``rl.advantage`` estimator, run on what its spec reads of
    ``methods.EPISODE_READS``: the episode returns R [P, G] (``env.return_mode``: final turn's
    reward, sum, or discounted sum_k gamma^(k-1) r_k; NaN and ``valid`` False on failed
    episodes), the action-token mask, the per-turn rewards ``turn_rewards`` [B, K] and each
    token's turn ``turn_index`` [B, T]. A sequence estimator gives [B], broadcast to the action
    tokens by the loop; a token estimator (the turn-level ones) gives [B, T], used as it is.

Metrics: ``episode/turns_mean``, ``episode/success`` (terminated with a positive final reward),
``episode/tool_calls_mean``, ``env/fail_frac``, ``env/fail/<cause>``, ``env/step_time_s``,
``env/wait_s``, ``rollout/hole_frac`` (``rollout/useful_frac`` with ``sampling.engine=continuous``), plus the single-turn names (``reward/mean``,
``accuracy/mean`` = success, ``length/mean`` = action tokens per episode, ...).
"""

from __future__ import annotations

import functools
import importlib
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlvr_jax import advantages as adv_lib
from rlvr_jax import envs, sampling
from rlvr_jax.data.char_tokenizer import CharTokenizer
from rlvr_jax.sampling.multiturn_rollout import rollout_episodes
from rlvr_jax.sampling.multiturn_slots import rollout_episodes_on_slots
from rlvr_jax.train import config as config_lib
from rlvr_jax.train import methods, sft
from rlvr_jax.train import step as step_lib
from rlvr_jax.train.layout import Layout
from rlvr_jax.train.rollout import RolloutBatch, estimate

EVAL_SEED = 10**6  # held-out episodes use seeds EVAL_SEED + i (training seeds stay below)
# Cache lengths of a rollout: powers of two, so a run compiles few decode programs (each decode
# step attends over the whole cache: at most 2x the filled slots).
CACHE_BUCKETS = tuple(2**p for p in range(6, 15))


def make_renderer(env_cfg, tokenizer):
  kind = env_cfg.renderer
  if kind == "auto":
    kind = "plain" if isinstance(tokenizer, CharTokenizer) else "chat"
  if kind == "plain":
    return envs.PlainRenderer(tokenizer, template=env_cfg.plain_template)
  return envs.ChatRenderer(tokenizer)


def episode_returns(turn_rewards: np.ndarray, *, mode: str, gamma: float) -> np.ndarray:
  """[B] returns from [B, K] turn rewards (NaN = missing; all-NaN rows -> NaN)."""
  r = jnp.asarray(turn_rewards)
  if mode == "discounted":
    first = adv_lib.discounted_turn_returns(r, gamma=gamma)[:, 0]
    return np.asarray(jnp.where(jnp.any(jnp.isfinite(r), -1), first, jnp.nan))
  return np.asarray(adv_lib.episode_return(r, mode=mode))


def episode_advantages(batch: dict, R, valid, *, spec, hp, group_size: int) -> np.ndarray:
  """The configured estimator on an episode batch: [B] (sequence level) or [B, T] (token level),
  0 on invalid episodes. ``batch``: ``collate``'s arrays; ``R`` [B] returns; ``valid`` [B]."""
  P = len(R) // group_size
  inputs = {
    "rewards": jnp.asarray(np.asarray(R, np.float32).reshape(P, group_size)),
    "valid": jnp.asarray(np.asarray(valid).reshape(P, group_size)),
    "completion_mask": jnp.asarray(batch["policy_mask"] & np.asarray(valid)[:, None]),
    "turn_rewards": jnp.asarray(batch["turn_rewards"]),
    "turn_index": jnp.asarray(batch["turn_index"]),
  }
  out = estimate({k: inputs[k] for k in ("valid", *spec.reads)}, None, spec=spec, hp=hp)
  adv, ok = np.asarray(out.advantages, np.float32), np.asarray(valid, bool)
  if spec.level == "sequence":
    return np.where(ok, adv.reshape(-1), 0.0).astype(np.float32)
  return np.where(ok[:, None], adv, 0.0).astype(np.float32)


def _import(path: str):
  module, _, name = path.partition(":")
  if not module or not name:
    raise ValueError(f"env.teacher must be 'package.module:function', got {path!r}")
  return getattr(importlib.import_module(module), name)


def _left_pad(rows, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  S = sampling.bucket_length(max(1, max(len(r) for r in rows)))
  tokens = np.full((len(rows), S), pad_id, np.int32)
  mask = np.zeros((len(rows), S), bool)
  for b, r in enumerate(rows):
    if r:
      tokens[b, S - len(r) :], mask[b, S - len(r) :] = r, True
  return tokens, mask


class MultiTurnCollector:
  """Builds rollout batches of environment episodes (module docstring). Single process; under a
  mesh the sampler's rows and cache are sharded as in ``sampling.generate``."""

  def __init__(self, *, config, model_config, tokenizer, layout=None):
    self.c, self.model_config, self.tokenizer = config, model_config, tokenizer
    self.layout = layout if layout is not None else Layout()
    e = config.env
    self.spec = envs.EnvSpec(e.id, dict(e.kwargs), tools=tuple(e.tools))
    self.pool = envs.EnvPool(
      self.spec, num_workers=e.num_workers, timeout_s=e.step_timeout_s,
      reset_timeout_s=e.reset_timeout_s,
    )  # fmt: skip
    self.renderer = make_renderer(e, tokenizer)
    self.pad_id = tokenizer.pad_id
    self.stops = [[i] for i in tokenizer.eos_ids] + [
      tokenizer.encode(s, add_special_tokens=False) for s in e.stop_strings
    ]
    s = config.sampling
    if s.top_k or s.top_p < 1.0:
      self.strategy = sampling.Combined(
        temperature=s.temperature, top_k=s.top_k or None, top_p=s.top_p if s.top_p < 1 else None
      )
    else:
      self.strategy = sampling.Temperature(s.temperature)
    self.score_fn = step_lib.make_score_fn(
      model_config=model_config, temperature=s.temperature, chunk_size=config.rl.logprob_chunk,
      num_microbatches=config.rl.num_microbatches,
    )  # fmt: skip

  def decode(self, ids) -> str:
    return self.tokenizer.decode(list(ids))

  def play(self, params, seeds, *, key, strategy=None, group_size=1):
    """Episodes for ``seeds`` (one per row; rows group ordered) -> ``EpisodeBatch``."""
    e, s = self.c.env, self.c.sampling
    B = len(seeds)
    # The continuous engine: episodes through ``num_slots`` decode slots (0: one per episode).
    engine = dict(num_slots=s.num_slots) if s.engine == "continuous" else {}
    play = rollout_episodes_on_slots if s.engine == "continuous" else rollout_episodes
    with self.layout.context():
      return play(
        self.layout.sampling_params(params), self.pool, self.renderer, config=self.model_config,
        strategy=strategy or self.strategy, key=key, seeds=seeds, decode=self.decode,
        max_tokens=e.max_tokens, turn_tokens=e.turn_tokens, stop_sequences=self.stops,
        pad_id=self.pad_id, eos_ids=self.tokenizer.eos_ids, max_turns=e.max_turns,
        prompt_ids=np.arange(B) // group_size, sample_ids=np.arange(B) % group_size,
        chunk_steps=e.chunk_steps, cache_buckets=CACHE_BUCKETS, **engine,
      )  # fmt: skip

  def _batch_arrays(self, eb):
    e = self.c.env
    batch = eb.collate(pad_id=self.pad_id, num_tokens=e.max_tokens, num_turns=e.max_turns)
    batch["prompt_tokens"], batch["prompt_mask"] = _left_pad(
      [ep.prompt_ids for ep in eb.episodes], self.pad_id
    )
    return batch

  def collect(self, params, *, key, ref_params=None, need_old=False, adv_state=None):
    """One batch of P groups x G episodes; returns (RolloutBatch, adv_state unchanged)."""
    c, e = self.c, self.c.env
    P, G = c.rl.prompts_per_step, c.sampling.num_samples
    rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel().tolist())
    seeds = np.repeat(e.seed + rng.integers(0, EVAL_SEED - e.seed, P), G).tolist()
    t0 = time.perf_counter()
    eb = self.play(params, seeds, key=key, group_size=G)
    t1 = time.perf_counter()
    batch = self._batch_arrays(eb)
    failed = batch["failed"]
    R = episode_returns(batch["turn_rewards"], mode=e.return_mode, gamma=e.gamma)
    valid = ~failed & np.isfinite(R)
    success = self.success(eb)
    # the configured group filter (rl.group_filter) on the episode returns, the outcome here
    group_filter = adv_lib.GROUP_FILTERS[c.rl.group_filter]
    zero_var = np.asarray(group_filter.fn(jnp.asarray(np.where(valid, R, np.nan).reshape(P, G))))
    hp = tuple(sorted(config_lib.advantage_kwargs(c).items()))
    adv = episode_advantages(
      batch, R, valid, spec=methods.estimator(c.rl.advantage), hp=hp, group_size=G
    )
    cmask = batch["policy_mask"] & valid[:, None]
    if c.rl.zero_variance == "mask":
      cmask &= ~np.repeat(zero_var, G)[:, None]
    tokens, positions = step_lib.sequence_inputs(
      batch["prompt_tokens"], batch["prompt_mask"], jnp.asarray(batch["tokens"])
    )
    T = batch["tokens"].shape[1]
    # rl.share_prompts: a group's episodes start from one prompt (checked on the host).
    shared = c.rl.share_prompts and step_lib.shares_prompts(
      batch["prompt_tokens"], batch["prompt_mask"], G, c.rl.num_microbatches
    )
    score = functools.partial(self.score_fn, prompt_group=G if shared else 1)
    scores = {}
    if need_old:
      scores["old_logp"] = np.asarray(score(params, tokens, positions, T)[0])
    if ref_params is not None:
      scores["ref_logp"] = np.asarray(score(ref_params, tokens, positions, T)[0])
    metrics = self.episode_metrics(eb, batch, R, valid, success)
    metrics.update({
      "time/sample": t1 - t0,
      "groups/zero_var_frac": float(zero_var.mean()),
      "advantage/abs_mean": float(np.abs(adv).mean()),
    })  # fmt: skip
    out = RolloutBatch(
      prompt_tokens=batch["prompt_tokens"],
      prompt_mask=batch["prompt_mask"],
      tokens=batch["tokens"],
      completion_mask=cmask,
      sampler_logp=batch["sampler_logp"],
      lengths=batch["policy_mask"].sum(1).astype(np.int32),
      advantages=adv,
      rewards=np.where(valid, R, np.nan).reshape(P, G).astype(np.float32),
      correct=success.reshape(P, G).astype(np.float32),
      scores=scores,
      metrics=metrics,
    )
    return out, adv_state

  @staticmethod
  def success(eb) -> np.ndarray:
    """[B] terminated with a positive final reward (failed episodes: False)."""
    return np.array(
      [
        e.failure is None and e.terminated and bool(e.turns) and e.turns[-1].reward > 0
        for e in eb.episodes
      ]
    )

  def episode_metrics(self, eb, batch, R, valid, success) -> dict:
    B = len(eb.episodes)
    causes = [e.failure.cause for e in eb.episodes if e.failure is not None]
    tool_calls = [sum("tool" in t.info for t in e.turns) for e in eb.episodes]
    actions = batch["policy_mask"].sum(1)
    out = {
      "reward/mean": float(R[valid].mean()) if valid.any() else float("nan"),
      "accuracy/mean": float(success.mean()),
      "episode/success": float(success.mean()),
      "episode/turns_mean": float(batch["num_turns"].mean()),
      "episode/tool_calls_mean": float(np.mean(tool_calls)),
      "episode/context_truncated_frac": float(
        np.mean([e.truncation == "context" for e in eb.episodes])
      ),
      "length/mean": float(actions.mean()),
      "length/max": float(actions.max()),
      "length/stream_mean": float(batch["token_mask"].sum(1).mean()),
      "length/truncated_frac": float(batch["truncated"].mean()),
      "env/fail_frac": len(causes) / B,
      "env/step_time_s": eb.metrics["env_step_s"],
      "env/wait_s": eb.metrics["env_wait_s"],
      "time/decode": eb.metrics["decode_s"],
    }
    if "useful_frac" in eb.metrics:  # decode slots: no holes; slot-steps that sampled a token
      out["rollout/useful_frac"] = eb.metrics["useful_frac"]
    else:
      out["rollout/hole_frac"] = eb.metrics["holes"] / max(1, eb.metrics["cache_slots"] * B)
    for cause in envs.CAUSES:
      out[f"env/fail/{cause}"] = float(causes.count(cause))
    return out

  # ------------------------------------------------------------------ eval and warm start
  def evaluate(self, params, *, seed: int = 1234) -> dict:
    """Held-out episodes (seeds EVAL_SEED + i): greedy and sampled success and mean turns."""
    n = self.c.env.num_eval
    # Padded to a multiple of the training batch (extra episodes dropped): the same shapes, so
    # evaluation reuses the compiled rollout programs.
    rows = self.c.rl.prompts_per_step * self.c.sampling.num_samples
    seeds = [EVAL_SEED + i for i in range(-(-n // rows) * rows)]
    out = {}
    for name, strategy in (
      ("greedy", sampling.Greedy()),
      ("sampled", sampling.Temperature(self.c.eval.temperature)),
    ):
      success, turns = [], []
      for i in range(0, len(seeds), rows):
        eb = self.play(params, seeds[i : i + rows], key=jax.random.key(seed), strategy=strategy)
        success.append(self.success(eb))
        turns.append([len(e.turns) for e in eb.episodes])
      success, turns = np.concatenate(success)[:n], np.concatenate(turns)[:n]
      out[f"eval/{name}_success"] = float(success.mean())
      out[f"eval/{name}_turns"] = float(turns.mean())
      out[f"eval/{name}_turns_if_success"] = (
        float(turns[success].mean()) if success.any() else float("nan")
      )
    return out

  def warm_start(self, params, *, log=print):
    """SFT on ``warm_start.num_steps`` batches of teacher episodes (``env.teacher``): next-token
    cross-entropy on the action tokens only. Returns (params, losses)."""
    c, e, w = self.c, self.c.env, self.c.warm_start
    policy = _import(e.teacher)(self.tokenizer, **dict(e.teacher_kwargs))
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(w.learning_rate))
    opt_state = optimizer.init(params)
    step = sft.make_sft_step(model_config=self.model_config, optimizer=optimizer)
    losses = []
    for i in range(w.num_steps):
      seeds = [EVAL_SEED * 2 + i * w.batch_size + j for j in range(w.batch_size)]
      episodes = envs.play_episodes(
        self.pool, self.renderer, policy, seeds=seeds, decode=self.decode,
        eos_ids=self.tokenizer.eos_ids, max_tokens=e.max_tokens, max_turns=e.max_turns,
      )  # fmt: skip
      batch = envs.collate(episodes, pad_id=self.pad_id, num_tokens=e.max_tokens)
      ids, mask = _left_pad([ep.prompt_ids for ep in episodes], self.pad_id)
      tokens, positions = step_lib.sequence_inputs(ids, mask, jnp.asarray(batch["tokens"]))
      cmask = jnp.asarray(batch["policy_mask"] & ~batch["failed"][:, None])
      params, opt_state, loss = step(params, opt_state, tokens, positions, cmask)
      losses.append(float(loss))
      if (i + 1) % max(w.num_steps // 5, 1) == 0:
        log(f"warm start (teacher episodes) step {i + 1}/{w.num_steps}: loss {losses[-1]:.4f}")
    del c
    return params, losses

  def close(self) -> None:
    self.pool.close()
