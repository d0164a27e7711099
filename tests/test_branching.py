"""SPO-chain's branch round in the trainer (``train/branching.py``, ``rl.advantage='spo_chain'``):
the prefixes it continues, the values it assigns, the continuations' parity with the static
sampler, and the token advantages the collected batch carries."""

import jax
import numpy as np
import pytest

from rlvr_jax import advantages as adv_lib
from rlvr_jax import sampling
from rlvr_jax.train import branching
from rlvr_jax.train import config as config_lib
from rlvr_jax.train.loop import Trainer

SPO = dict(num_branches=3, cutpoint_interval=2, max_segments=3, prob_threshold=1.0)
REWARD = dict(name=f"{__name__}:digit_share")  # importable in the reward workers (tests/ on path)


def digit_share(prompts, completions, **fields):
  """The share of digits in a completion: a reward that varies for the untrained tiny model."""
  return np.array([sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions], np.float32)


def _trainer(tmp_path, **sampling_kw):
  c = config_lib.tiny_config(
    tmp_path, rl=dict(advantage="spo_chain", prompts_per_step=2), spo=SPO, reward=REWARD,
    sampling=dict(max_new_tokens=8, temperature=1.5, **sampling_kw),
  )  # fmt: skip
  trainer = Trainer(c, log=lambda s: None)
  trainer.restore_or_start()
  return trainer


def _round(trainer, key):
  col = trainer.collector
  records = col.source.take(2)
  texts, rollout = col._sample_local(trainer.state.params, records, key=key)
  host = jax.tree.map(np.asarray, rollout)
  rewards = np.random.default_rng(0).integers(0, 2, (2, 4)).astype(np.float32)
  rewards[1, 2] = np.nan  # a failed reward
  calls = []
  submit = col.runtime.submit
  col.runtime.submit = lambda *a, **k: calls.append((a, k)) or submit(*a, **k)
  inputs, metrics = branching.segment_values(
    col, trainer.state.params, host, rewards, records, texts, key=jax.random.key(9)
  )
  col.runtime.submit = submit
  return host, rewards, inputs, metrics, calls


def test_branch_round_values_segments_and_rewards(tmp_path):
  trainer = _trainer(tmp_path)
  try:
    host, rewards, inputs, metrics, calls = _round(trainer, jax.random.key(3))
    (fn, prompts, texts), kw = calls[0]
    rescored = np.asarray(
      trainer.collector.runtime.submit(fn, prompts, texts, **kw).result().rewards
    )
  finally:
    trainer.close()
  mask = host.completion_mask
  nseg, starts_ids = inputs["num_segments"], inputs["segment_ids"]
  # prob_threshold 1: every completion token is a cutpoint; a segment opens at every 2nd one.
  np.testing.assert_array_equal(inputs["spo_cutpoints"], mask)
  np.testing.assert_array_equal(nseg, np.minimum((mask.sum(1) + 1) // 2, 3))
  forks = int((nseg - 1).sum())
  assert metrics["spo/forks"] == forks > 0
  # V_0: the mean valid reward of the row's group (the NaN row left out).
  v0 = np.repeat([np.nanmean(rewards[0]), np.nanmean(rewards[1])], 4)
  np.testing.assert_allclose(inputs["segment_values"][:, 0], v0, rtol=1e-6)
  # V_s (s > 0): the mean reward of the K = 3 continuations of the prefix before segment s,
  # each rewarded as prefix + continuation.
  assert len(texts) == forks * 3 and kw["group_size"] == 3
  means = rescored.reshape(forks, 3).mean(1)
  assert np.ptp(rescored) > 0  # the values carry signal
  got = [inputs["segment_values"][b, s] for b in range(8) for s in range(1, int(nseg[b]))]
  np.testing.assert_allclose(got, means, rtol=1e-6)
  i = 0
  for b in range(8):
    for s in range(1, int(nseg[b])):
      start = int(np.argmax(starts_ids[b] == s))
      prefix = trainer.collector.tokenizer.decode_batch(host.tokens[b : b + 1, :start],
                                                        mask[b : b + 1, :start])[0]  # fmt: skip
      assert all(t.startswith(prefix) for t in texts[3 * i : 3 * i + 3])
      i += 1


def test_branch_continuations_equal_the_static_samplers(tmp_path):
  """The continuous engine's continuations are the static sampler's for the same prefixes and
  keys: the same values (hence advantages) from either engine."""
  got = {}
  for engine in ("static", "continuous"):
    trainer = _trainer(tmp_path / engine, engine=engine, num_slots=5)
    try:
      got[engine] = _round(trainer, jax.random.key(3))[2]
    finally:
      trainer.close()
  for k in got["static"]:
    np.testing.assert_array_equal(got["static"][k], got["continuous"][k], err_msg=k)


def test_fork_continuations_keep_logprob_parity(tmp_path):
  """A continuation's sampler log-probs equal one forward pass over prompt + prefix +
  continuation (the trainer's recomputation) within 1e-5."""
  trainer = _trainer(tmp_path)
  try:
    col, params = trainer.collector, trainer.state.params
    records = col.source.take(2)
    _, rollout = col._sample_local(params, records, key=jax.random.key(3))
    host = jax.tree.map(np.asarray, rollout)
    rows, positions = np.array([0, 5]), np.array([2, 3])
    ids, mask = sampling.continuous.fork_prefixes(host, rows, positions, pad_id=col.pad_id)
    cont = jax.device_get(col._generate(
      params, ids, mask, np.arange(2, dtype=np.int32), jax.random.key(1), None,
      SPO["num_branches"], max_new_tokens=8, max_lengths=np.full(6, 6),
      buckets=sampling.DEFAULT_BUCKETS,
    ))  # fmt: skip
    gap = sampling.logprob_parity(params, cont, config=col.model_config,
                                  strategy=col.strategy)  # fmt: skip
  finally:
    trainer.close()
  assert np.asarray(cont.lengths).max() <= 6
  assert float(gap["sampler_logp_gap/max"]) <= 1e-5 and float(gap["model_logp_gap/max"]) <= 1e-5


@pytest.mark.parametrize("use_prob_mask", [True, False])
def test_spo_chain_estimator_on_the_collected_batch(tmp_path, use_prob_mask):
  """The collected batch's token advantages are ``spo_chain_advantages`` of the branch round's
  values: V_{s+1} - V_s on segment s, the row's reward after its last boundary."""
  c = config_lib.tiny_config(
    tmp_path, rl=dict(advantage="spo_chain", prompts_per_step=2,
                      advantage_kwargs=dict(use_prob_mask=use_prob_mask)),
    spo=dict(SPO, prob_threshold=0.6), sampling=dict(max_new_tokens=8, temperature=1.5),
    reward=REWARD,
  )  # fmt: skip
  trainer = Trainer(c, log=lambda s: None)
  try:
    trainer.restore_or_start()
    captured = {}
    original = branching.segment_values

    def spy(*a, **k):
      captured["out"] = original(*a, **k)
      return captured["out"]

    branching.segment_values = spy
    try:
      batch, _ = trainer.collector.collect(trainer.state.params, key=jax.random.key(4))
    finally:
      branching.segment_values = original
  finally:
    trainer.close()
  inputs, metrics = captured["out"]
  assert batch.advantages.shape == batch.tokens.shape
  expected = adv_lib.spo_chain_token_advantages(
    batch.rewards, inputs["segment_values"], inputs["segment_ids"], inputs["num_segments"],
    inputs["spo_cutpoints"], valid=np.isfinite(batch.rewards), use_prob_mask=use_prob_mask,
  )  # fmt: skip
  np.testing.assert_allclose(batch.advantages, np.asarray(expected), atol=1e-6)
  assert np.abs(batch.advantages).sum() > 0 and 0 < inputs["spo_cutpoints"].mean() < 1
  if use_prob_mask:
    assert not batch.advantages[~inputs["spo_cutpoints"]].any()
  assert batch.metrics["spo/forks"] == metrics["spo/forks"]
