"""Reflect-then-Retry RL in the trainer (``rl.advantage='r3l'``, ``train/retries.py``): the pairs
and failure points it picks, the estimator's values, the retries' parity with the static sampler
and the batch the collector assembles (pivotal credit, positive amplification)."""

import jax
import numpy as np
import pytest

from rlvr_jax import advantages as adv_lib
from rlvr_jax import sampling
from rlvr_jax.train import config as config_lib
from rlvr_jax.train import retries
from rlvr_jax.train.loop import Trainer

REWARD = dict(name=f"{__name__}:has_seven")  # importable in the reward workers (tests/ on path)


def has_seven(prompts, completions, **fields):
  """1 when the completion holds a 7: about half the untrained tiny model's rows fail."""
  return np.array([float("7" in c) for c in completions], np.float32)


def test_retry_pairs_take_failures_two_by_two():
  correct = np.array([[0, 1, 0, 0, 0, 1], [1, 1, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0]], np.float32)
  rewards = correct.copy()
  rewards[0, 3] = np.nan  # a failed reward is no failure of the policy: never paired
  got = retries.retry_pairs(correct, rewards, max_pairs=2)
  # Group 0's failures: rows 0, 2, 4 -> one pair; group 1 has one failure -> none; group 2: two.
  assert got == [(0, 0, 2), (2, 0, 1), (2, 2, 3)]
  assert retries.retry_pairs(correct, rewards, max_pairs=1) == [(0, 0, 2), (2, 0, 1)]


def test_failure_point_is_the_least_likely_completion_token():
  logp = np.array([[-0.1, -2.0, -0.5, -9.0], [-0.3, -0.3, -0.2, -0.1], [0.0, 0.0, 0.0, 0.0]])
  mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]], bool)
  # Row 0: -9 is padding; row 1: the first of the ties; row 2: no completion -> 0.
  np.testing.assert_array_equal(retries.failure_points(logp, mask), [1, 0, 0])


def test_r3l_token_advantages_by_hand():
  """Group [1, 0, 0, 0.5], mean baseline 0.375: the success -> 1, the 0.5 row's +0.125 x 3,
  the failures -0.375; rows 1 and 2 (a retry pair sharing 2 tokens) lose their first 2."""
  rewards = np.array([[1.0, 0.0, 0.0, 0.5]], np.float32)
  mask = np.ones((4, 4), bool)
  mask[3, 3] = False
  prefix = np.array([0, 2, 2, 0], np.int32)
  got = np.asarray(adv_lib.r3l_token_advantages(rewards, mask, prefix))
  expected = np.array(
    [[1, 1, 1, 1], [0, 0, -0.375, -0.375], [0, 0, -0.375, -0.375], [0.375, 0.375, 0.375, 0]]
  )
  np.testing.assert_allclose(got, expected, atol=1e-7)
  # A float64 reference of the same rule, on random groups (soft baseline, failed rewards).
  rng = np.random.default_rng(0)
  r = rng.integers(0, 3, (3, 5)).astype(np.float64) / 2
  r[1, 4] = np.nan
  m = rng.random((15, 7)) < 0.8
  k = rng.integers(0, 4, 15).astype(np.int32)
  got = np.asarray(adv_lib.r3l_token_advantages(r, m, k, baseline="soft", tau=0.5, alpha=2.0))
  ok = np.isfinite(r)
  n = ok.sum(1, keepdims=True)
  b = 0.5 * (np.log(np.where(ok, np.exp(np.where(ok, r, 0) / 0.5), 0).sum(1, keepdims=True))
             - np.log(n))  # fmt: skip
  a = r - b
  a = np.where(r >= 1, 1.0, np.where(a >= 0, 2.0 * a, a))
  a = np.where(ok & (n > 1), a, 0.0).reshape(-1)
  ref = a[:, None] * (m & (np.arange(7)[None] >= k[:, None]))
  np.testing.assert_allclose(got, ref, atol=1e-6)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
  c = config_lib.tiny_config(
    tmp_path_factory.mktemp("retries"),
    rl=dict(advantage="r3l", prompts_per_step=4, num_microbatches=2),  # retries: 1-8 rows
    reward=REWARD, sampling=dict(max_new_tokens=8, temperature=1.5, num_samples=6,
                                 engine="continuous", num_slots=5),
  )  # fmt: skip
  t = Trainer(c, log=lambda s: None)
  t.restore_or_start()
  yield t
  t.close()


def test_retries_equal_the_static_samplers_continuations(trainer):
  """Each retry is prompt + completion[:k] continued by the sampler: the continuous engine's
  tokens and log-probs equal the static sampler's for the same prefixes and key, and the
  replaced row is that prefix then the continuation."""
  col, params = trainer.collector, trainer.state.params
  records = col.source.take(4)
  texts, rollout = col._sample_local(params, records, key=jax.random.key(3))
  host = jax.tree.map(np.asarray, rollout)
  rewards = np.array([[float("7" in t) for t in g] for g in np.split(np.asarray(
    col.tokenizer.decode_batch(host.tokens, host.completion_mask)), 4)], np.float32)  # fmt: skip
  completions = col.tokenizer.decode_batch(host.tokens, host.completion_mask)
  out = retries.retry_failures(
    col, params, host, rewards, rewards, completions, {}, records, texts,
    key=jax.random.key(11), rows_per_prompt=6, ref_params=None, need_old=False, prm_params=None,
  )  # fmt: skip
  new, new_rewards, _, new_completions, _, prefix, metrics = out
  pairs = retries.retry_pairs(rewards, rewards, 2)
  assert metrics["retry/pairs"] == len(pairs) > 0
  retried = np.array([p * 6 + j for p, j, _ in pairs])
  replaced = np.array([p * 6 + j for p, _, j in pairs])
  k = retries.failure_points(host.sampler_logp[retried], host.completion_mask[retried])
  ids, mask = sampling.continuous.fork_prefixes(host, retried, k, pad_id=col.pad_id)
  T = host.tokens.shape[1]
  static = jax.device_get(sampling.generate(
    params, ids, mask, config=col.model_config, num_samples=1, strategy=col.strategy,
    key=jax.random.key(11), max_new_tokens=T, stop_tokens=tuple(col.tokenizer.eos_ids),
    prompt_ids=np.arange(len(ids), dtype=np.int32), pad_id=col.pad_id,
    buckets=sampling.DEFAULT_BUCKETS, max_lengths=T - k,
  ))  # fmt: skip
  for i, (a, b) in enumerate(zip(retried, replaced, strict=True)):
    n = int(static.lengths[i])
    np.testing.assert_array_equal(new.tokens[b, : k[i]], host.tokens[a, : k[i]])
    np.testing.assert_array_equal(new.tokens[b, k[i] : k[i] + n], static.tokens[i, :n])
    np.testing.assert_allclose(new.sampler_logp[b, k[i] : k[i] + n], static.sampler_logp[i, :n],
                               atol=1e-5)  # fmt: skip
    assert new.lengths[b] == k[i] + n and new.completion_mask[b].sum() == k[i] + n
    assert prefix[a] == prefix[b] == k[i]
    assert (
      new_completions[b]
      == col.tokenizer.decode_batch(new.tokens[b : b + 1], new.completion_mask[b : b + 1])[0]
    )
    p, j = divmod(int(b), 6)
    assert new_rewards[p, j] == float("7" in new_completions[b])
  untouched = np.setdiff1d(np.arange(24), replaced)
  np.testing.assert_array_equal(new.tokens[untouched], host.tokens[untouched])
  assert not prefix[np.setdiff1d(untouched, retried)].any()


def test_collected_batch_has_pivotal_credit_and_amplified_advantages(trainer):
  """The batch: retry pairs share their first k tokens, which leave the loss mask; the token
  advantages are ``r3l_token_advantages`` of the batch's rewards; the replaced rows' no-grad
  scores are recomputed (old log-probs equal the sampler's on every row)."""
  captured = {}
  original = retries.retry_failures

  def spy(*a, **k):
    captured["out"] = original(*a, **k)
    return captured["out"]

  retries.retry_failures = spy
  try:
    batch, _ = trainer.collector.collect(trainer.state.params, key=jax.random.key(4), need_old=True)
  finally:
    retries.retry_failures = original
  prefix, metrics = captured["out"][5], captured["out"][6]
  full = captured["out"][0].completion_mask
  assert metrics["retry/pairs"] > 0 and batch.metrics["retry/pairs"] == metrics["retry/pairs"]
  assert batch.metrics["rollout/sampled_tokens"] > metrics["retry/tokens"] > 0
  expected = adv_lib.r3l_token_advantages(
    batch.rewards, full, prefix, valid=np.isfinite(batch.rewards)
  )
  np.testing.assert_allclose(batch.advantages, np.asarray(expected), atol=1e-6)
  t = np.arange(full.shape[1])
  valid = np.isfinite(batch.rewards).reshape(-1, 1)
  np.testing.assert_array_equal(batch.completion_mask, full & (t[None] >= prefix[:, None]) & valid)
  assert (prefix > 0).sum() >= 2 and not batch.completion_mask[prefix > 0, 0].any()
  old = batch.scores["old_logp"]
  np.testing.assert_allclose(old[full], batch.sampler_logp[full], atol=1e-5)


def test_retry_round_rejects_a_model_reward(tmp_path):
  c = config_lib.tiny_config(tmp_path, rl=dict(advantage="r3l"), model_reward=dict(name="rlpr"))
  with pytest.raises(config_lib.ConfigError, match="model_reward.name"):
    config_lib.validate(c)
  c.retries.max_pairs = 0
  with pytest.raises(config_lib.ConfigError, match="retries.max_pairs"):
    config_lib.validate(c)


def test_one_retry_is_scored_in_whole_micro_batches(trainer):
  """A single retry (one replaced row) gets its old log-probs recomputed, though the scoring pass
  splits rows into rl.num_microbatches = 2 parts: the row is padded, then taken back."""
  col, params = trainer.collector, trainer.state.params
  records = col.source.take(4)
  texts, rollout = col._sample_local(params, records, key=jax.random.key(8))
  host = jax.tree.map(np.asarray, rollout)
  correct = np.ones((4, 6), np.float32)
  correct[2, [1, 4]] = 0.0  # one pair: row 1 retried into row 4's place
  completions = col.tokenizer.decode_batch(host.tokens, host.completion_mask)
  stale = {"old_logp": np.zeros(host.tokens.shape, np.float32)}
  new, *_, scores, prefix, metrics = retries.retry_failures(
    col, params, host, correct, correct, completions, stale, records, texts,
    key=jax.random.key(2), rows_per_prompt=6, ref_params=None, need_old=True, prm_params=None,
  )  # fmt: skip
  assert metrics["retry/pairs"] == 1 and prefix[13] == prefix[16]
  m = new.completion_mask[16]
  np.testing.assert_allclose(scores["old_logp"][16][m], new.sampler_logp[16][m], atol=1e-5)
  assert not scores["old_logp"][np.arange(24) != 16].any()  # the other rows keep theirs
