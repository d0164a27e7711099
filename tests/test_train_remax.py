"""ReMax in the trainer: the greedy baseline row is generated in the same call as the samples."""

import jax
import numpy as np

from rlvr_jax import sampling
from rlvr_jax.metrics import read_jsonl
from rlvr_jax.train import config as config_lib
from rlvr_jax.train.loop import Trainer, train


def _trainer(workdir, advantage):
  # A short warm start so that the sums are sometimes right: rewards vary within groups.
  c = config_lib.tiny_config(
    workdir,
    rl=dict(advantage=advantage),
    warm_start=dict(num_steps=60, batch_size=32, learning_rate=1e-2),
  )
  trainer = Trainer(c, log=lambda s: None)
  trainer.restore_or_start()
  return trainer


def test_remax_samples_one_greedy_row_per_prompt_as_the_baseline(tmp_path):
  """The G sampled rows are exactly those of a plain run (same keys), the greedy row's reward is
  the reward of greedy decoding, and the advantages are rewards - that baseline."""
  remax, plain = _trainer(tmp_path / "remax", "remax"), _trainer(tmp_path / "plain", "rloo")
  try:
    key = jax.random.key(3)
    source = plain.collector.source
    position = source.state()
    records = source.take(4)  # the prompts the collect calls below take
    source.restore(position)
    batch, _ = remax.collector.collect(remax.state.params, key=key)
    same, _ = plain.collector.collect(plain.state.params, key=key)
    texts, greedy = plain.collector.sample(
      plain.state.params, records, key=key, strategy=sampling.Greedy(), num_samples=1
    )
    greedy_rewards = plain.collector.submit_rewards(texts, records, greedy, 1)[1].result().rewards
  finally:
    remax.close()
    plain.close()
  P, G = 4, 4
  assert batch.tokens.shape[0] == P * G and batch.greedy_rewards.shape == (P,)
  np.testing.assert_array_equal(batch.tokens, same.tokens)
  np.testing.assert_array_equal(batch.rewards, same.rewards)
  np.testing.assert_array_equal(batch.greedy_rewards, greedy_rewards)
  assert 0 < batch.greedy_rewards.sum() < P and 0 < batch.rewards.sum() < P * G  # not constant
  valid = np.isfinite(batch.rewards)
  expected = np.where(valid, batch.rewards - batch.greedy_rewards[:, None], 0.0)
  np.testing.assert_allclose(batch.advantages.reshape(P, G), expected, atol=1e-6)


def test_remax_runs_in_the_training_loop(tmp_path):
  train(config_lib.tiny_config(tmp_path, rl=dict(advantage="remax")), log=lambda s: None)
  steps = [r for r in read_jsonl(str(tmp_path / "metrics.jsonl")) if "loss" in r]
  assert len(steps) == 2
  for r in steps:
    assert np.isfinite(r["loss"]) and 0.0 <= r["reward/greedy_mean"] <= 1.0
