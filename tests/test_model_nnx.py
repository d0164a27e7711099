"""NNX adapter: the params pytree is a plain dict, forward/grad equal the NNX module's own."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

nnx = pytest.importorskip("flax.nnx")

from rlvr_jax.model import NNXAdapter  # noqa: E402


class TinyLM(nnx.Module):
  def __init__(self, vocab, dim, rngs):
    self.embed = nnx.Embed(vocab, dim, rngs=rngs)
    self.proj = nnx.Linear(dim, dim, rngs=rngs)
    self.pos_scale = nnx.Param(jnp.full((dim,), 0.1))
    self.calls = nnx.Variable(jnp.zeros((), jnp.int32))  # non-trainable state

  def __call__(self, tokens, positions):
    x = self.embed(tokens) + positions[..., None].astype(jnp.float32) * self.pos_scale[...]
    return jnp.tanh(self.proj(x))  # hidden states [B, S, D]


def _setup():
  model = TinyLM(11, 8, nnx.Rngs(0))
  tokens = jnp.array([[1, 2, 3], [4, 5, 6]], jnp.int32)
  positions = jnp.array([[0, 1, 2], [-1, 0, 1]], jnp.int32)
  adapter = NNXAdapter(model, unembed=lambda m: m.embed.embedding[...].T)
  return model, adapter, tokens, positions


def test_params_are_plain_dict_and_forward_matches():
  model, adapter, tokens, positions = _setup()
  assert isinstance(adapter.params, dict) and set(adapter.params) == {"embed", "proj", "pos_scale"}
  assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(adapter.params))
  assert "calls" not in adapter.params
  hidden = model(tokens, positions)
  ref_logits = np.asarray(hidden, np.float64) @ np.asarray(model.embed.embedding[...], np.float64).T
  out, cache = jax.jit(lambda p: adapter.forward(p, tokens, positions))(adapter.params)
  assert cache is None
  np.testing.assert_allclose(np.asarray(out), np.asarray(hidden), atol=1e-6)
  logits, _ = jax.jit(lambda p: adapter.forward(p, tokens, positions, return_logits=True))(
    adapter.params
  )
  np.testing.assert_allclose(np.asarray(logits), ref_logits, atol=1e-5)
  np.testing.assert_allclose(
    np.asarray(adapter.logits_from_hidden(adapter.params, out)), ref_logits, atol=1e-5
  )
  with pytest.raises(NotImplementedError, match="no KV cache"):
    adapter.forward(adapter.params, tokens, positions, cache=object())


def test_grads_and_optax_update_match_nnx():
  model, adapter, tokens, positions = _setup()

  def loss_params(p):
    logits, _ = adapter.forward(p, tokens, positions, return_logits=True)
    return jnp.mean(jax.nn.logsumexp(logits, -1))

  def loss_module(m):
    logits = m(tokens, positions) @ m.embed.embedding[...].T
    return jnp.mean(jax.nn.logsumexp(logits, -1))

  grads = jax.grad(loss_params)(adapter.params)
  ref = nnx.grad(loss_module)(model).to_pure_dict()
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
  # an optax step on the plain pytree, merged back, changes the module's output as expected
  opt = optax.sgd(0.5)
  updates, _ = opt.update(grads, opt.init(adapter.params))
  new_params = optax.apply_updates(adapter.params, updates)
  merged = adapter.merge(new_params)
  assert loss_module(merged) < loss_module(model)
  np.testing.assert_allclose(
    np.asarray(merged.proj.kernel[...]),
    np.asarray(model.proj.kernel[...]) - 0.5 * np.asarray(grads["proj"]["kernel"]),
    atol=1e-6,
  )
