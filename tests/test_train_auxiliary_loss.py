"""The auxiliary loss in the train step (``config.auxiliary_loss``): LaSeR's last-token
self-reward MSE. Its gradient through the trainer's step equals a NumPy computation (lm_head)
and an independent full-logits JAX one (every parameter); it does not depend on the micro-batch
split; the trainer fills its inputs and metrics from the config."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as PS

from rlvr_jax import losses, model
from rlvr_jax.train import config as config_lib
from rlvr_jax.train import step as step_lib
from rlvr_jax.train.loop import Trainer
from rlvr_jax.train.state import TrainBatch, init_state

CFG = model.ModelConfig.tiny(
  vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
  num_kv_heads=1, head_dim=16,
)  # fmt: skip
B, S_P, T = 8, 4, 5
HP = dict(token_id=7, beta=0.3, ref_logp=-4.0, coef=0.7)
NAME = "last_token_self_reward"


def _batch(*, advantages: bool):
  rng = np.random.default_rng(3)
  prompt = rng.integers(3, CFG.vocab_size, (B, S_P)).astype(np.int32)
  pmask = np.ones((B, S_P), bool)
  pmask[::2, 0] = False  # left padding on half the rows
  comp = rng.integers(3, CFG.vocab_size, (B, T)).astype(np.int32)
  lengths = np.array([1, 5, 3, 0, 4, 2, 5, 3])  # row 3 is empty (masked out): left out
  cmask = np.arange(T)[None, :] < lengths[:, None]
  adv = rng.normal(size=(B, 1)).astype(np.float32) * cmask if advantages else np.zeros((B, T))
  rewards = np.array([1, 0, 1, 1, np.nan, 0, 1, 0], np.float32)  # row 4: failed reward
  tokens, positions = step_lib.sequence_inputs(prompt, pmask, jnp.asarray(comp))
  batch = TrainBatch(
    tokens=tokens, positions=positions, completion_mask=jnp.asarray(cmask),
    advantages=jnp.asarray(adv, jnp.float32), old_logp=jnp.zeros((B, T)),
    sampler_logp=jnp.zeros((B, T)), ref_logp=None, extras={},
    aux={"rewards": jnp.asarray(rewards)},
  )  # fmt: skip
  return batch, cmask, rewards


def _step(num_microbatches: int, *, advantages: bool, mesh=None):
  opt = optax.sgd(1.0)  # the update is minus the gradient
  step = step_lib.make_train_step(
    model_config=CFG, optimizer=opt, objective="grpo", num_microbatches=num_microbatches,
    on_policy=True, chunk_size=2, auxiliary=NAME, auxiliary_kwargs=HP,
  )  # fmt: skip
  params = model.init_params(CFG, jax.random.key(0))
  batch, cmask, rewards = _batch(advantages=advantages)
  num_tokens, num_seqs = float(cmask.sum()), float((cmask.sum(-1) > 0).sum())
  state = init_state(jax.tree.map(jnp.copy, params), opt, jax.random.key(1))  # donated
  if mesh is not None:  # rows split over the devices, everything else replicated
    rows = lambda x: NamedSharding(mesh, PS("data", *([None] * (x.ndim - 1))))
    batch = jax.tree.map(lambda x: jax.device_put(x, rows(x)), batch)
    state = jax.device_put(state, NamedSharding(mesh, PS()))
  new, metrics = step(state, batch, num_tokens, num_seqs, jax.random.key(2))
  grads = jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), params, new.params)
  return params, grads, jax.device_get(metrics), batch, cmask, rewards, num_seqs


def test_auxiliary_gradient_matches_numpy_and_a_full_logits_reference():
  # Zero advantages: the policy term has no gradient, so the update is the auxiliary loss's.
  params, grads, metrics, batch, cmask, rewards, num_seqs = _step(1, advantages=False)
  hidden, _ = model.forward(params, batch.tokens, batch.positions, config=CFG)
  lengths = cmask.sum(1)
  ok = (lengths > 0) & np.isfinite(rewards)
  last = S_P + np.maximum(lengths, 1) - 1  # the state AT the last completion token
  h = np.asarray(hidden, np.float64)[np.arange(B), last]  # [B, D]
  u = np.asarray(params["lm_head"], np.float64)  # [D, V]
  z = h @ u
  logp = z - z.max(1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(1, keepdims=True))
  p = np.exp(logp)
  tid, beta, c_ref, coef = HP["token_id"], HP["beta"], HP["ref_logp"], HP["coef"]
  r_s = beta * (logp[:, tid] - c_ref)
  err = np.where(ok, r_s - np.nan_to_num(rewards), 0.0)
  # dL/dz_b = (2 α β / N) (r_s − r_v) (e_z − p_b);  dL/dU = Σ_b h_b ⊗ dL/dz_b
  dz = (2 * coef * beta / num_seqs) * err[:, None] * (np.eye(CFG.vocab_size)[tid] - p)
  np.testing.assert_allclose(grads["lm_head"], h.T @ dz, rtol=2e-4, atol=1e-7)
  assert np.abs(grads["lm_head"]).max() > 1e-4  # the check is not vacuous
  want_mse = float(np.sum(err**2) / ok.sum())
  assert metrics["laser/mse"] == pytest.approx(want_mse, rel=1e-4)
  assert metrics["laser/self_reward"] == pytest.approx(float(r_s[ok].mean()), rel=1e-4, abs=1e-6)

  # Every parameter: an independent formulation (full logits, no tiled sweep).
  def reference(prm):
    hid, _ = model.forward(prm, batch.tokens, batch.positions, config=CFG)
    logits = model.logits_from_hidden(prm, hid[jnp.arange(B), last], CFG)
    lp = jax.nn.log_softmax(logits, axis=-1)[:, tid]
    sq = jnp.where(ok, (beta * (lp - c_ref) - jnp.nan_to_num(rewards)) ** 2, 0.0)
    return coef * jnp.sum(sq) / num_seqs

  want = jax.grad(reference)(params)
  for path, g in jax.tree_util.tree_leaves_with_path(want):
    got = grads
    for k in path:
      got = got[k.key]
    np.testing.assert_allclose(got, np.asarray(g), rtol=2e-4, atol=2e-7, err_msg=str(path))


def test_auxiliary_loss_is_invariant_to_micro_batching():
  _, g1, m1, *_ = _step(1, advantages=True)
  _, g4, m4, *_ = _step(4, advantages=True)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g4), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
  for k in ("laser/mse", "laser/self_reward", "laser/sign_accuracy", "loss"):
    assert m1[k] == pytest.approx(m4[k], rel=1e-5, abs=1e-7), k


def test_auxiliary_loss_on_8_devices_equals_one_device():
  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  _, g1, m1, *_ = _step(1, advantages=True)
  _, g8, m8, *_ = _step(1, advantages=True, mesh=mesh)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g8), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
  for k in ("laser/mse", "laser/self_reward", "laser/sign_accuracy", "loss"):
    assert m1[k] == pytest.approx(m8[k], rel=1e-5, abs=1e-7), k


@pytest.mark.slow
def test_the_trainer_runs_the_configured_auxiliary_loss(tmp_path):
  c = config_lib.tiny_config(
    tmp_path, auxiliary_loss=dict(name=NAME, token="*", kwargs=dict(beta=0.2, ref_logp=-5.0)),
    rl=dict(num_microbatches=2),
  )  # fmt: skip
  trainer = Trainer(c, log=lambda s: None)
  try:
    assert trainer.auxiliary is losses.AUXILIARY_LOSSES[NAME]
    trainer.restore_or_start()
    metrics = trainer.rl_step(0)
    for k in ("laser/mse", "laser/self_reward", "laser/sign_accuracy", "laser/token_logp"):
      assert np.isfinite(metrics[k]), k
    # r_s = β (log π(z_c) − c_ref) with the configured β and c_ref.
    want = 0.2 * (metrics["laser/token_logp"] + 5.0)
    assert metrics["laser/self_reward"] == pytest.approx(want, rel=1e-4)
  finally:
    trainer.close()


def test_auxiliary_loss_config_errors(tmp_path):
  bad = [
    (dict(name="nope"), "auxiliary_loss.name"),
    (dict(name=NAME), "auxiliary_loss.token"),
  ]
  for aux, field in bad:
    with pytest.raises(config_lib.ConfigError, match=field):
      config_lib.validate(config_lib.tiny_config(tmp_path, auxiliary_loss=aux))
  c = config_lib.tiny_config(tmp_path, auxiliary_loss=dict(name=NAME, token="12"))
  with pytest.raises(ValueError, match="must be one"):
    Trainer(c, log=lambda s: None)
