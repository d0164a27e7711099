"""A user's own objective and advantage estimator, defined in this file (outside the package),
train in the trainer: the objective named by import path in the config (``<module>:MY_OBJECTIVE``,
issue 14's resolver), the estimator registered through the public API; the loss the trainer logs
equals the user's function on the same batch, and the advantages the user's estimator."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import advantages, losses
from rlvr_jax.train import config as config_lib
from rlvr_jax.train import loop, methods
from rlvr_jax.train import step as step_lib


def my_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                 ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                 scale=1.5, **options):  # fmt: skip
  """A user's loss: token mean of -scale A logp + 0.1 (logp - old_logp)^2."""
  m = jnp.asarray(completion_mask, jnp.float32)
  per_token = -scale * advantages * logp + 0.1 * (logp - old_logp) ** 2
  loss = jnp.sum(m * per_token) / num_tokens
  return loss, {"loss/total": (loss * num_tokens, jnp.sum(m))}


def my_estimator(rewards, *, valid=None, shift=0.25):
  """A user's baseline: A = R - mean_g R - shift on valid samples, 0 elsewhere."""
  ok = jnp.isfinite(rewards) if valid is None else valid & jnp.isfinite(rewards)
  r = jnp.where(ok, rewards, 0.0)
  mean = jnp.sum(r, -1, keepdims=True) / jnp.maximum(jnp.sum(ok, -1, keepdims=True), 1)
  return jnp.where(ok, r - mean - shift, 0.0)


MY_OBJECTIVE = losses.ObjectiveSpec("user_objective", my_objective, token_local=True,
                                    paper="tests/test_user_method.py")  # fmt: skip
MY_ESTIMATOR = advantages.EstimatorSpec("user_estimator", my_estimator, paper="this test")


@pytest.fixture
def registered():
  advantages.register_estimator(MY_ESTIMATOR)
  yield
  advantages.ESTIMATORS.pop("user_estimator", None)
  losses.OBJECTIVES.pop(f"{__name__}:MY_OBJECTIVE", None)


def test_user_objective_and_estimator_train(tmp_path, registered):
  path = f"{__name__}:MY_OBJECTIVE"
  c = config_lib.tiny_config(
    tmp_path, objective=dict(name=path), rl=dict(advantage="user_estimator", num_steps=2)
  )
  trainer = loop.Trainer(c)
  calls, batches = [], []
  step, collect = trainer.train_step, trainer.collector.collect

  def recording_step(state, tb, num_tokens, num_seqs, key):
    calls.append((jax.tree.map(jnp.copy, state.params), tb, num_tokens, num_seqs))
    return step(state, tb, num_tokens, num_seqs, key)

  def recording_collect(*args, **kwargs):
    batches.append(collect(*args, **kwargs))
    return batches[-1]

  trainer.train_step, trainer.collector.collect = recording_step, recording_collect
  try:
    trainer.restore_or_start()
    logged = [trainer.rl_step(s) for s in range(2)]
  finally:
    trainer.close()
  assert len(calls) == 2 and losses.OBJECTIVES[path].fn is my_objective
  for (params, tb, num_tokens, num_seqs), out, (batch, _) in zip(
    calls, logged, batches, strict=True
  ):
    logp, _ = step_lib.completion_logprobs(
      params, tb.tokens, tb.positions, num_completion=tb.completion_mask.shape[1],
      model_config=trainer.model_config, temperature=c.sampling.temperature,
      chunk_size=c.rl.logprob_chunk,
    )  # fmt: skip
    # One update per rollout batch: on-policy, old_logp = sg(logp).
    want, _ = my_objective(logp, jax.lax.stop_gradient(logp), tb.advantages, tb.completion_mask,
                           num_tokens=num_tokens, num_seqs=num_seqs)  # fmt: skip
    np.testing.assert_allclose(out["loss"], float(want), rtol=2e-5, atol=1e-7)
    adv = my_estimator(jnp.asarray(batch.rewards), valid=jnp.isfinite(batch.rewards))
    np.testing.assert_allclose(batch.advantages, np.asarray(adv).reshape(-1), rtol=1e-6)
    assert np.any(np.asarray(adv) != 0)


def test_user_methods_by_import_path_validate_and_resolve(tmp_path):
  c = config_lib.tiny_config(
    tmp_path, objective=dict(name="user_objective_api"),
    rl=dict(advantage=f"{__name__}:MY_ESTIMATOR"),
  )  # fmt: skip
  losses.register_objective(MY_OBJECTIVE.__class__(**{**vars(MY_OBJECTIVE),
                                                       "name": "user_objective_api"}))  # fmt: skip
  try:
    config_lib.validate(c)
    assert methods.estimator(c.rl.advantage).fn is my_estimator
    bad = config_lib.tiny_config(tmp_path, rl=dict(advantage=f"{__name__}:NOPE"))
    with pytest.raises(config_lib.ConfigError, match="rl.advantage"):
      config_lib.validate(bad)
  finally:
    losses.OBJECTIVES.pop("user_objective_api", None)
    advantages.ESTIMATORS.pop(f"{__name__}:MY_ESTIMATOR", None)


def test_the_trainer_names_no_method():
  """``rlvr_jax/train/`` reads the specs: no registered objective, estimator or group filter is
  named in its source (whole words, any case)."""
  import pathlib
  import re

  names = set(losses.OBJECTIVES) | set(advantages.ESTIMATORS) | set(advantages.GROUP_FILTERS)
  names = {n for n in names if ":" not in n and not n.startswith("user_")}
  train = pathlib.Path(__file__).resolve().parent.parent / "rlvr_jax" / "train"
  hits = []
  for path in sorted(train.rglob("*.py")):
    text = path.read_text().lower()
    for name in names:
      for m in re.finditer(rf"(?<![a-z0-9_]){re.escape(name)}(?![a-z0-9_])", text):
        hits.append(f"{path.name}:{text.count(chr(10), 0, m.start()) + 1}: {name}")
  assert len(names) > 30 and not hits, hits
