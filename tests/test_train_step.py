"""The jitted train step: micro-batching equals the full batch, non-finite skips, inputs, metrics."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlvr_jax import model
from rlvr_jax.train import step as step_lib
from rlvr_jax.train.state import TrainBatch, init_state

CFG = model.ModelConfig.tiny(
  vocab_size=32,
  hidden_size=32,
  intermediate_size=64,
  num_layers=1,
  num_heads=2,
  num_kv_heads=1,
  head_dim=16,
)
B, S_P, T = 8, 4, 5


def _batch(seed=0, *, nan_adv=False):
  rng = np.random.default_rng(seed)
  prompt = rng.integers(3, CFG.vocab_size, (B, S_P)).astype(np.int32)
  pmask = np.ones((B, S_P), bool)
  pmask[::2, 0] = False  # left padding on half the rows
  comp = rng.integers(3, CFG.vocab_size, (B, T)).astype(np.int32)
  lengths = rng.integers(1, T + 1, B)
  cmask = np.arange(T)[None, :] < lengths[:, None]
  adv = rng.normal(size=(B, 1)).astype(np.float32) * cmask
  if nan_adv:
    adv[1, 0] = np.nan
  tokens, positions = step_lib.sequence_inputs(prompt, pmask, jnp.asarray(comp))
  old = jnp.asarray(rng.normal(size=(B, T)).astype(np.float32) * 0.1 - 2.0)
  return TrainBatch(
    tokens=tokens,
    positions=positions,
    completion_mask=jnp.asarray(cmask),
    advantages=jnp.asarray(adv),
    old_logp=old,
    sampler_logp=old,
    ref_logp=None,
    extras={},
  ), cmask


def _state(optimizer, extra=None):
  params = model.init_params(CFG, jax.random.key(0))
  return init_state(params, optimizer, jax.random.key(1), extra)


def _run(objective, num_microbatches, *, on_policy=False, kwargs=None, seed=0):
  # SGD: the update is the (clipped) gradient itself, so equal params <=> equal gradients. (Adam's
  # first step is ~lr * sign(g), which turns round-off in near-zero gradients into O(lr) noise.)
  opt = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(1.0))
  step = step_lib.make_train_step(
    model_config=CFG,
    optimizer=opt,
    objective=objective,
    objective_kwargs=kwargs or {},
    num_microbatches=num_microbatches,
    on_policy=on_policy,
    chunk_size=2,
  )
  batch, cmask = _batch(seed)
  num_tokens, num_seqs = float(cmask.sum()), float((cmask.sum(-1) > 0).sum())
  extra = step_lib.init_extra(objective, kwargs) or None
  state, metrics = step(_state(opt, extra), batch, num_tokens, num_seqs, jax.random.key(5))
  return state, jax.device_get(metrics)


@pytest.mark.parametrize(
  "objective,kwargs",
  [
    ("grpo", {}),  # seq_mean_token_mean
    ("clip_cov", {"clip_cov_ratio": 0.2}),  # token_mean, step-scope statistic + per-token noise
    ("siren", {"seq_norm_constant": float(T), "siren_coef": 0.5}),  # squared step statistic
  ],
)
def test_microbatched_step_equals_full_batch(objective, kwargs):
  full, m_full = _run(objective, 1, kwargs=kwargs)
  split, m_split = _run(objective, 4, kwargs=kwargs)
  assert float(m_full["update_norm"]) > 1e-3  # a real update happened
  for a, b in zip(jax.tree.leaves(full.params), jax.tree.leaves(split.params), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  for key in ("loss", "grad_norm", "update_norm", "ratio/mean", "clip_frac/high", "ratio/max"):
    np.testing.assert_allclose(m_full[key], m_split[key], rtol=1e-5, atol=1e-6, err_msg=key)
  if objective == "siren":  # its state, the anchor, was set (from NaN) to the step's H_sel
    assert np.isfinite(float(full.extra["objective"]))
    np.testing.assert_allclose(full.extra["objective"], split.extra["objective"], rtol=1e-6)


def test_step_changes_params_and_reports_norms():
  opt = optax.sgd(0.1)
  step = step_lib.make_train_step(model_config=CFG, optimizer=opt, objective="dapo", chunk_size=2)
  batch, cmask = _batch(1)
  state0 = _state(opt)
  params0 = jax.tree.map(np.asarray, state0.params)
  state, m = step(
    state0, batch, float(cmask.sum()), float((cmask.sum(-1) > 0).sum()), jax.random.key(0)
  )
  # SGD: update = -lr * grad, so update_norm = lr * grad_norm, and the params moved by it.
  np.testing.assert_allclose(float(m["update_norm"]), 0.1 * float(m["grad_norm"]), rtol=1e-5)
  moved = optax.global_norm(jax.tree.map(lambda a, b: a - b, state.params, params0))
  np.testing.assert_allclose(float(moved), float(m["update_norm"]), rtol=1e-4)
  np.testing.assert_allclose(float(m["param_norm"]), float(optax.global_norm(params0)), rtol=1e-6)
  assert float(m["skipped"]) == 0.0 and int(state.num_skipped) == 0


def test_nonfinite_loss_skips_update_and_counts():
  opt = optax.adamw(1e-2)
  step = step_lib.make_train_step(model_config=CFG, optimizer=opt, objective="grpo", chunk_size=2)
  batch, cmask = _batch(2, nan_adv=True)
  state0 = _state(opt)
  params0 = jax.tree.map(np.asarray, state0.params)
  opt0 = jax.tree.map(np.asarray, state0.opt_state)
  state, m = step(state0, batch, float(cmask.sum()), float(B), jax.random.key(0))
  assert float(m["skipped"]) == 1.0 and int(state.num_skipped) == 1
  assert not np.isfinite(float(m["loss"]))
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(params0), strict=True):
    np.testing.assert_array_equal(np.asarray(a), b)
  for a, b in zip(jax.tree.leaves(state.opt_state), jax.tree.leaves(opt0), strict=True):
    np.testing.assert_array_equal(np.asarray(a), b)


def test_on_policy_ratio_is_one_and_logp_gap_against_recomputed():
  """on_policy: old_logp = sg(logp), so every ratio is exactly 1; the sampler gap is measured."""
  opt = optax.sgd(0.0)
  params = model.init_params(CFG, jax.random.key(0))
  batch, cmask = _batch(3)
  logp, _ = step_lib.completion_logprobs(
    params, batch.tokens, batch.positions, num_completion=T, model_config=CFG,
    temperature=1.0, chunk_size=2,
  )  # fmt: skip
  batch = TrainBatch(**{**batch.__dict__, "sampler_logp": logp + 0.25 * jnp.asarray(cmask)})
  step = step_lib.make_train_step(
    model_config=CFG, optimizer=opt, objective="grpo", on_policy=True, chunk_size=2
  )
  _, m = step(init_state(params, opt, jax.random.key(1)), batch, float(cmask.sum()), float(B),
              jax.random.key(0))  # fmt: skip
  np.testing.assert_allclose(float(m["ratio/mean"]), 1.0, atol=1e-6)
  np.testing.assert_allclose(float(m["ratio/max"]), 1.0, atol=1e-6)
  np.testing.assert_allclose(float(m["logp_gap/mean"]), 0.25, atol=1e-5)
  np.testing.assert_allclose(float(m["logp_gap/max"]), 0.25, atol=1e-5)


def test_completion_logprobs_match_full_logits():
  params = model.init_params(CFG, jax.random.key(0))
  batch, _ = _batch(4)
  logp, ent = step_lib.completion_logprobs(
    params, batch.tokens, batch.positions, num_completion=T, model_config=CFG,
    temperature=0.7, chunk_size=2,
  )  # fmt: skip
  logits, _ = model.forward(params, batch.tokens, batch.positions, config=CFG, return_logits=True)
  z = np.asarray(logits, np.float64)[:, S_P - 1 : S_P - 1 + T] / 0.7
  logz = (
    z
    - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True))
    - z.max(-1, keepdims=True)
  )
  tok = np.asarray(batch.tokens)[:, S_P:]
  ref = np.take_along_axis(logz, tok[..., None], -1)[..., 0]
  np.testing.assert_allclose(np.asarray(logp), ref, atol=2e-5)
  ref_ent = -(np.exp(logz) * logz).sum(-1)
  np.testing.assert_allclose(np.asarray(ent), ref_ent, atol=2e-5)


def test_sequence_inputs_positions():
  prompt = np.array([[0, 0, 7, 8], [5, 6, 7, 8]], np.int32)
  pmask = prompt > 0
  tokens, positions = step_lib.sequence_inputs(prompt, pmask, jnp.array([[9, 2], [9, 9]]))
  np.testing.assert_array_equal(np.asarray(tokens), [[0, 0, 7, 8, 9, 2], [5, 6, 7, 8, 9, 9]])
  np.testing.assert_array_equal(np.asarray(positions), [[-1, -1, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]])
  with pytest.raises(ValueError, match="share B"):
    step_lib.sequence_inputs(prompt, pmask, jnp.zeros((3, 2), jnp.int32))


def test_microbatch_count_must_divide_rows():
  opt = optax.sgd(0.1)
  step = step_lib.make_train_step(
    model_config=CFG, optimizer=opt, objective="grpo", num_microbatches=3
  )
  batch, cmask = _batch(0)
  with pytest.raises(ValueError, match="not divisible by num_microbatches=3"):
    step(_state(opt), batch, float(cmask.sum()), float(B), jax.random.key(0))
