"""io_callback adapter: host rewards (through the process-pool runtime) from inside jax.jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import rewards
from rlvr_jax.reward_callback import make_reward_callback

VOCAB = "0123456789+-*/ \\{}boxed"


def decode(ids: np.ndarray) -> str:
  return "".join(VOCAB[int(i)] for i in ids)


def encode(text: str) -> list[int]:
  return [VOCAB.index(c) for c in text]


def _batch(texts, width=16):
  tokens = np.zeros((len(texts), width), np.int32)
  for b, text in enumerate(texts):
    tokens[b, : len(text)] = encode(text)
  return jnp.asarray(tokens), jnp.asarray([len(t) for t in texts], jnp.int32)


@pytest.mark.parametrize("use_runtime", [False, True])
def test_reward_callback_under_jit(use_runtime):
  examples = [{"prompt_text": "1+1", "answer": "2"}, {"prompt_text": "2*3", "answer": "6"}]
  texts = ["\\boxed{2}", "2 1 3", "\\boxed{6}", "5 5 5"]  # group-ordered: P=2, G=2
  tokens, lengths = _batch(texts)
  example_ids = jnp.asarray([0, 0, 1, 1], jnp.int32)
  reward_fn = rewards.CombinedReward(
    {"math": rewards.MathReward(), "overlong": rewards.OverlongReward(max_len=8, buffer_len=4)}
  )
  runtime = rewards.RewardRuntime(num_workers=1, timeout_s=20.0) if use_runtime else None
  try:
    callback = make_reward_callback(
      reward_fn, decode_fn=decode, examples=examples, runtime=runtime, group_size=2
    )

    @jax.jit
    def centred(tokens, lengths, example_ids):
      r = callback(tokens, lengths, example_ids).reshape(2, 2)
      return r - r.mean(-1, keepdims=True)

    out = np.asarray(centred(tokens, lengths, example_ids))
  finally:
    if runtime is not None:
      runtime.close()
  # Lengths 9, 5, 9, 5 tokens: overlong penalty min(0, -(n - 4) / 4) = -1.25, -0.25.
  # Correct: rows 0 and 2 (boxed 2 and 6); "2 1 3" -> 3 and "5 5 5" -> 5 are wrong.
  expected = np.array([[1 - 1.25, 0 - 0.25], [1 - 1.25, 0 - 0.25]])
  np.testing.assert_allclose(out, expected - expected.mean(-1, keepdims=True), atol=1e-6)
  assert callback.last_result.rewards.shape == (4,)


def test_reward_callback_shape_errors():
  callback = make_reward_callback(rewards.MathReward(), decode_fn=decode, examples=[{"answer": 1}])
  with pytest.raises(ValueError, match=r"lengths \(3,\).*\[B\]=\(2,\)"):
    callback(jnp.zeros((2, 4), jnp.int32), jnp.zeros((3,), jnp.int32), jnp.zeros((2,), jnp.int32))
