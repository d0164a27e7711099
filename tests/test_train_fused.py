"""The train step with the objective fused into the log-prob sweep equals the unfused step."""

import jax
import numpy as np
import optax
import pytest
from test_train_step import CFG, T, _batch, _state

from rlvr_jax.train import step as step_lib


def _step(objective, fused_loss, kwargs, *, num_microbatches=2, on_policy=False):
  opt = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(1.0))
  step = step_lib.make_train_step(
    model_config=CFG,
    optimizer=opt,
    objective=objective,
    objective_kwargs=kwargs,
    num_microbatches=num_microbatches,
    on_policy=on_policy,
    temperature=0.9,
    fused_loss=fused_loss,
  )
  batch, cmask = _batch(3)
  num_tokens, num_seqs = float(cmask.sum()), float((cmask.sum(-1) > 0).sum())
  extra = step_lib.init_extra(objective, kwargs) or None
  state, metrics = step(_state(opt, extra), batch, num_tokens, num_seqs, jax.random.key(5))
  return jax.device_get(state.params), jax.device_get(metrics)


@pytest.mark.parametrize(
  "objective, kwargs, on_policy",
  [
    ("dapo", {"entropy_coef": 0.01}, False),
    pytest.param("grpo", {}, True, marks=pytest.mark.slow),  # old_logp = sg(logp)
    pytest.param(  # a step statistic
      "siren", {"seq_norm_constant": float(T), "siren_coef": 0.5}, False, marks=pytest.mark.slow
    ),
  ],
)
def test_fused_step_equals_unfused_step(objective, kwargs, on_policy):
  p_ref, m_ref = _step(objective, False, kwargs, on_policy=on_policy)
  p_fused, m_fused = _step(objective, True, kwargs, on_policy=on_policy)
  for a, b in zip(jax.tree.leaves(p_fused), jax.tree.leaves(p_ref), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert m_ref.keys() == m_fused.keys()
  for k in m_ref:
    np.testing.assert_allclose(m_fused[k], m_ref[k], rtol=1e-5, atol=1e-6, err_msg=k)
  moved = max(float(np.max(np.abs(a - b))) for a, b in
              zip(jax.tree.leaves(p_fused), jax.tree.leaves(_state_params()), strict=True))  # fmt: skip
  assert moved > 1e-4  # the step did update the params


def _state_params():
  return jax.device_get(_state(optax.sgd(1.0)).params)


def test_fused_loss_true_needs_a_token_local_objective():
  with pytest.raises(ValueError, match="token-local"):
    step_lib.make_train_step(
      model_config=CFG, optimizer=optax.sgd(1.0), objective="gspo", fused_loss=True
    )
  with pytest.raises(ValueError, match="fused_loss must be"):
    step_lib.make_train_step(
      model_config=CFG, optimizer=optax.sgd(1.0), objective="grpo", fused_loss="yes"
    )
