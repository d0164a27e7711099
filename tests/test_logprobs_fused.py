"""Tests for logprobs.fused_objective_from_hidden: the token-local objective fused into the sweep.

The reference is the unfused path (token_stats_from_hidden, itself pinned to float64 NumPy in
test_logprobs.py) followed by the same objective under plain autodiff; one case is also checked
against float64 NumPy directly.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import logprobs, losses


def _case(seed, b=4, t=11, d=8, v=53):
  rng = np.random.default_rng(seed)
  hidden = jnp.asarray(2.0 * rng.normal(size=(b, t, d)), jnp.float32)
  unembed = jnp.asarray(rng.normal(size=(d, v)) / 2.0, jnp.float32)
  tokens = jnp.asarray(rng.integers(0, v, (b, t)), jnp.int32)
  lengths = rng.integers(1, t + 1, b)
  mask = jnp.asarray(np.arange(t)[None, :] < lengths[:, None])
  logp0, _ = logprobs.token_logprobs_from_hidden(hidden, unembed, tokens, temperature=0.8)
  old = jnp.asarray(logp0 + 0.3 * rng.normal(size=(b, t)), jnp.float32)  # some ratios clip
  ref = jnp.asarray(logp0 + 0.5 * rng.normal(size=(b, t)), jnp.float32)
  adv = jnp.asarray(rng.normal(size=(b,)), jnp.float32)
  return hidden, unembed, tokens, mask, old, ref, adv


def _objective(name, mask, old, ref, adv, **kw):
  num_tokens = jnp.sum(mask).astype(jnp.float32)
  num_seqs = jnp.sum(jnp.any(mask, -1)).astype(jnp.float32)

  def fn(logp, entropy):
    loss, _ = losses.OBJECTIVES[name](
      logp, old, adv, mask, num_tokens=num_tokens, num_seqs=num_seqs, ref_logp=ref,
      entropy=entropy, **kw,
    )  # fmt: skip
    return loss

  return fn


def _both(objective, hidden, unembed, tokens, *, chunk_size, temperature=0.8, fill=None):
  """(loss, grads) of the unfused and of the fused path."""

  def unfused(h, w):
    logp, entropy = logprobs.token_logprobs_from_hidden(h, w, tokens, temperature=temperature)
    return objective(logp, entropy)

  def fused(h, w):
    loss, _, _ = logprobs.fused_objective_from_hidden(
      h, w, tokens, objective, temperature=temperature, chunk_size=chunk_size, logp_fill=fill
    )
    return loss

  grad = lambda f: jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(hidden, unembed)
  return grad(unfused), grad(fused)


def _assert_close(a, b, atol=2e-6, rtol=1e-5):
  (la, (gha, gwa)), (lb, (ghb, gwb)) = a, b
  np.testing.assert_allclose(lb, la, rtol=rtol, atol=atol)
  np.testing.assert_allclose(ghb, gha, rtol=rtol, atol=atol)
  np.testing.assert_allclose(gwb, gwa, rtol=rtol, atol=atol)


TOKEN_LOCAL_CASES = [  # options on top of the per-recipe test at the end of this file
  ("grpo", {"kl_coef": 0.1}),  # k3 value, k2 gradient to the reference
  ("ppo", {"loss_agg_mode": "seq_mean_token_sum", "kl_coef": 0.05, "kl_grad": "k3"}),
  ("dapo", {"mismatch": "seq_truncate", "sampler_logp": "old"}),  # constant token weights
]


@pytest.mark.parametrize("name, kw", TOKEN_LOCAL_CASES)
def test_fused_equals_unfused_loss_and_gradients(name, kw):
  hidden, unembed, tokens, mask, old, ref, adv = _case(0)
  if kw.get("sampler_logp") == "old":
    kw = {**kw, "sampler_logp": old - 0.1}
  objective = _objective(name, mask, old, ref, adv, **kw)
  # chunk 6 does not divide B*T = 44: the last tile is padded.
  _assert_close(*_both(objective, hidden, unembed, tokens, chunk_size=6, fill=old))


@pytest.mark.parametrize("chunk_size", [1, 7, 44, 1000])
def test_tile_size_and_placeholders_do_not_change_the_result(chunk_size):
  hidden, unembed, tokens, mask, old, ref, adv = _case(1)
  objective = _objective("dapo", mask, old, ref, adv, entropy_coef=0.01)
  want, got = _both(objective, hidden, unembed, tokens, chunk_size=chunk_size, fill=None)
  _assert_close(want, got)


def test_matches_float64_numpy_reference():
  """L = Σ m·(−A·logp − c·H) / N with p = softmax(h W / τ), value and gradients in float64."""
  hidden, unembed, tokens, mask, _, _, adv = _case(2, b=2, t=5, d=4, v=9)
  tau, c = 0.7, 0.05
  m = np.asarray(mask, np.float64)
  a = np.asarray(adv, np.float64)[:, None] * np.ones_like(m)

  def objective(logp, entropy):
    return jnp.sum(mask * (-adv[:, None] * logp - c * entropy)) / jnp.sum(mask)

  loss, (gh, gw) = jax.jit(
    jax.value_and_grad(
      lambda h, w: logprobs.fused_objective_from_hidden(
        h, w, tokens, objective, temperature=tau, chunk_size=3
      )[0],
      argnums=(0, 1),
    )
  )(hidden, unembed)

  h = np.asarray(hidden, np.float64)
  w = np.asarray(unembed, np.float64)
  y = np.asarray(tokens)

  def np_loss(h, w):
    z = h @ w / tau
    z = z - z.max(-1, keepdims=True)
    ls = z - np.log(np.exp(z).sum(-1, keepdims=True))
    logp = np.take_along_axis(ls, y[..., None], -1)[..., 0]
    entropy = -(np.exp(ls) * ls).sum(-1)
    return np.sum(m * (-a * logp - c * entropy)) / m.sum()

  np.testing.assert_allclose(loss, np_loss(h, w), rtol=1e-5)
  eps = 1e-6
  for got, x, name in ((gh, h, "h"), (gw, w, "w")):
    num = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
      xp, xm = x.copy(), x.copy()
      xp[idx] += eps
      xm[idx] -= eps
      args_p = (xp, w) if name == "h" else (h, xp)
      args_m = (xm, w) if name == "h" else (h, xm)
      num[idx] = (np_loss(*args_p) - np_loss(*args_m)) / (2 * eps)
    np.testing.assert_allclose(got, num, rtol=2e-4, atol=2e-6)


def test_statistics_outputs_equal_the_unfused_ones_and_forward_only_call():
  hidden, unembed, tokens, mask, old, ref, adv = _case(3)
  objective = _objective("grpo", mask, old, ref, adv, entropy_coef=0.01)
  loss, logp, entropy = jax.jit(
    functools.partial(logprobs.fused_objective_from_hidden, objective=objective, chunk_size=5)
  )(hidden, unembed, tokens)
  want_logp, want_entropy = logprobs.token_logprobs_from_hidden(hidden, unembed, tokens)
  np.testing.assert_allclose(logp, want_logp, atol=1e-6)
  np.testing.assert_allclose(entropy, want_entropy, atol=1e-5)
  np.testing.assert_allclose(loss, objective(want_logp, want_entropy), rtol=1e-6)


def test_traced_coefficient_closed_over_under_jit():
  """Adaptive entropy: the coefficient is a traced input, closed over by the objective."""
  hidden, unembed, tokens, mask, old, ref, adv = _case(4)

  @jax.jit
  def grads(h, w, coef):
    objective = _objective("dapo", mask, old, ref, adv, entropy_coef=coef)
    fused = lambda h, w: logprobs.fused_objective_from_hidden(
      h, w, tokens, objective, chunk_size=8
    )[0]

    def unfused(h, w):
      logp, entropy = logprobs.token_logprobs_from_hidden(h, w, tokens)
      return objective(logp, entropy)

    return jax.grad(fused, (0, 1))(h, w), jax.grad(unfused, (0, 1))(h, w)

  for coef in (0.0, 0.05):
    got, want = grads(hidden, unembed, jnp.float32(coef))
    for g, r in zip(got, want, strict=True):
      np.testing.assert_allclose(g, r, rtol=1e-5, atol=2e-6)
  g0 = grads(hidden, unembed, jnp.float32(0.0))[0][1]
  g1 = grads(hidden, unembed, jnp.float32(0.05))[0][1]
  assert float(jnp.max(jnp.abs(g0 - g1))) > 1e-4  # the coefficient reaches the gradient


def test_fully_masked_rows_and_padding_ids_are_finite():
  hidden, unembed, tokens, mask, old, ref, adv = _case(5)
  mask = mask.at[1].set(False)
  tokens = jnp.where(mask, tokens, -1)
  old = jnp.where(mask, old, jnp.nan)  # padding may hold anything
  objective = _objective("grpo", mask, old, ref, adv, entropy_coef=0.01)
  want, got = _both(objective, hidden, unembed, tokens, chunk_size=4)
  _assert_close(want, got)
  assert np.all(np.isfinite(got[1][0])) and np.all(np.asarray(got[1][0])[1] == 0.0)


def test_bfloat16_inputs_give_gradients_in_their_dtype():
  hidden, unembed, tokens, mask, old, ref, adv = _case(6)
  objective = _objective("grpo", mask, old, ref, adv)
  h16, w16 = hidden.astype(jnp.bfloat16), unembed.astype(jnp.bfloat16)
  want, got = _both(objective, h16, w16, tokens, chunk_size=8)
  assert got[1][0].dtype == jnp.bfloat16 and got[1][1].dtype == jnp.bfloat16
  np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
  for g, r in zip(got[1], want[1], strict=True):
    np.testing.assert_allclose(
      np.asarray(g, np.float32), np.asarray(r, np.float32), rtol=2e-2, atol=1e-3
    )


def test_sequence_level_objective_is_not_token_local():
  """GSPO's ratio couples a row's tokens: the fused gradient is wrong for it, which is why the
  trainer only fuses ``losses.is_token_local`` objectives. This pins that the check matters."""
  hidden, unembed, tokens, mask, old, ref, adv = _case(7)
  objective = _objective("gspo", mask, old, ref, adv, clip_low=10.0, clip_high=10.0)
  want, got = _both(objective, hidden, unembed, tokens, chunk_size=4, fill=old)
  np.testing.assert_allclose(got[0], want[0], rtol=1e-5)  # the value is right...
  assert float(jnp.max(jnp.abs(got[1][1] - want[1][1]))) > 1e-4  # ...the gradient is not
  assert not losses.is_token_local("gspo", {})
  assert losses.is_token_local("grpo", {"entropy_coef": 0.01})


def test_bad_inputs_raise_naming_shapes():
  hidden, unembed, tokens, mask, old, ref, adv = _case(8)
  objective = _objective("grpo", mask, old, ref, adv)
  with pytest.raises(ValueError, match=r"unembed must be \[D, V\]"):
    logprobs.fused_objective_from_hidden(hidden, unembed.T, tokens, objective)
  with pytest.raises(ValueError, match=r"logp_fill shape \(4, 3\)"):
    logprobs.fused_objective_from_hidden(hidden, unembed, tokens, objective, logp_fill=old[:, :3])
  with pytest.raises(ValueError, match="tokens shape"):
    logprobs.fused_objective_from_hidden(hidden, unembed, tokens[:, :5], objective)


def _recipe_inputs(name, logp, old, adv, mask, entropy, rng):
  """Extra keyword inputs of recipe ``name`` and its step-scope statistics (as the trainer does)."""
  b, t = mask.shape
  extra = {}
  if name == "copo":
    extra = {
      "global_advantages": jnp.asarray(rng.normal(size=(b,)), jnp.float32),
      "local_weight": jnp.asarray(rng.random(b), jnp.float32),
    }
  if name == "lp_reg":  # a min-p proxy above some of the tokens' log-probs; select plenty
    extra = {"proxy_logp": logp + jnp.asarray(rng.normal(size=(b, t)), jnp.float32),
             "lp_reg_frac": 0.5}  # fmt: skip
  if name in ("dr_grpo", "siren"):
    extra = {"seq_norm_constant": float(t)}
  if name == "siren":
    extra["siren_anchor"] = jnp.float32(1.0)
  if name == "adaptive_entropy":  # the coefficient its MethodState gives the step
    extra = {"adaptive_entropy_coef": jnp.float32(0.02)}
  if name in ("clip_cov", "kl_cov"):  # select a visible share of the tokens
    extra = (
      {"clip_cov_ratio": 0.3, "cov_low": -10.0} if name == "clip_cov" else {"kl_cov_ratio": 0.3}
    )
  noise = jnp.asarray(rng.random((b, t)), jnp.float32)
  num_tokens = jnp.sum(mask).astype(jnp.float32)
  num_seqs = jnp.sum(jnp.any(mask, -1)).astype(jnp.float32)
  stats = losses.step_statistics(
    name, logp, old, adv, mask, num_tokens=num_tokens, num_seqs=num_seqs, entropy=entropy,
    noise=noise, **extra,
  )  # fmt: skip
  if name == "clip_cov":
    extra = {**extra, "noise": noise}
  return {**extra, **stats}


@pytest.mark.parametrize("name", losses.TOKEN_LOCAL_OBJECTIVES)
def test_every_token_local_recipe_fuses_exactly(name):
  """Each recipe listed as token-local, with its step statistics computed beforehand from the
  current policy (the trainer's pre-pass), has the same loss and gradients fused and unfused."""
  hidden, unembed, tokens, mask, old, ref, adv = _case(9, b=4, t=9)
  logp, entropy = logprobs.token_logprobs_from_hidden(hidden, unembed, tokens, temperature=0.8)
  old = logp + 0.2 * (old - logp)  # closer to on-policy: some ratios inside the clip range
  rng = np.random.default_rng(10)
  extra = _recipe_inputs(name, logp, old, adv, mask, entropy, rng)
  objective = _objective(name, mask, old, ref, adv, entropy_coef=0.01, **extra)
  _assert_close(*_both(objective, hidden, unembed, tokens, chunk_size=5, fill=old))
