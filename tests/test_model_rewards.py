"""Model-side rewards (self-certainty, reference likelihood / RLPR, LaSeR) and the auxiliary losses
(PRIME's implicit PRM, LaSeR): METHODS.md goldens, a tiny random model against NumPy float64
references from full logits, gradients, micro-batch and 8-device invariance, and the implicit
PRM's update against a hand-computed cross-entropy step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as PS

from rlvr_jax import logprobs, losses
from rlvr_jax.model import ModelConfig, forward, init_params, unembed_matrix

CONFIG = ModelConfig.tiny()
B, S_PROMPT, T = 8, 5, 6


@pytest.fixture(scope="module")
def params():
  p = init_params(CONFIG, jax.random.key(0))
  return dict(p, lm_head=p["lm_head"] * 10.0)


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  prompt_len = rng.integers(1, S_PROMPT + 1, B)
  prompt_mask = np.arange(S_PROMPT)[None, :] >= (S_PROMPT - prompt_len)[:, None]
  prompt = np.where(prompt_mask, rng.integers(3, CONFIG.vocab_size, (B, S_PROMPT)), 0)
  lengths = rng.integers(1, T + 1, B)
  mask = np.arange(T)[None, :] < lengths[:, None]
  tokens = np.where(mask, rng.integers(3, CONFIG.vocab_size, (B, T)), 0)
  return prompt.astype(np.int32), prompt_mask, tokens.astype(np.int32), mask


def _inputs(prompt, prompt_mask, tokens):
  """tokens [B, S], positions [B, S] for prompt ++ completion (as the trainer builds them)."""
  pos_p = np.where(prompt_mask, np.cumsum(prompt_mask, 1) - 1, -1)
  pos_c = prompt_mask.sum(1)[:, None] + np.arange(tokens.shape[1])[None, :]
  seq = np.concatenate([prompt, tokens], 1)
  return jnp.asarray(seq), jnp.asarray(np.concatenate([pos_p, pos_c], 1).astype(np.int32))


def _hidden(params, prompt, prompt_mask, tokens):
  """(predicting states [B, T, D], states at the tokens [B, T, D], full logits [B, S, V])."""
  seq, pos = _inputs(prompt, prompt_mask, tokens)
  h, _ = forward(params, seq, pos, config=CONFIG)
  logits, _ = forward(params, seq, pos, config=CONFIG, return_logits=True)
  s, t = seq.shape[1], tokens.shape[1]
  return h[:, s - t - 1 : s - 1], h[:, s - t :], np.asarray(logits, np.float64)


def _np_log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


# ----------------------------------------------------------------------------------------------
# Self-certainty.


def test_self_certainty_golden():
  logits = jnp.array([[[2.0, 1.0, 0.0]]])
  stats = logprobs.token_stats_from_logits(
    logits, jnp.zeros((1, 1), jnp.int32), compute_mean_log_softmax=True
  )
  mask = jnp.ones((1, 1), bool)
  sc = logprobs.self_certainty(stats.mean_log_softmax, mask, vocab_size=3)
  ref = logprobs.self_certainty(stats.mean_log_softmax, mask, vocab_size=3, kl_form=False)
  np.testing.assert_allclose(sc, [0.308994], atol=1e-6)
  np.testing.assert_allclose(ref, [1.407606], atol=1e-6)
  p = np.exp(_np_log_softmax(np.array([2.0, 1.0, 0.0])))
  np.testing.assert_allclose(sc, [np.sum(np.log((1 / 3) / p)) / 3], atol=1e-6)


def test_self_certainty_on_tiny_model_matches_full_logits(params):
  prompt, pmask, tokens, mask = _batch()
  h, _, logits = _hidden(params, prompt, pmask, tokens)
  unembed = unembed_matrix(params, CONFIG)
  got = logprobs.self_certainty_from_hidden(h, unembed, jnp.asarray(tokens), jnp.asarray(mask))
  # NumPy: KL(U || p_t) = -log V - mean_v log p_t(v), averaged over valid tokens.
  lsm = _np_log_softmax(logits[:, S_PROMPT - 1 : S_PROMPT - 1 + T])
  kl = -np.log(CONFIG.vocab_size) - lsm.mean(-1)
  want = np.array([kl[b][mask[b]].mean() for b in range(B)])
  np.testing.assert_allclose(got, want, atol=2e-5)
  # Tiling and micro-batching do not change it.
  tiled = logprobs.self_certainty_from_hidden(
    h, unembed, jnp.asarray(tokens), jnp.asarray(mask), chunk_size=5, vocab_chunk_size=48
  )
  halves = [
    logprobs.self_certainty_from_hidden(
      h[i : i + 4], unembed, jnp.asarray(tokens[i : i + 4]), jnp.asarray(mask[i : i + 4])
    )
    for i in (0, 4)
  ]
  np.testing.assert_allclose(tiled, got, atol=1e-5)
  np.testing.assert_allclose(np.concatenate(halves), got, atol=1e-5)


# ----------------------------------------------------------------------------------------------
# Splicing, reference likelihood, RLPR.


def test_find_marker_and_splice_match_loops():
  rng = np.random.default_rng(1)
  tokens = rng.integers(3, 9, (B, T)).astype(np.int32)
  mask = np.arange(T)[None, :] < rng.integers(0, T + 1, B)[:, None]
  tokens[0, 2:4] = [7, 8]
  marker = (7, 8)
  first = logprobs.find_marker(jnp.asarray(tokens), jnp.asarray(mask), marker)
  for b in range(B):
    n = mask[b].sum()
    hits = [t for t in range(n - 1) if tuple(tokens[b, t : t + 2]) == marker]
    assert first[b] == (hits[0] if hits else n), b
  ref = rng.integers(3, 9, (B, 3)).astype(np.int32)
  ref_mask = np.arange(3)[None, :] < rng.integers(1, 4, B)[:, None]
  score = ref_mask.copy()
  score[:, 0] = False  # a leading marker that is spliced but not scored
  out = logprobs.splice_reference(
    jnp.asarray(tokens),
    first,
    jnp.asarray(ref),
    jnp.asarray(ref_mask),
    score_mask=jnp.asarray(score),
    pad_id=0,
  )
  for b in range(B):
    k, n_ref = int(first[b]), int(ref_mask[b].sum())
    want = np.zeros(T + 3, np.int32)
    want[:k] = tokens[b, :k]
    want[k : k + n_ref] = ref[b, :n_ref]
    np.testing.assert_array_equal(out.tokens[b], want)
    np.testing.assert_array_equal(out.completion_mask[b], np.arange(T + 3) < k + n_ref)
    want_score = np.zeros(T + 3, bool)
    want_score[k : k + n_ref] = score[b, :n_ref]
    np.testing.assert_array_equal(out.score_mask[b], want_score)


def test_reference_likelihood_and_rlpr_golden():
  logp = jnp.log(jnp.array([[0.9, 0.5, 0.7, 0.1], [0.6, 0.3, 0.6, 0.1]]))
  score = jnp.array([[1, 1, 1, 0], [1, 1, 1, 0]], bool)
  lik = logprobs.reference_likelihood(logp, score)
  np.testing.assert_allclose(lik.mean_prob, [0.7, 0.5], atol=1e-6)
  np.testing.assert_allclose(lik.sum_logp[0], -1.155183, atol=1e-6)
  np.testing.assert_allclose(lik.mean_logp[0], -0.385061, atol=1e-6)
  r = logprobs.rlpr_reward(lik.mean_prob[:1], lik.mean_prob[1:], format_reward=jnp.ones(1))
  np.testing.assert_allclose(r, [0.28], atol=1e-6)
  np.testing.assert_allclose(logprobs.rlpr_reward(lik.mean_prob[1:], lik.mean_prob[:1]), [0.0])


def test_reference_likelihood_on_tiny_model(params):
  """Score [x, z_b, y*] through the model; compare with NumPy log-softmax of the full logits of
  the explicitly concatenated sequence."""
  prompt, pmask, tokens, mask = _batch(2)
  rng = np.random.default_rng(5)
  ref = rng.integers(3, CONFIG.vocab_size, (B, 3)).astype(np.int32)
  ref_mask = np.arange(3)[None, :] < rng.integers(1, 4, B)[:, None]
  keep = jnp.asarray(rng.integers(0, mask.sum(1) + 1))
  spliced = logprobs.splice_reference(
    jnp.asarray(tokens), keep, jnp.asarray(ref), jnp.asarray(ref_mask)
  )
  h, _, logits = _hidden(params, prompt, pmask, np.asarray(spliced.tokens))
  unembed = unembed_matrix(params, CONFIG)
  logp, _ = logprobs.token_logprobs_from_hidden(h, unembed, spliced.tokens, compute_entropy=False)
  lik = logprobs.reference_likelihood(logp, spliced.score_mask)
  width = spliced.tokens.shape[1]
  lsm = _np_log_softmax(logits[:, S_PROMPT - 1 : S_PROMPT - 1 + width])
  for b in range(B):
    k, n = int(keep[b]), int(ref_mask[b].sum())
    q = np.array([lsm[b, k + j, ref[b, j]] for j in range(n)])
    np.testing.assert_allclose(lik.mean_prob[b], np.exp(q).mean(), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(lik.sum_logp[b], q.sum(), atol=1e-4)


# ----------------------------------------------------------------------------------------------
# LaSeR.


def test_laser_self_reward_and_loss_gradient(params):
  prompt, pmask, tokens, mask = _batch(3)
  _, h_at, logits = _hidden(params, prompt, pmask, tokens)
  unembed = unembed_matrix(params, CONFIG)
  z_c = 17
  last = logprobs.last_token_hidden(h_at, jnp.asarray(mask))
  logp = logprobs.next_token_logprob(last, unembed, z_c)
  lengths = mask.sum(1)
  lsm = _np_log_softmax(logits)
  want = np.array([lsm[b, S_PROMPT + lengths[b] - 1, z_c] for b in range(B)])
  np.testing.assert_allclose(logp, want, atol=1e-4)
  r_s = logprobs.last_token_self_reward(logp, beta=0.1, ref_logp=-5.0)
  np.testing.assert_allclose(r_s, 0.1 * (want + 5.0), atol=1e-5)

  verifier = jnp.asarray(np.r_[np.ones(4), np.zeros(3), np.nan].astype(np.float32))

  def loss_of(lp):
    return losses.laser_self_reward_loss(
      lp, verifier, num_seqs=7.0, beta=0.1, ref_logp=-5.0, coef=0.5
    )[0]

  g = jax.grad(loss_of)(logp)
  ok = np.isfinite(np.asarray(verifier))
  want_g = np.where(ok, 2 * 0.5 * 0.1 * (np.asarray(r_s) - np.nan_to_num(verifier)) / 7.0, 0.0)
  np.testing.assert_allclose(g, want_g, atol=1e-6)

  # Through the tiled sweep: gradient w.r.t. the states equals autodiff of a plain log-softmax.
  def via_tiles(hl):
    return loss_of(logprobs.next_token_logprob(hl, unembed, z_c, vocab_chunk_size=64))

  def via_dense(hl):
    return loss_of(jax.nn.log_softmax(hl @ unembed, axis=-1)[:, z_c])

  np.testing.assert_allclose(jax.grad(via_tiles)(last), jax.grad(via_dense)(last), atol=1e-5)


# ----------------------------------------------------------------------------------------------
# PRIME implicit PRM.


def test_implicit_prm_loss_golden_and_gradient():
  prm = jnp.array([[-1.0, -0.5, -2.0], [-0.3, -0.2, -9.0]])
  ref = jnp.array([[-1.2, -0.5, -1.0], [-0.5, -0.4, 0.0]])
  mask = jnp.array([[1, 1, 1], [1, 1, 0]], bool)
  labels = jnp.array([1.0, 0.0])
  loss, metrics = losses.implicit_prm_loss(prm, ref, mask, labels, num_seqs=2.0, beta=0.05)
  s = np.array([-0.04, 0.02])  # β Σ (log π_φ − log π_ref): golden −0.04 of §5.8, then 0.05·0.4
  want = (np.log1p(np.exp(-s[0])) + np.log1p(np.exp(s[1]))) / 2
  np.testing.assert_allclose(loss, want, atol=1e-6)
  g = jax.grad(lambda lp: losses.implicit_prm_loss(lp, ref, mask, labels, num_seqs=2.0)[0])(prm)
  sig = 1 / (1 + np.exp(-s))
  want_g = 0.05 * (sig - np.array([1.0, 0.0]))[:, None] * np.asarray(mask) / 2.0
  np.testing.assert_allclose(g, want_g, atol=1e-7)
  fin = losses.finalize_metrics(metrics)
  np.testing.assert_allclose(fin["prm/accuracy"], 0.0)  # s < 0 for y = 1, s > 0 for y = 0


def test_implicit_prm_head_update_is_a_hand_computed_cross_entropy_step(params):
  """Fast version with φ = the unembedding (states fixed): one SGD step on the BCE loss equals
  W − lr Σ_{b,t} c_b m_{b,t} h_{b,t} (e_{y_{b,t}} − π_{b,t})ᵀ (∂ log π(y)/∂z = e_y − π) with c_b = β (σ(s_b) − y_b) / N
  (the softmax cross-entropy derivative written out by hand), also summed over micro-batches."""
  prompt, pmask, tokens, mask = _batch(4)
  h, _, _ = _hidden(params, prompt, pmask, tokens)
  w0 = unembed_matrix(params, CONFIG)
  y_tok, m = jnp.asarray(tokens), jnp.asarray(mask)
  ref_logp, _ = logprobs.token_logprobs_from_hidden(h, w0, y_tok, compute_entropy=False)
  phi = w0 * 1.1
  labels = jnp.asarray(np.r_[1, 0, 1, 1, 0, 0, 1, 0].astype(np.float32))

  def loss(w, rows):
    lp, _ = logprobs.token_logprobs_from_hidden(
      h[rows], w, y_tok[rows], compute_entropy=False, chunk_size=4, vocab_chunk_size=64
    )
    return losses.implicit_prm_loss(lp, ref_logp[rows], m[rows], labels[rows], num_seqs=8.0)[0]

  lr = 2.0
  grad = jax.grad(loss)(phi, slice(None))
  hn, wn = np.asarray(h, np.float64), np.asarray(phi, np.float64)
  lsm = _np_log_softmax(hn @ wn)
  lp = np.take_along_axis(lsm, tokens[..., None], -1)[..., 0]
  score = 0.05 * np.where(mask, lp - np.asarray(ref_logp), 0.0).sum(1)
  coef = 0.05 * (1 / (1 + np.exp(-score)) - np.asarray(labels)) / 8.0
  dz = (np.eye(CONFIG.vocab_size)[tokens] - np.exp(lsm)) * (coef[:, None] * mask)[..., None]
  hand = np.einsum("btd,btv->dv", hn, dz)
  np.testing.assert_allclose(phi - lr * grad, wn - lr * hand, atol=1e-5)
  parts = jax.grad(loss)(phi, slice(0, 4)) + jax.grad(loss)(phi, slice(4, 8))
  np.testing.assert_allclose(parts, grad, atol=1e-6)


@pytest.mark.slow
def test_implicit_prm_update_is_a_hand_computed_cross_entropy_step(params):
  """One SGD step of the PRM tree φ on the BCE loss equals φ − lr Σ_b c_b Σ_t m ∇φ log π_φ with
  c_b = β (σ(s_b) − y_b) / N; and summing micro-batch partial gradients gives the same step."""
  prompt, pmask, tokens, mask = _batch(4)
  seq, pos = _inputs(prompt, pmask, tokens)
  unembed_ref = unembed_matrix(params, CONFIG)
  h_ref, _ = forward(params, seq, pos, config=CONFIG)
  s = seq.shape[1]
  ref_logp, _ = logprobs.token_logprobs_from_hidden(
    h_ref[:, s - T - 1 : s - 1], unembed_ref, seq[:, s - T :], compute_entropy=False
  )
  phi = jax.tree.map(lambda x: x * 1.05, params)  # a PRM that differs from the reference
  labels = jnp.asarray(np.r_[1, 0, 1, 1, 0, 0, 1, 0].astype(np.float32))
  m = jnp.asarray(mask)

  def logp_of(p, seq, pos):
    h, _ = forward(p, seq, pos, config=CONFIG)
    lp, _ = logprobs.token_logprobs_from_hidden(
      h[:, s - T - 1 : s - 1], unembed_matrix(p, CONFIG), seq[:, s - T :], compute_entropy=False
    )
    return lp

  @jax.jit
  def grad_of(p, seq, pos, ref, m, y):
    def loss(p):
      lp = logp_of(p, seq, pos)
      return losses.implicit_prm_loss(lp, ref, m, y, num_seqs=float(B), beta=0.05)[0]

    return jax.grad(loss)(p)

  lr = 0.5
  grad = grad_of(phi, seq, pos, ref_logp, m, labels)
  step = jax.tree.map(lambda w, g: w - lr * g, phi, grad)
  # Hand: the BCE derivative per row, pushed back through the log-probs with a VJP.
  lp, vjp = jax.vjp(lambda p: logp_of(p, seq, pos), phi)
  score = 0.05 * np.sum(np.where(mask, np.asarray(lp) - np.asarray(ref_logp), 0.0), axis=1)
  coef = 0.05 * (1 / (1 + np.exp(-score)) - np.asarray(labels)) / B
  (hand,) = jax.jit(vjp)(jnp.asarray(coef[:, None] * mask, jnp.float32))
  hand_step = jax.tree.map(lambda w, g: w - lr * g, phi, hand)
  for a, b in zip(jax.tree.leaves(step), jax.tree.leaves(hand_step), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-6)
  # Micro-batches of 4 rows with the global normaliser: partial gradients sum to the same.
  parts = [
    grad_of(
      phi, seq[i : i + 4], pos[i : i + 4], ref_logp[i : i + 4], m[i : i + 4], labels[i : i + 4]
    )
    for i in (0, 4)
  ]
  summed = jax.tree.map(lambda a, b: a + b, *parts)
  for a, b in zip(jax.tree.leaves(summed), jax.tree.leaves(grad), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_model_rewards_on_8_devices_equal_one_device(params):
  prompt, pmask, tokens, mask = _batch(6)
  h, h_at, _ = _hidden(params, prompt, pmask, tokens)
  unembed = unembed_matrix(params, CONFIG)
  labels = jnp.asarray(np.r_[1, 0, 1, 1, 0, 0, 1, 0].astype(np.float32))

  def run(h, h_at, tokens, mask, labels):
    sc = logprobs.self_certainty_from_hidden(h, unembed, tokens, mask)
    lp = logprobs.next_token_logprob(logprobs.last_token_hidden(h_at, mask), unembed, 5)
    logp, _ = logprobs.token_logprobs_from_hidden(h, unembed, tokens, compute_entropy=False)
    prm, _ = losses.implicit_prm_loss(logp, logp * 0.9, mask, labels, num_seqs=8.0)
    laser, _ = losses.laser_self_reward_loss(lp, labels, num_seqs=8.0)
    return sc, lp, prm, laser

  args = (h, h_at, jnp.asarray(tokens), jnp.asarray(mask), labels)
  want = jax.jit(run)(*args)
  mesh = jax.make_mesh((8,), ("data",))
  put = lambda x: jax.device_put(x, NamedSharding(mesh, PS("data", *([None] * (x.ndim - 1)))))
  got = jax.jit(run)(*(put(a) for a in args))
  for a, b in zip(got, want, strict=True):
    np.testing.assert_allclose(a, b, atol=1e-5)
