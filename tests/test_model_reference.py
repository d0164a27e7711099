"""The float64 NumPy reference decoder (``rlvr_jax.model.reference``) agrees with ``forward`` on tiny
random Llama / Qwen2 / Qwen3 models, with left padding on the ``forward`` side: it is the truth the
slow SmolLM2 parity test measures the sampler and the trainer against."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.model import ModelConfig, forward, init_params
from rlvr_jax.model.reference import token_logprobs_f64


def _perturbed(config, seed):
  """Random params with O(1) norms and non-zero biases (init_params sets them to 1 and 0)."""
  params = init_params(config, jax.random.key(seed))
  rng = np.random.default_rng(seed)

  def jitter(path, a):
    name = jax.tree_util.keystr(path)
    noise = rng.standard_normal(a.shape).astype(np.float32)
    if "norm" in name:
      return a + 0.2 * noise
    if name.endswith("['bq']") or name.endswith("['bk']") or name.endswith("['bv']"):
      return a + 0.1 * noise
    return a * 5.0  # std 0.1: less uniform next-token distributions

  return jax.tree_util.tree_map_with_path(jitter, params)


@pytest.mark.parametrize(
  "family", [{}, {"attention_bias": True}, {"qk_norm": True, "tie_word_embeddings": True}]
)
def test_reference_matches_forward(family):
  config = ModelConfig.tiny(**family)
  params = _perturbed(config, seed=len(family))
  rng = np.random.default_rng(0)
  lengths, S = [5, 9, 12], 12
  sequences = [rng.integers(3, config.vocab_size, n) for n in lengths]
  starts = [2, 4, 1]
  tokens = np.zeros((3, S), np.int32)
  positions = np.full((3, S), -1, np.int32)
  for i, ids in enumerate(sequences):  # left padding
    tokens[i, S - len(ids) :] = ids
    positions[i, S - len(ids) :] = np.arange(len(ids))
  logits, _ = forward(
    params, jnp.asarray(tokens), jnp.asarray(positions), config=config, return_logits=True
  )
  logp = np.asarray(jax.nn.log_softmax(logits, axis=-1), np.float64)
  truth = token_logprobs_f64(params, config, sequences, starts)
  for i, (ids, start) in enumerate(zip(sequences, starts, strict=True)):
    pad = S - len(ids)
    rows = np.arange(pad + start - 1, S - 1)
    ours = logp[i, rows, ids[start:]]
    assert np.abs(ours - truth[i]).max() <= 1e-5, (family, i, np.abs(ours - truth[i]).max())
  # The check can fail: a wrong weight in the reference is far outside that tolerance.
  broken = jax.tree.map(lambda a: a, params)
  broken["final_norm"] = params["final_norm"] * 1.01
  off = token_logprobs_f64(broken, config, sequences, starts)
  assert max(np.abs(a - b).max() for a, b in zip(off, truth, strict=True)) > 1e-3


def test_reference_rejects_bad_starts():
  config = ModelConfig.tiny()
  params = init_params(config, jax.random.key(0))
  with pytest.raises(ValueError, match="sequence 1: start 0"):
    token_logprobs_f64(params, config, [np.arange(4), np.arange(3)], [1, 0])
  with pytest.raises(ValueError, match="2 sequences but 1 starts"):
    token_logprobs_f64(params, config, [np.arange(4), np.arange(3)], [1])
