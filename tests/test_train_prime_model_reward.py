"""Issue 17 in the trainer: PRIME's implicit PRM as a second parameter tree updated in the same RL
step (token advantages from it), and on-device model rewards combined with the host reward."""

import jax
import numpy as np
import pytest

from rlvr_jax import advantages
from rlvr_jax.train import config as config_lib
from rlvr_jax.train.loop import Trainer

WARM = dict(num_steps=60, batch_size=32, learning_rate=1e-2)


@pytest.mark.slow
def test_prime_trains_the_prm_and_uses_its_token_advantages(tmp_path):
  c = config_lib.tiny_config(
    tmp_path, rl=dict(advantage="prime"), implicit_prm=dict(enabled=True, learning_rate=1e-2),
    warm_start=WARM,
  )  # fmt: skip
  trainer = Trainer(c, log=lambda s: None)
  try:
    trainer.restore_or_start()
    prm0 = jax.tree.map(np.asarray, trainer.state.extra["prm_params"])
    policy0 = jax.tree.map(np.asarray, trainer.state.params)
    for a, b in zip(jax.tree.leaves(prm0), jax.tree.leaves(policy0), strict=True):
      np.testing.assert_array_equal(a, b)  # the PRM starts as the warm-started policy
    batch, _ = trainer.collector.collect(
      trainer.state.params, key=jax.random.key(0), ref_params=trainer.state.extra["ref_params"],
      prm_params=trainer.state.extra["prm_params"],
    )  # fmt: skip
    # Token advantages: with π_φ = π_ref the process reward is 0, so PRIME reduces to the
    # whitened RLOO returns of the outcome (checked against the library on the same batch).
    assert batch.advantages.shape == batch.completion_mask.shape
    zero = np.zeros(batch.completion_mask.shape, np.float32)
    want = advantages.prime_advantages(
      zero, batch.rewards, batch.completion_mask, valid=np.isfinite(batch.rewards)
    )
    np.testing.assert_allclose(batch.advantages, want, atol=1e-5)
    metrics = trainer.rl_step(0)
    assert metrics["prm/skipped"] == 0.0 and np.isfinite(metrics["prm/loss"])
    prm1 = trainer.state.extra["prm_params"]
    pairs = zip(jax.tree.leaves(prm1), jax.tree.leaves(prm0), strict=True)
    moved = [not np.allclose(a, b) for a, b in pairs]
    assert any(moved)  # the PRM was updated in the same RL step
  finally:
    trainer.close()


def test_config_needs_prime_and_its_estimator_together(tmp_path):
  with pytest.raises(config_lib.ConfigError, match="implicit_prm.enabled"):
    config_lib.validate(config_lib.tiny_config(tmp_path, rl=dict(advantage="prime")))
  with pytest.raises(config_lib.ConfigError, match="model_reward.name"):
    config_lib.validate(config_lib.tiny_config(tmp_path, model_reward=dict(name="nope")))


def test_self_certainty_replaces_the_host_reward(tmp_path):
  c = config_lib.tiny_config(
    tmp_path, model_reward=dict(name="self_certainty", replace=True, weight=2.0)
  )
  trainer = Trainer(c, log=lambda s: None)
  try:
    trainer.restore_or_start()
    batch, _ = trainer.collector.collect(trainer.state.params, key=jax.random.key(1))
    from rlvr_jax.train import model_rewards  # noqa: PLC0415

    fn = model_rewards.make_model_reward_fn(
      model_config=trainer.model_config, kind="self_certainty", chunk_size=c.rl.logprob_chunk
    )
    sc = fn(trainer.state.params, batch.prompt_tokens, batch.prompt_mask, batch.tokens,
            batch.completion_mask, None, None, None)["model_reward"]  # fmt: skip
    np.testing.assert_allclose(batch.rewards.reshape(-1), 2.0 * np.asarray(sc), rtol=1e-5)
    assert batch.metrics["reward/model/mean"] == pytest.approx(float(np.mean(sc)), rel=1e-5)
    # The held-out accuracy still reads the task's verifier, not the model reward.
    assert set(np.unique(batch.correct)) <= {0.0, 1.0}
  finally:
    trainer.close()
