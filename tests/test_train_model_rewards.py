"""Trainer pieces of issue 17 on a tiny random model: the jitted model-reward pass (self-certainty,
RLPR) against NumPy from full logits, and PRIME's PRM step against a hand-written SGD step."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlvr_jax import losses
from rlvr_jax.model import ModelConfig, forward, init_params
from rlvr_jax.train import implicit_prm, model_rewards
from rlvr_jax.train import step as step_lib

CONFIG = ModelConfig.tiny()
B, S_PROMPT, T = 4, 4, 5


@pytest.fixture(scope="module")
def params():
  p = init_params(CONFIG, jax.random.key(1))
  return dict(p, lm_head=p["lm_head"] * 10.0)


def _batch():
  rng = np.random.default_rng(0)
  prompt_mask = np.arange(S_PROMPT)[None, :] >= np.array([0, 1, 2, 3])[:, None]
  prompt = np.where(prompt_mask, rng.integers(3, 200, (B, S_PROMPT)), 0).astype(np.int32)
  mask = np.arange(T)[None, :] < np.array([5, 3, 4, 2])[:, None]
  tokens = np.where(mask, rng.integers(3, 200, (B, T)), 0).astype(np.int32)
  tokens[0, 2] = 250  # the answer marker in row 0 only
  return prompt, prompt_mask, tokens, mask


def _np_lsm(params, prompt, pmask, tokens):
  seq, pos = step_lib.sequence_inputs(jnp.asarray(prompt), jnp.asarray(pmask), jnp.asarray(tokens))
  logits, _ = forward(params, seq, pos, config=CONFIG, return_logits=True)
  z = np.asarray(logits, np.float64)
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_self_certainty_pass(params):
  prompt, pmask, tokens, mask = _batch()
  fn = model_rewards.make_model_reward_fn(model_config=CONFIG, kind="self_certainty")
  out = fn(params, prompt, pmask, jnp.asarray(tokens), jnp.asarray(mask), None, None, None)
  lsm = _np_lsm(params, prompt, pmask, tokens)[:, S_PROMPT - 1 : S_PROMPT - 1 + T]
  kl = -np.log(CONFIG.vocab_size) - lsm.mean(-1)
  want = [kl[b][mask[b]].mean() for b in range(B)]
  np.testing.assert_allclose(out["model_reward"], want, atol=2e-5)


def test_rlpr_pass_with_marker(params):
  prompt, pmask, tokens, mask = _batch()
  # Each reference starts with the marker (spliced, not scored).
  ref = np.array([[250, 7, 8, 0], [250, 9, 0, 0], [250, 10, 11, 12], [250, 13, 0, 0]], np.int32)
  ref_mask = ref > 0
  fmt = jnp.array([1.0, 0.0, 1.0, 1.0])
  fn = model_rewards.make_model_reward_fn(
    model_config=CONFIG, kind="rlpr", marker_ids=(250,), format_coef=0.1
  )
  out = fn(params, prompt, pmask, jnp.asarray(tokens), jnp.asarray(mask), ref, ref_mask, fmt)

  def mean_prob(keep):
    probs = []
    for b in range(B):
      seq = np.zeros(T + 4, np.int32)
      n = ref_mask[b].sum()
      seq[: keep[b]] = tokens[b, : keep[b]]
      seq[keep[b] : keep[b] + n] = ref[b, :n]
      lsm = _np_lsm(params, prompt[b : b + 1], pmask[b : b + 1], seq[None])[0]
      q = [lsm[S_PROMPT - 1 + keep[b] + j, ref[b, j]] for j in range(1, n)]  # not the marker
      probs.append(np.exp(q).mean())
    return np.array(probs)

  keep = np.array([2, 3, 4, 2])  # the marker in row 0, else the whole completion
  with_z, without = mean_prob(keep), mean_prob(np.zeros(B, int))
  np.testing.assert_allclose(out["mean_prob"], with_z, rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(out["mean_prob_no_reasoning"], without, rtol=1e-4, atol=1e-7)
  want = 0.9 * np.maximum(0.0, with_z - without) + 0.1 * np.asarray(fmt)
  np.testing.assert_allclose(out["model_reward"], want, rtol=1e-4, atol=1e-7)


def test_prm_step_is_one_sgd_step_on_the_bce_loss(params):
  prompt, pmask, tokens, mask = _batch()
  seq, pos = step_lib.sequence_inputs(jnp.asarray(prompt), jnp.asarray(pmask), jnp.asarray(tokens))
  m = jnp.asarray(mask)
  ref_logp, _ = step_lib.completion_logprobs(
    params, seq, pos, num_completion=T, model_config=CONFIG, temperature=1.0, chunk_size=128
  )
  labels = jnp.array([1.0, 0.0, np.nan, 1.0])
  prm = jax.tree.map(lambda x: x * 1.02, params)
  opt = optax.sgd(0.3)
  step = implicit_prm.make_prm_step(model_config=CONFIG, optimizer=opt, beta=0.05, temperature=1.0)

  def loss(p):
    logp, _ = step_lib.completion_logprobs(
      p, seq, pos, num_completion=T, model_config=CONFIG, temperature=1.0, chunk_size=128
    )
    return losses.implicit_prm_loss(logp, ref_logp, m, labels, num_seqs=3.0, beta=0.05)[0]

  want = jax.tree.map(lambda w, g: w - 0.3 * g, prm, jax.grad(loss)(prm))
  copy = jax.tree.map(jnp.copy, prm)
  new, _, metrics = step(copy, opt.init(copy), seq, pos, m, ref_logp, labels)
  for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-6)
  assert float(metrics["prm/skipped"]) == 0.0
  assert np.isfinite(float(metrics["prm/loss"]))


def test_reference_ids_put_the_marker_before_the_answer():
  class Tok:
    def encode(self, text, add_special_tokens=False):
      return [ord(ch) for ch in text]

  ids, mask = model_rewards.reference_ids(Tok(), ["75", "5"], pad_id=0, prefix=(62,))
  np.testing.assert_array_equal(ids, [[62, 55, 53], [62, 53, 0]])
  np.testing.assert_array_equal(mask, [[True, True, True], [True, True, False]])
