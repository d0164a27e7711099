"""Greedy decoding equals transformers' ``generate`` token for token: a tiny random Llama checkpoint
(fast) and the real SmolLM2-135M-Instruct (slow). Rows are left-padded and finish at different
times (eos), so padding, stop handling and per-row positions are compared too."""

import os

import jax
import numpy as np
import pytest

from rlvr_jax.model import load_hf
from rlvr_jax.sampling import Greedy, generate, logprob_parity

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _hf_greedy(model, tokens, mask, *, max_new_tokens, eos, pad):
  """transformers' greedy generate; returns the new tokens [B, max_new_tokens] (pad-filled)."""
  with torch.no_grad():
    out = model.generate(
      input_ids=torch.tensor(np.asarray(tokens), dtype=torch.long),
      attention_mask=torch.tensor(np.asarray(mask), dtype=torch.long),
      do_sample=False,
      max_new_tokens=max_new_tokens,
      min_new_tokens=0,
      eos_token_id=list(eos) if eos else None,
      pad_token_id=pad,
    )
  new = out[:, tokens.shape[1] :].numpy()
  return np.pad(new, ((0, 0), (0, max_new_tokens - new.shape[1])), constant_values=pad)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
  """A tiny random Llama with O(1) weights (sharp next-token distributions, no near-ties)."""
  torch.manual_seed(0)
  config = transformers.LlamaConfig(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    rope_theta=1e4,
    tie_word_embeddings=False,
  )
  model = transformers.LlamaForCausalLM(config).float().eval()
  gen = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      p.copy_(1 + 0.1 * noise if "norm" in name else 0.2 * noise)
  folder = tmp_path_factory.mktemp("tiny_llama")
  model.save_pretrained(folder)
  params, cfg = load_hf(str(folder))
  return model, params, cfg


def test_tiny_llama_greedy_equals_transformers_generate(tiny_llama):
  model, params, config = tiny_llama
  rng = np.random.default_rng(0)
  lengths = np.array([3, 9, 6, 1])
  tokens = rng.integers(3, config.vocab_size, (4, 9)).astype(np.int32)
  mask = np.arange(9)[None, :] >= (9 - lengths)[:, None]
  tokens[~mask] = 0
  T = 24

  def ours(stops):
    return generate(
      params,
      tokens,
      mask,
      config=config,
      num_samples=1,
      strategy=Greedy(),
      key=jax.random.key(0),
      max_new_tokens=T,
      stop_tokens=stops,
      pad_id=0,
    )

  free = _hf_greedy(model, tokens, mask, max_new_tokens=T, eos=(), pad=0)
  rollout = ours(())
  np.testing.assert_array_equal(np.asarray(rollout.tokens), free)
  # Stop ids taken from the middle of two rows: rows now end at different steps.
  stops = (int(free[0, 5]), int(free[2, 11]))
  expected = _hf_greedy(model, tokens, mask, max_new_tokens=T, eos=stops, pad=0)
  rollout = ours(stops)
  np.testing.assert_array_equal(np.asarray(rollout.tokens), expected)
  lengths = np.asarray(rollout.lengths)
  assert lengths[0] <= 6 and lengths[2] <= 12 and len(set(lengths.tolist())) >= 2
  gaps = logprob_parity(params, rollout, config=config, strategy=Greedy())
  assert float(gaps["model_logp_gap/max"]) <= 1e-5


@pytest.mark.slow
def test_smollm2_greedy_equals_transformers_generate():
  """SmolLM2-135M-Instruct (GGUF dequantised) on chat prompts: same greedy tokens as transformers
  loading the same GGUF."""
  from rlvr_jax.model import load_smollm2
  from rlvr_jax.model.smollm2 import smollm2_gguf_path

  params, config, tokenizer = load_smollm2()
  folder, name = os.path.split(smollm2_gguf_path())
  model = transformers.AutoModelForCausalLM.from_pretrained(
    folder, gguf_file=name, dtype=torch.float32, local_files_only=True
  ).eval()
  prompts = [
    [{"role": "user", "content": "What is 12 + 7? Answer with a number."}],
    [{"role": "user", "content": "Name the capital of France."}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
  ]
  tokens, mask = tokenizer.encode_batch(tokenizer.apply_chat_template(prompts))
  tokens, mask = np.asarray(tokens), np.asarray(mask)
  T = 40
  rollout = generate(
    params,
    tokens,
    mask,
    config=config,
    num_samples=1,
    strategy=Greedy(),
    key=jax.random.key(0),
    max_new_tokens=T,
    pad_id=tokenizer.pad_id,
  )
  expected = _hf_greedy(
    model, tokens, mask, max_new_tokens=T, eos=tokenizer.eos_ids, pad=tokenizer.pad_id
  )
  np.testing.assert_array_equal(np.asarray(rollout.tokens), expected)
  assert np.asarray(rollout.finished).any()  # at least one short answer ended with <|im_end|>
  gaps = logprob_parity(params, rollout, config=config, strategy=Greedy())
  assert float(gaps["model_logp_gap/max"]) <= 1e-4
