"""PURE's min-form credit as a trainer estimator (``rl.advantage="pure"``): steps split at
``separator_ids`` in the sampled ids, step rewards summed from the implicit PRM's token rewards,
advantages equal to the library on the collected batch, and an RL step that trains policy + PRM."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import advantages, data
from rlvr_jax.train import config as config_lib
from rlvr_jax.train import step as step_lib
from rlvr_jax.train.loop import Trainer


@pytest.mark.slow
def test_pure_estimator_through_the_trainer(tmp_path):
  sep = data.CharTokenizer(config_lib.base_config().tokenizer.alphabet).encode(
    "1", add_special_tokens=False
  )
  c = config_lib.tiny_config(
    tmp_path, implicit_prm=dict(enabled=True, beta=0.5, learning_rate=1e-2),
    rl=dict(advantage="pure", advantage_kwargs=dict(separator_ids=tuple(sep), outcome_coef=0.5)),
  )  # fmt: skip
  trainer = Trainer(c, log=lambda s: None)
  try:
    trainer.restore_or_start()
    # A PRM that differs from the reference, so the step rewards are not all 0.
    prm = jax.tree.map(lambda x: x * 1.3, trainer.state.params)
    ref = trainer.state.extra["ref_params"]
    batch, _ = trainer.collector.collect(
      trainer.state.params, key=jax.random.key(0), ref_params=ref, prm_params=prm
    )
    tokens, positions = step_lib.sequence_inputs(
      batch.prompt_tokens, batch.prompt_mask, jnp.asarray(batch.tokens)
    )
    t = batch.tokens.shape[1]
    score = trainer.collector.score_fn
    prm_logp, _ = score(prm, tokens, positions, t)
    ref_logp, _ = score(ref, tokens, positions, t)
    mask = jnp.asarray(batch.completion_mask)
    dense = advantages.implicit_process_rewards(prm_logp, ref_logp, mask, beta=0.5)
    assert float(jnp.abs(dense).max()) > 1e-3
    want = advantages.pure_token_advantages(
      dense, jnp.asarray(batch.rewards), mask, jnp.asarray(batch.tokens),
      separator_ids=tuple(sep), outcome_coef=0.5,
    )  # fmt: skip
    assert batch.advantages.shape == batch.completion_mask.shape
    np.testing.assert_allclose(batch.advantages, want, atol=1e-5)
    assert np.abs(batch.advantages).max() > 0
    metrics = trainer.rl_step(0)
    assert metrics["prm/skipped"] == 0.0 and metrics["skipped"] == 0.0
  finally:
    trainer.close()


def test_pure_needs_its_separators_and_the_prm(tmp_path):
  with pytest.raises(config_lib.ConfigError, match="separator_ids"):
    config_lib.validate(
      config_lib.tiny_config(tmp_path, implicit_prm=dict(enabled=True), rl=dict(advantage="pure"))
    )
  no_prm = config_lib.tiny_config(
    tmp_path, rl=dict(advantage="pure", advantage_kwargs=dict(separator_ids=(5,)))
  )
  with pytest.raises(config_lib.ConfigError, match="implicit_prm.enabled"):
    config_lib.validate(no_prm)
