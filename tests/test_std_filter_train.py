"""The reward-std prompt filter in the trainer (rl.std_filter, train/std_filter.py): the rows it
masks against a NumPy loop of RLPR's rule, its state across batches, its config errors. Its
carry through a checkpoint is checked by tests/test_train_resume.py."""

import jax
import numpy as np
import pytest

from rlvr_jax import advantages
from rlvr_jax.metrics import read_jsonl
from rlvr_jax.train import config as config_lib
from rlvr_jax.train import std_filter
from rlvr_jax.train.loop import Trainer
from rlvr_jax.train.rollout import RolloutBatch


def _batch(rewards, T=3):
  P, G = rewards.shape
  z = np.zeros((P * G, T), np.float32)
  return RolloutBatch(
    prompt_tokens=np.zeros((P * G, 2), np.int32), prompt_mask=np.ones((P * G, 2), bool),
    tokens=z.astype(np.int32), completion_mask=np.ones((P * G, T), bool), sampler_logp=z,
    lengths=np.full(P * G, T, np.int32), advantages=np.zeros(P * G, np.float32),
    rewards=rewards, correct=rewards, scores={}, metrics={"reward/mean": 0.25},
  )  # fmt: skip


def test_masks_the_groups_that_numpy_drops_and_carries_the_ema():
  cfg = std_filter.std_filter_section()
  cfg.update(enabled=True, beta=0.7, decay=0.9, start_step=3)
  rng = np.random.default_rng(0)
  state, ema = advantages.std_filter_init(), None
  dropped_any = False
  for step in range(1, 7):
    r = (rng.random((5, 4)) * rng.random((5, 1))).astype(np.float32)
    r[1] = 0.3  # constant: dropped once active
    r[2, 0] = np.nan  # a failed reward: the group's std is over its 3 valid rows
    batch, state = std_filter.apply_std_filter(_batch(r), state, cfg)
    metrics = batch.metrics
    stds = np.array([np.nanstd(row.astype(np.float64)) for row in r])
    ema = stds.mean() if ema is None else 0.9 * ema + 0.1 * stds.mean()
    keep = stds >= 0.7 * ema if step >= 3 else np.ones(5, bool)
    np.testing.assert_array_equal(
      batch.completion_mask, np.repeat(keep[:, None], 4, 0) & np.ones((1, 3), bool)
    )
    np.testing.assert_allclose(metrics["groups/std_filter_ema"], ema, rtol=1e-5)
    assert metrics["groups/std_filter_dropped"] == (~keep).sum()
    assert metrics["reward/mean"] == 0.25  # the collector's metrics are kept
    dropped_any |= bool((~keep[[0, 2, 3, 4]]).any())
  assert int(state.steps) == 6 and dropped_any  # a non-constant group was dropped too


def test_masked_rows_stay_masked():
  """Rows the collector already masked (failed or zero-variance groups) are not revived."""
  cfg = std_filter.std_filter_section()
  cfg.update(enabled=True, start_step=1)
  r = np.array([[0, 1, 0, 1], [0, 1, 1, 1]], np.float32)
  b = _batch(r)
  b.completion_mask[0, 1:] = False
  out, _ = std_filter.apply_std_filter(b, advantages.std_filter_init(), cfg)
  np.testing.assert_array_equal(out.completion_mask, b.completion_mask)  # both groups kept


@pytest.mark.parametrize(
  "field,value,match",
  [
    ("beta", -0.1, "rl.std_filter.beta: must be >= 0"),
    ("decay", 1.0, r"rl.std_filter.decay: must be in \[0, 1\)"),
    ("start_step", 0, "rl.std_filter.start_step: must be >= 1"),
  ],
)
def test_config_errors_name_the_field(tmp_path, field, value, match):
  c = config_lib.tiny_config(tmp_path, rl=dict(std_filter={"enabled": True, field: value}))
  with pytest.raises(config_lib.ConfigError, match=match):
    config_lib.validate(c)


def test_state_is_in_the_checkpointed_extra_only_when_enabled(tmp_path):
  c = config_lib.tiny_config(tmp_path)
  assert std_filter.init_std_filter_extra(c) == {}
  c.rl.std_filter.enabled = True
  (state,) = std_filter.init_std_filter_extra(c).values()
  assert int(state.steps) == 0


def _run(config):

  trainer = Trainer(config, log=lambda s: None)
  try:
    trainer.run()
    return jax.tree.map(np.asarray, (trainer.state.params, trainer.state.extra))
  finally:
    trainer.close()


def test_trainer_filters_and_a_resumed_run_filters_as_the_uninterrupted_one(tmp_path):
  """4 steps, the filter active from step 2, a checkpoint every step; the run stopped after step 2
  and resumed gives the same metrics, parameters and filter state; the logged EMA follows its
  recurrence over the logged batch means (the state is threaded, not reset)."""

  def config(workdir):
    return config_lib.tiny_config(
      workdir, rl=dict(num_steps=4, std_filter=dict(enabled=True, start_step=2, decay=0.5)),
      optim=dict(learning_rate=3e-2), checkpoint=dict(every=1, keep=2),
    )  # fmt: skip

  full = _run(config(tmp_path / "full"))
  c = config(tmp_path / "resumed")
  c.max_steps_this_run = 2
  _run(c)
  c.max_steps_this_run = 0
  resumed = _run(c)
  for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(resumed), strict=True):
    np.testing.assert_array_equal(a, b)
  assert int(resumed[1]["std_filter"].steps) == 4

  def records(d):
    return [
      {k: v for k, v in r.items() if not k.startswith(("time", "reward/time_s", "reward/items"))}
      for r in read_jsonl(str(d / "metrics.jsonl"))
      if "groups/std_filter_ema" in r
    ]

  steps = records(tmp_path / "full")
  assert steps == records(tmp_path / "resumed") and len(steps) == 4
  assert steps[0]["groups/std_filter_dropped"] == 0  # before start_step
  assert any(r["groups/std_filter_dropped"] > 0 for r in steps[1:])
  ema = steps[0]["groups/std_filter_mean_std"]
  for r in steps[1:]:
    ema = 0.5 * ema + 0.5 * r["groups/std_filter_mean_std"]
    np.testing.assert_allclose(r["groups/std_filter_ema"], ema, rtol=1e-5)
