"""Per-row temperatures (0 = greedy row) in one batch: ReMax's greedy baseline next to sampled rows.

Greedy rows must equal a greedy-only run, sampled rows a sampled-only run with the same keys, and
the trainer's recomputed log-probs must match the sampler's; plus the strategy-level pieces.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.model import ModelConfig, init_params
from rlvr_jax.sampling import (
  Combined,
  Greedy,
  Temperature,
  generate,
  logprob_parity,
  per_row_log_probs,
  row_temperatures,
  temperature_scale,
  truncated_token_logprobs,
)

CONFIG = ModelConfig.tiny()
P, G, T = 3, 3, 8


@pytest.fixture(scope="module")
def params():
  """Tiny random weights with sharper logits (std ~2), so greedy and sampled rows differ."""
  p = init_params(CONFIG, jax.random.key(0))
  return dict(p, lm_head=p["lm_head"] * 15.0)


@pytest.fixture(scope="module")
def prompts():
  rng = np.random.default_rng(0)
  lengths = np.array([3, 7, 5])
  mask = np.arange(7)[None, :] >= (7 - lengths)[:, None]
  tokens = np.where(mask, rng.integers(3, CONFIG.vocab_size, (P, 7)), 0).astype(np.int32)
  return tokens, mask


def _run(params, prompts, strategy, **kw):
  tokens, mask = prompts
  return generate(
    params,
    tokens,
    mask,
    config=CONFIG,
    num_samples=G,
    strategy=strategy,
    key=jax.random.key(5),
    max_new_tokens=T,
    stop_tokens=(2, 3, 4),
    **kw,
  )


def _rows(rollout, keep):
  return {
    name: np.asarray(getattr(rollout, name))[keep]
    for name in ("tokens", "sampler_logp", "model_logp", "completion_mask", "lengths")
  }


def test_mixed_batch_equals_separate_runs_and_matches_trainer(params, prompts):
  """temperatures [0.7, 0.7, 0] (last sample of each prompt greedy): rows equal the separate runs
  (same keys per (prompt, sample, position)), and parity with a full forward pass <= 1e-5."""
  strategy = Temperature(0.7)
  temps = [0.7, 0.7, 0.0]
  mixed = _run(params, prompts, strategy, temperatures=temps)
  sampled = _run(params, prompts, strategy)
  greedy = _run(params, prompts, Greedy())
  is_greedy = np.tile(np.array(temps) == 0, P)
  for keep, ref in ((~is_greedy, sampled), (is_greedy, greedy)):
    got, want = _rows(mixed, keep), _rows(ref, keep)
    for name in ("tokens", "completion_mask", "lengths"):
      np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    for name in ("sampler_logp", "model_logp"):
      np.testing.assert_allclose(got[name], want[name], atol=1e-6, err_msg=name)
  # The greedy rows' distribution is a point mass; the sampled rows' is not.
  mask = np.asarray(mixed.completion_mask)
  assert np.all(np.asarray(mixed.sampler_logp)[is_greedy][mask[is_greedy]] == 0.0)
  assert np.asarray(mixed.sampler_logp)[~is_greedy][mask[~is_greedy]].min() < -0.1
  assert mixed.sampler_threshold is not None and sampled.sampler_threshold is None
  row_t = row_temperatures(temps, num_prompts=P, num_samples=G)
  gaps = logprob_parity(params, mixed, config=CONFIG, strategy=strategy, temperatures=row_t)
  assert float(gaps["sampler_logp_gap/max"]) <= 1e-5, gaps
  assert float(gaps["model_logp_gap/max"]) <= 1e-5, gaps
  # The check has power: scoring every row at tau = 0.7 misses the greedy rows' point mass.
  wrong = logprob_parity(
    params, mixed, config=CONFIG, strategy=strategy, temperatures=np.full(P * G, 0.7, np.float32)
  )
  assert float(wrong["sampler_logp_gap/max"]) > 1e-2


def test_per_row_temperatures_with_truncation_and_b_shaped_input(params, prompts):
  """[B]-shaped temperatures with top-p: the tau = 1.3 rows match a run of Combined(1.3, top-p),
  and every row (three temperatures, greedy included) matches the trainer."""
  strategy = Combined(top_p=0.8)
  temps = np.array([1.3, 0.0, 0.5, 0.5, 1.3, 0.0, 0.0, 0.5, 1.3], np.float32)
  mixed = _run(params, prompts, strategy, temperatures=temps)
  ref = _run(params, prompts, Combined(temperature=1.3, top_p=0.8))
  keep = temps == np.float32(1.3)
  np.testing.assert_array_equal(_rows(mixed, keep)["tokens"], _rows(ref, keep)["tokens"])
  for name in ("sampler_logp", "model_logp"):
    np.testing.assert_allclose(_rows(mixed, keep)[name], _rows(ref, keep)[name], atol=1e-6)
  thr = np.asarray(mixed.sampler_threshold)[keep]
  np.testing.assert_allclose(thr, np.asarray(ref.sampler_threshold)[keep], atol=1e-6)
  gaps = logprob_parity(params, mixed, config=CONFIG, strategy=strategy, temperatures=temps)
  assert float(gaps["sampler_logp_gap/max"]) <= 1e-5, gaps


def test_per_row_log_probs_golden():
  """Row 0 at tau = 0.5, row 1 greedy, row 2 at tau = 2, against hand-written softmaxes."""
  logits = jnp.array([[1.0, 2.0, 0.0], [1.0, 3.0, 2.5], [0.0, 1.0, -1.0]])
  fn = jax.jit(per_row_log_probs, static_argnums=0)
  logp, threshold = fn(Temperature(9.0), logits, jnp.array([0.5, 0.0, 2.0]))
  np.testing.assert_allclose(logp[0], jax.nn.log_softmax(logits[0] / 0.5), atol=1e-6)
  np.testing.assert_allclose(logp[2], jax.nn.log_softmax(logits[2] / 2.0), atol=1e-6)
  np.testing.assert_array_equal(np.asarray(logp[1]) == 0.0, [False, True, False])
  np.testing.assert_allclose(threshold[1], 2.75)  # midway between the two largest logits
  assert float(threshold[0]) < -1e30 and float(threshold[2]) < -1e30  # untruncated rows
  np.testing.assert_allclose(temperature_scale(jnp.array([0.5, 0.0, 2.0])), [0.5, 1.0, 2.0])


def test_truncated_token_logprobs_per_row_temperature_matches_numpy():
  logits = jax.random.normal(jax.random.key(0), (3, 4, 20)) * 2.0
  tokens = jax.random.randint(jax.random.key(1), (3, 4), 0, 20)
  taus = np.array([0.5, 1.0, 1.7], np.float32)
  fn = jax.jit(lambda x, y, t: truncated_token_logprobs(x, y, None, temperature=t))
  got = fn(logits, tokens, jnp.asarray(taus)[:, None])
  x = np.asarray(logits, np.float64) / taus[:, None, None]
  lse = np.log(np.exp(x).sum(-1))
  want = np.take_along_axis(x, np.asarray(tokens)[..., None], -1)[..., 0] - lse
  np.testing.assert_allclose(got, want, atol=1e-5)


def test_bad_per_row_temperatures_raise(params, prompts):
  with pytest.raises(ValueError, match=r"must be \[G\] = \(3,\) or \[B\] = \(9,\)"):
    row_temperatures([1.0, 0.0], num_prompts=P, num_samples=G)
  with pytest.raises(ValueError, match=">= 0"):
    row_temperatures([1.0, -1.0, 0.0], num_prompts=P, num_samples=G)
  with pytest.raises(ValueError, match="not Greedy"):
    _run(params, prompts, Greedy(), temperatures=[0.0, 0.0, 0.0])
  with pytest.raises(ValueError, match="need a sampling strategy"):
    per_row_log_probs(Greedy(), jnp.zeros((2, 5)), jnp.zeros(2))
  with pytest.raises(ValueError, match="does not broadcast"):
    truncated_token_logprobs(
      jnp.zeros((2, 3, 5)), jnp.zeros((2, 3), jnp.int32), None, temperature=jnp.ones(2)
    )
