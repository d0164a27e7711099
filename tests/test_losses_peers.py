"""Where the library and its peers (verl 0.9.1 ``core_algos``, TRL 1.16 ``GRPOTrainer``) disagree,
the convention chosen is pinned here (each function's docstring names the peer's beside it):

* PPO dual-clip fraction: verl's rule (clipped loss > -A c), right for every |A|;
* GSPO ``max_log_ratio``: clamps value and gradient (verl);
* 80/20 selection: exact top-k (official code) by default, TRL's quantile rule on request;
* GRPO std epsilon: 1e-6 (verl), TRL's 1e-4 on request;
* SIREN on a batch without valid tokens: 0.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import advantages, losses, regularizers


def _f32(x):
  return jnp.asarray(x, jnp.float32)


@pytest.mark.parametrize("a", [-2.5, -0.5, -1.0])
def test_dual_clip_fraction_tests_the_ratio_for_any_advantage_size(a):
  r = np.array([[0.5, 1.0, 2.0, 2.9, 3.1, 5.0]])  # c = 3: only the last two are dual-clipped
  adv = np.full(r.shape, a)
  loss, info = losses.ppo_clip_loss(_f32(np.log(r)), jnp.zeros(r.shape), _f32(adv), dual_clip=3.0)
  np.testing.assert_array_equal(info["dual"], [[0, 0, 0, 0, 1, 1]])
  # verl: pg_clipfrac_lower = mean((max(-A r, -A clip r) > -A c) * (A < 0)); the value is capped.
  clipped = np.maximum(-adv * r, -adv * np.clip(r, 0.8, 1.28))
  np.testing.assert_array_equal(info["dual"], (clipped > -adv * 3.0) & (adv < 0))
  np.testing.assert_allclose(loss, np.minimum(clipped, -adv * 3.0), rtol=1e-6)


def test_gspo_bound_clamps_value_and_gradient():
  # Row 0: log-ratio 11 > 10 (clamped: value e^10, no gradient); row 1: log-ratio 0.5 (free).
  delta = np.array([[11.0, 11.0, 11.0], [0.5, 0.5, 0.5]])
  mask = jnp.ones((2, 3), bool)
  adv = _f32([-1.0, -1.0])
  old = jnp.zeros((2, 3))

  def fn(x):
    per_token, _ = losses.gspo_loss(x, old, adv, mask)
    return losses.aggregate(per_token, mask, mode="seq_mean_token_mean", num_tokens=6.0,
                            num_seqs=2.0), per_token  # fmt: skip

  (loss, per_token), grad = jax.value_and_grad(fn, has_aux=True)(_f32(delta))
  np.testing.assert_allclose(per_token[0], np.exp(10.0), rtol=1e-5)
  np.testing.assert_allclose(per_token[1], np.exp(0.5), rtol=1e-5)
  np.testing.assert_array_equal(grad[0], 0.0)  # verl: torch.clamp stops the gradient
  np.testing.assert_allclose(grad[1], np.exp(0.5) / 3 / 2, rtol=1e-5)  # -A s_b / n_b / N_seq


def test_top_entropy_rules_official_top_k_and_trl_quantile():
  h = _f32([[0.4, 0.1, 0.9, 0.3]])
  m = jnp.ones((1, 4), bool)
  for rule, kept in (("top_k", 2), ("quantile", 1)):  # rho N = 1.2: ceil -> 2; TRL keeps 1
    thr = losses.high_entropy_threshold(h, m, top_entropy_frac=0.3, top_entropy_rule=rule)
    assert int(losses.high_entropy_mask(h, m, thr).sum()) == kept, rule
  thr = losses.high_entropy_threshold(h, m, top_entropy_frac=0.3, top_entropy_rule="quantile")
  np.testing.assert_allclose(thr, np.quantile([0.4, 0.1, 0.9, 0.3], 0.7), rtol=1e-6)
  # METHODS.md §3.8 golden: both rules select {0, 3} at rho = 0.2 over these 10 values.
  h10 = _f32([[2.0, 0.1, 0.5, 3.0, 0.2, 1.0, 0.05, 0.3, 0.4, 0.6]])
  m10 = jnp.ones((1, 10), bool)
  for rule in ("top_k", "quantile"):
    thr = losses.high_entropy_threshold(h10, m10, top_entropy_frac=0.2, top_entropy_rule=rule)
    np.testing.assert_array_equal(np.flatnonzero(losses.high_entropy_mask(h10, m10, thr)), [0, 3])
  with pytest.raises(ValueError, match="top_entropy_rule"):
    losses.high_entropy_threshold(h, m, top_entropy_rule="median")


def test_grpo_epsilon_default_is_verls_and_trls_on_request():
  r = np.array([[0.0, 1e-3, 0.0, 1e-3]])  # a non-constant group with a tiny std
  std = np.std(r, ddof=1)
  for eps in (1e-6, 1e-4):
    want = (r - r.mean()) / (std + eps)
    got = advantages.grpo_advantages(_f32(r), epsilon=eps)
    np.testing.assert_allclose(got, want, rtol=1e-4)
  np.testing.assert_allclose(advantages.grpo_advantages(_f32(r)), (r - r.mean()) / (std + 1e-6),
                             rtol=1e-4)  # fmt: skip


def test_siren_on_a_batch_without_valid_tokens_is_zero():
  mask = jnp.zeros((2, 3), bool)
  h = _f32(np.ones((2, 3)))
  penalty, _ = regularizers.siren_penalty(h, mask, anchor=1.5, num_tokens=0.0, num_seqs=0.0)
  assert float(penalty) == 0.0

  def fn(x):
    return losses.OBJECTIVES["siren"](
      x, jnp.zeros((2, 3)), _f32([1.0, -1.0]), mask, num_tokens=0.0, num_seqs=0.0, entropy=h,
      siren_anchor=1.5, seq_norm_constant=3.0,
    )[0]  # fmt: skip

  loss, grad = jax.value_and_grad(fn)(_f32(-np.ones((2, 3))))
  assert float(loss) == 0.0 and np.all(np.asarray(grad) == 0.0)
