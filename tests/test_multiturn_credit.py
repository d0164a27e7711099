"""Turn-level credit selected in the trainer (``rl.advantage=<turn estimator>``, issue 16): the
estimators of ``advantages.turn_estimators`` equal the compositions of the pure functions of
``advantages.turns`` they document; the advantages the train step uses equal them on the episodes
the step collected; a turn estimator in a single-turn run (and a single-turn-only estimator in a
multi-turn run) is a config error."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import advantages
from rlvr_jax.advantages import turns
from rlvr_jax.train import config as config_lib
from rlvr_jax.train import loop
from rlvr_jax.train.multiturn import episode_returns

ALPHABET = "0123456789 :,?abcdefghijklmnopqrstuvwxyz"
TURN_ESTIMATORS = sorted(n for n, s in advantages.ESTIMATORS.items() if "turn_rewards" in s.reads)


def reference(name, r, turn_index, valid, group_size, **hp):
  """The documented composition of ``turns`` functions; invalid episodes enter as all-NaN rows."""
  r = jnp.asarray(np.where(np.asarray(valid)[:, None], r, np.nan), jnp.float32)
  if name == "turn_norm":
    returns = turns.discounted_turn_returns(r, gamma=hp.get("gamma", 1.0))
    adv = turns.turn_group_normalize(returns, group_size=group_size, use_std=True)
  elif name == "mapo":
    returns = turns.discounted_turn_returns(r, gamma=hp.get("gamma", 1.0))
    size = group_size if hp.get("turn_scope") == "group" else r.shape[0]
    adv = turns.mapo_advantages(returns, group_size=size, mix=hp.get("mix", 0.5))
  elif name == "matchtir":
    adv = turns.matchtir_advantages(r, group_size=group_size, gamma=hp.get("gamma", 0.9))
  elif name == "a2tgpo":
    adv = turns.a2tgpo_advantages(r, group_size=group_size, gamma=hp.get("gamma", 1.0))
  else:
    raise AssertionError(f"no reference for {name}")
  return np.asarray(turns.turn_values_to_tokens(adv, jnp.asarray(turn_index)))


def _episodes(seed, P=3, G=4, K=4, T=12):
  """Random episodes: row b reaches turns 1..n_b (3 tokens per turn, an observation token after
  each), with per-turn rewards; one invalid row per batch."""
  rng = np.random.default_rng(seed)
  n = rng.integers(1, K + 1, P * G)
  r = np.where(np.arange(K)[None] < n[:, None], rng.integers(0, 3, (P * G, K)) / 2, np.nan)
  index = np.zeros((P * G, T), np.int32)
  for b in range(P * G):
    for k in range(min(n[b], T // 3)):
      index[b, 3 * k : 3 * k + 2] = k + 1
  valid = np.ones(P * G, bool)
  valid[rng.integers(0, P * G)] = False
  R = np.where(valid, np.nansum(r, 1), np.nan).astype(np.float32)
  return R.reshape(P, G), r.astype(np.float32), index, valid.reshape(P, G)


@pytest.mark.parametrize("name", TURN_ESTIMATORS)
def test_turn_estimators_equal_their_pure_compositions(name):
  assert set(TURN_ESTIMATORS) == {"turn_norm", "mapo", "matchtir", "a2tgpo"}
  spec = advantages.ESTIMATORS[name]
  assert spec.level == "token"
  for seed, hp in ((0, {}), (1, {"gamma": 0.7}), (2, {"mix": 0.25, "turn_scope": "group"})):
    hp = {k: v for k, v in hp.items() if k in spec.hyperparameters()}
    R, r, index, valid = _episodes(seed)
    inputs = {"rewards": jnp.asarray(R), "turn_rewards": jnp.asarray(r),
              "turn_index": jnp.asarray(index), "valid": jnp.asarray(valid)}  # fmt: skip
    got = np.asarray(spec.compute(inputs, **hp).advantages)
    want = reference(name, r, index, valid.reshape(-1), R.shape[1], **hp)
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert (got[index == 0] == 0).all() and (got[~valid.reshape(-1)] == 0).all()
    assert (got != 0).any()
    # An invalid episode's rewards change nothing (excluded from every statistic).
    bad = int(np.flatnonzero(~valid.reshape(-1))[0])
    r2 = r.copy()
    r2[bad] = 7.0
    again = spec.compute({**inputs, "turn_rewards": jnp.asarray(r2)}, **hp).advantages
    np.testing.assert_array_equal(np.asarray(again), got)


def _config(tmp_path, advantage, **rl):
  c = config_lib.tiny_config(
    tmp_path,
    tokenizer=dict(alphabet=ALPHABET),
    rl=dict(num_steps=1, prompts_per_step=4, zero_variance="keep", advantage=advantage, **rl),
    sampling=dict(num_samples=4),
  )
  c.env.update(id="env_fixtures:ActionRewardEnv", max_turns=4, max_tokens=40, turn_tokens=4,
               plain_template=" {obs} ", num_workers=1, step_timeout_s=5.0, chunk_steps=2,
               num_eval=8)  # fmt: skip
  c.env.kwargs.update(num_turns=4, fail_every=2)
  return c


def test_turn_estimator_needs_episodes_and_episodes_need_fitting_estimators(tmp_path):
  for name in TURN_ESTIMATORS:
    single = config_lib.tiny_config(tmp_path, rl=dict(advantage=name))
    with pytest.raises(config_lib.ConfigError, match="rl.advantage.*only multi-turn episodes"):
      config_lib.validate(single)
    config_lib.validate(_config(tmp_path, name))
  # Episodes give no answer ids, and no state is kept between steps for them.
  with pytest.raises(config_lib.ConfigError, match="answer_ids.*multi-turn episodes do not"):
    config_lib.validate(_config(tmp_path, "copo"))
  with pytest.raises(config_lib.ConfigError, match="rl.advantage.*stateless.*mapo"):
    config_lib.validate(_config(tmp_path, "riskpo", advantage_kwargs=dict(bundle_size=2)))
  config_lib.validate(_config(tmp_path, "grpo"))


def _run_one_step(c):
  """One RL step of a Trainer; returns (episodes it played, the TrainBatch its step got)."""
  trainer = loop.Trainer(c)
  plays, batches = [], []
  play, step = trainer.collector.play, trainer.train_step

  def recording_play(*args, **kwargs):
    plays.append(play(*args, **kwargs))
    return plays[-1]

  def recording_step(state, tb, num_tokens, num_seqs, key):
    batches.append(jax.tree.map(np.asarray, tb))
    return step(state, tb, num_tokens, num_seqs, key)

  trainer.collector.play, trainer.train_step = recording_play, recording_step
  try:
    trainer.restore_or_start()
    metrics = trainer.rl_step(0)
  finally:
    trainer.close()
  assert len(plays) == 1 and len(batches) == 1 and np.isfinite(metrics["loss"])
  return plays[0], batches[0]


def _check_step_advantages(c, name, hp):
  eb, tb = _run_one_step(c)
  P, G = c.rl.prompts_per_step, c.sampling.num_samples
  batch = eb.collate(pad_id=0, num_tokens=c.env.max_tokens, num_turns=c.env.max_turns)
  R = episode_returns(batch["turn_rewards"], mode=c.env.return_mode, gamma=c.env.gamma)
  valid = ~batch["failed"] & np.isfinite(R)
  want = reference(name, batch["turn_rewards"], batch["turn_index"], valid, G, **hp)
  cmask = batch["policy_mask"] & valid[:, None]
  np.testing.assert_array_equal(tb.completion_mask, cmask)
  np.testing.assert_allclose(tb.advantages, want * cmask, atol=1e-6)
  # The data exercise what turn credit is for: failed episodes, episodes of different lengths,
  # and rows whose turns get different advantages.
  assert batch["failed"].any() and not batch["failed"].all()
  assert len(set(batch["num_turns"][valid].tolist())) > 1
  per_row = [len(set(np.round(want[b][cmask[b]], 6).tolist())) for b in range(P * G)]
  assert max(per_row) > 1


@pytest.mark.slow  # a Trainer per case: ~40 s of compiles each on 2 cores (2 min when loaded)
@pytest.mark.parametrize(
  "name, hp", [("mapo", {"gamma": 0.8, "mix": 0.3}), ("a2tgpo", {})], ids=["mapo", "a2tgpo"]
)
def test_the_train_step_uses_the_turn_estimators_advantages(tmp_path, name, hp):
  """Through the Trainer on an env with action-dependent per-turn rewards: the advantages and
  mask of the step's batch equal the reference on the episodes the step collected (the other
  turn estimators share this wiring; their math is checked above)."""
  c = _config(tmp_path, name, advantage_kwargs=hp)
  _check_step_advantages(c, name, hp)
