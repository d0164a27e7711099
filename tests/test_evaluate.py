"""Held-out evaluation metrics: means and standard errors over problems, against hand computations
on a scripted collector (fixed rollouts and reward outcomes, no model)."""

import types
from concurrent.futures import Future

import numpy as np

from rlvr_jax import sampling
from rlvr_jax.train import evaluate


class _Collector:
  """Serves fixed per-row outcomes: greedy rows get ``greedy``, sampled rows ``sampled``."""

  def __init__(self, greedy, sampled, lengths, logp, formatted=True, batch_size=2):
    self.c = types.SimpleNamespace(
      eval=types.SimpleNamespace(batch_size=batch_size, num_samples=2, temperature=1.0)
    )
    self.greedy, self.sampled, self.lengths, self.logp = greedy, sampled, lengths, logp
    self.formatted = formatted

  def sample(self, params, chunk, *, key, strategy, num_samples):
    rows = [r["index"] for r in chunk]
    greedy = isinstance(strategy, sampling.Greedy)
    T = 4
    lengths = np.array([[1] if greedy else self.lengths[i] for i in rows]).reshape(-1)
    mask = np.arange(T)[None] < lengths[:, None]
    logp = np.repeat(np.array([[self.logp[i]] * num_samples for i in rows]).reshape(-1, 1), T, 1)
    outcome = np.array([self.greedy[i] if greedy else self.sampled[i] for i in rows], np.float32)
    rollout = types.SimpleNamespace(
      completion_mask=mask, truncated=lengths == T, model_logp=logp, outcome=outcome.reshape(-1)
    )
    return rows, rollout

  def submit_rewards(self, texts, chunk, rollout, num_samples):
    outcome = rollout.outcome
    info = {"correct": outcome}
    if self.formatted:
      info["formatted"] = np.ones_like(outcome)
    future = Future()
    future.set_result(types.SimpleNamespace(info=info, rewards=outcome))
    return None, future


def _run(col, n):
  return evaluate.evaluate(col, None, [{"q": i} for i in range(n)])


def test_means_and_standard_errors_over_problems():
  greedy = [1, 0, 1]
  sampled = [[1, 0], [0, 0], [1, 1]]
  lengths = [[2, 4], [1, 1], [3, 3]]
  logp = [-0.5, -1.0, -2.0]
  out = _run(_Collector(greedy, sampled, lengths, logp), 3)
  np.testing.assert_allclose(out["eval/accuracy"], 2 / 3)
  np.testing.assert_allclose(out["eval/accuracy_se"], np.std([1, 0, 1], ddof=1) / np.sqrt(3))
  per_problem = np.array([0.5, 0.0, 1.0])
  np.testing.assert_allclose(out["eval/pass@1"], 0.5)
  np.testing.assert_allclose(out["eval/pass@1_se"], per_problem.std(ddof=1) / np.sqrt(3))
  np.testing.assert_allclose(out["eval/pass@2"], 2 / 3)
  np.testing.assert_allclose(out["eval/length"], np.mean([3.0, 1.0, 3.0]))
  np.testing.assert_allclose(out["eval/truncated"], np.mean([0.5, 0.0, 0.0]))
  # by outcome, over the problems that have such a sample: correct 2 (p0), 3 (p2); wrong 4 (p0), 1 (p1)
  np.testing.assert_allclose(out["eval/length_correct"], 2.5)
  np.testing.assert_allclose(out["eval/length_correct_se"], np.std([2, 3], ddof=1) / np.sqrt(2))
  np.testing.assert_allclose(out["eval/length_incorrect"], 2.5)
  np.testing.assert_allclose(out["eval/length_incorrect_se"], np.std([4, 1], ddof=1) / np.sqrt(2))
  # entropy: token-weighted -log pi per problem, then the mean over problems
  np.testing.assert_allclose(out["eval/entropy"], np.mean([0.5, 1.0, 2.0]))
  np.testing.assert_allclose(out["eval/format"], 1.0)
  assert out["eval/format_se"] == 0.0


def test_no_format_flag_means_no_format_metric():
  out = _run(
    _Collector([1, 0], [[1, 0], [0, 1]], [[1, 1], [1, 1]], [-1.0, -1.0], formatted=False), 2
  )
  assert "eval/format" not in out and "eval/pass@1" in out


def test_single_problem_has_nan_standard_error():
  out = _run(_Collector([1], [[1, 1]], [[1, 1]], [-1.0]), 1)
  assert np.isnan(out["eval/accuracy_se"]) and out["eval/accuracy"] == 1.0
  assert out["eval/length_correct"] == 1.0 and "eval/length_incorrect" not in out
