"""The multi-turn trainer wiring (``train.multiturn``): the batch the train step consumes (action
tokens only in the loss, failed episodes excluded and counted), episode and turn credit, config
errors, and a short run through the training loop with its metrics."""

import json
import os

import numpy as np
import pytest

from rlvr_jax.train import config as config_lib
from rlvr_jax.train import loop, methods
from rlvr_jax.train.multiturn import MultiTurnCollector, episode_advantages, episode_returns

ALPHABET = "0123456789 :,?abcdefghijklmnopqrstuvwxyz"


def _config(tmp_path, **env):
  c = config_lib.tiny_config(
    tmp_path,
    tokenizer=dict(alphabet=ALPHABET),
    rl=dict(num_steps=2, prompts_per_step=2, zero_variance="keep"),
    sampling=dict(num_samples=4),
  )
  c.env.update(id="env_fixtures:FailAtTurnEnv", max_turns=4, max_tokens=40, turn_tokens=4,
               plain_template=" {obs} ", num_workers=1, step_timeout_s=5.0, chunk_steps=2,
               num_eval=8)  # fmt: skip
  c.env.kwargs.update(turn=2, mode="raise", num_turns=3, every=2)
  c.env.update(**env)
  return c


def test_unknown_env_id_is_a_config_error_naming_the_choices(tmp_path):
  c = _config(tmp_path, id="guess_numbr")
  with pytest.raises(config_lib.ConfigError, match="config.env.id.*guess_number"):
    config_lib.validate(c)
  with pytest.raises(config_lib.ConfigError, match="env.return_mode"):
    config_lib.validate(_config(tmp_path, return_mode="per_token"))
  config_lib.validate(_config(tmp_path))


def test_returns_and_turn_credit():
  r = np.array([[0.0, 1.0, np.nan], [0.5, np.nan, np.nan], [np.nan] * 3], np.float32)
  np.testing.assert_allclose(episode_returns(r, mode="final", gamma=1.0)[:2], [1.0, 0.5])
  np.testing.assert_allclose(episode_returns(r, mode="sum", gamma=1.0)[:2], [1.0, 0.5])
  np.testing.assert_allclose(episode_returns(r, mode="discounted", gamma=0.5)[:2], [0.5, 0.5])
  assert np.isnan(episode_returns(r, mode="discounted", gamma=0.5)[2])
  # Turn credit (a token estimator): per (prompt, turn index) z-scores of the returns on each
  # turn's action tokens, 0 elsewhere; a sequence estimator gives one advantage per episode.
  batch = {
    "turn_rewards": np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]], np.float32),
    "turn_index": np.array([[1, 1, 0, 2], [1, 0, 2, 2], [1, 0, 2, 0]], np.int32),
  }
  batch["policy_mask"] = batch["turn_index"] > 0
  R, valid = np.array([0.0, 0.0, 1.0]), np.array([True, True, False])
  spec = methods.estimator("turn_norm")
  adv = episode_advantages(batch, R, valid, spec=spec, hp=(), group_size=3)
  assert adv[0, 0] == adv[0, 1] > 0 > adv[1, 0]
  assert adv[0, 2] == 0 and adv[1, 1] == 0  # observation tokens
  assert adv[0, 3] == 0 and (adv[1, 2:] == 0).all()  # turn 2: equal returns
  assert (adv[2] == 0).all()  # an invalid episode
  seq = episode_advantages(batch, R, valid, spec=methods.estimator("grpo"), hp=(), group_size=3)
  assert seq.shape == (3,) and seq[0] == seq[1] == 0.0 == seq[2]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A 2-step run on an env whose episodes with an even seed raise at turn 2."""
  d = tmp_path_factory.mktemp("mt_run")
  c = _config(d)
  summary = loop.train(c, log=lambda s: None)
  with open(os.path.join(d, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  return c, summary, records


@pytest.mark.slow  # a whole Trainer (warm start off): ~40 s of compiles on 2 cores
def test_short_run_logs_episode_metrics_and_keeps_parity(trained):
  c, summary, records = trained
  steps = [r for r in records if "episode/turns_mean" in r]
  assert len(steps) == 2
  for r in steps:
    for k in ("episode/success", "episode/tool_calls_mean", "env/fail_frac", "env/step_time_s",
              "env/fail/exception", "loss"):  # fmt: skip
      assert k in r, k
    # Sampler / trainer parity on interleaved sequences, inside the train step itself, which
    # runs each group's first prompt once (rl.share_prompts: the 4 episodes of a group share it).
    assert r["logp_gap/max"] <= 1e-5
    assert r["update/shared_prompts"] == 1.0
  # Failed episodes (groups of 4 rows share a seed) are counted and the run goes on.
  fails = [r["env/fail/exception"] for r in steps]
  assert 0 < sum(fails) < 16 and all(f % 4 == 0 for f in fails)
  assert [r["env/fail_frac"] for r in steps] == [f / 8 for f in fails]
  assert "eval/greedy_turns" in summary["eval_after"]


def test_collected_batch_trains_action_tokens_of_healthy_episodes_only(tmp_path):
  c = _config(tmp_path)
  from rlvr_jax.train import build

  tok, params, mcfg = build.build_tokenizer_and_model(c)
  col = MultiTurnCollector(config=c, model_config=mcfg, tokenizer=tok)
  try:
    import jax

    batch, _ = col.collect(params, key=jax.random.key(5))
    eb = col.play(params, [0, 1, 2, 3], key=jax.random.key(5), group_size=4)
  finally:
    col.close()
  failed = ~np.isfinite(batch.rewards.reshape(-1))
  assert failed.any() and not failed.all()
  assert not batch.completion_mask[failed].any()
  assert batch.completion_mask[~failed].sum(1).min() > 0
  # Observations are in the stream (context) but never in the completion mask.
  stream = eb.collate(pad_id=tok.pad_id)
  assert (stream["token_mask"] & ~stream["policy_mask"]).any()
  assert batch.tokens.shape[1] == c.env.max_tokens
  assert batch.metrics["env/fail_frac"] == failed.mean()
  # GRPO on the return: zero-mean advantages over the healthy rows of each group.
  adv = batch.advantages.reshape(c.rl.prompts_per_step, -1)
  ok = ~failed.reshape(adv.shape)
  for p in range(adv.shape[0]):
    assert abs(adv[p][ok[p]].sum()) < 1e-4
    assert (adv[p][~ok[p]] == 0).all()


def test_the_continuous_engine_collects_the_same_batch(tmp_path):
  """``sampling.engine=continuous`` (episodes through 3 decode slots) collects the batch the
  lockstep sampler does: tokens, masks and advantages equal, log-probs within 1e-5."""
  import jax

  from rlvr_jax.train import build

  batches = {}
  for engine in ("static", "continuous"):
    c = _config(tmp_path)
    c.sampling.update(engine=engine, num_slots=3)
    tok, params, mcfg = build.build_tokenizer_and_model(c)
    col = MultiTurnCollector(config=c, model_config=mcfg, tokenizer=tok)
    try:
      batches[engine] = col.collect(params, key=jax.random.key(5))[0]
    finally:
      col.close()
  a, b = batches["static"], batches["continuous"]
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.completion_mask, b.completion_mask)
  np.testing.assert_array_equal(a.advantages, b.advantages)
  np.testing.assert_allclose(a.sampler_logp, b.sampler_logp, atol=1e-5)
  assert "rollout/useful_frac" in b.metrics and "rollout/hole_frac" in a.metrics
