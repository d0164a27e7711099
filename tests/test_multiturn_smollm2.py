"""SmolLM2-135M-Instruct through the multi-turn sampler (slow): chat-template observations
appended to the KV cache, the trainer's log-probs of the interleaved stream within the SmolLM2
parity bound of tests/test_parity_smollm2.py, and a GEM game played to its end."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import envs
from rlvr_jax.model import load_smollm2
from rlvr_jax.sampling import Temperature
from rlvr_jax.sampling.multiturn_rollout import rollout_episodes
from rlvr_jax.train import step as step_lib

pytest.importorskip("gem")


def _play(params, config, tok, spec, *, max_turns):
  with envs.EnvPool(spec, num_workers=2, reset_timeout_s=120.0) as pool:
    return rollout_episodes(
      params, pool, envs.ChatRenderer(tok), config=config, strategy=Temperature(0.7),
      key=jax.random.key(0), seeds=[0, 0, 1, 1], decode=lambda ids: tok.decode(ids),
      max_tokens=160, turn_tokens=24, stop_sequences=[[i] for i in tok.eos_ids],
      pad_id=tok.pad_id, eos_ids=tok.eos_ids, max_turns=max_turns, prompt_ids=[0, 0, 1, 1],
      sample_ids=[0, 1, 0, 1], chunk_steps=8,
    )  # fmt: skip


@pytest.mark.slow
def test_smollm2_multiturn_chat_episodes_keep_parity():
  params, config, tok = load_smollm2()
  # The built-in game reads the first integer of any answer: episodes run several turns.
  eb = _play(params, config, tok, envs.EnvSpec("guess_number", {"low": 1, "high": 10}), max_turns=3)
  batch = eb.collate(pad_id=tok.pad_id)
  assert not batch["failed"].any() and (batch["num_turns"] >= 2).all()
  obs = batch["token_mask"] & ~batch["policy_mask"]
  assert obs.sum() > 0
  # An ended action is followed by the template's user turn and the next assistant header.
  row = int(np.argmax(batch["num_turns"]))
  text = tok.decode(batch["tokens"][row][batch["token_mask"][row]].tolist(),
                    skip_special_tokens=False)  # fmt: skip
  assert "<|im_start|>user" in text and "<|im_start|>assistant" in text, text
  S = max(len(e.prompt_ids) for e in eb.episodes)
  ids = np.full((4, S), tok.pad_id, np.int32)
  mask = np.zeros((4, S), bool)
  for b, e in enumerate(eb.episodes):
    ids[b, S - len(e.prompt_ids) :], mask[b, S - len(e.prompt_ids) :] = e.prompt_ids, True
  tokens, positions = step_lib.sequence_inputs(ids, mask, jnp.asarray(batch["tokens"]))
  logp, _ = step_lib.completion_logprobs(
    params, tokens, positions, num_completion=batch["tokens"].shape[1], model_config=config,
    temperature=0.7, chunk_size=64,
  )  # fmt: skip
  gap = np.abs(np.asarray(logp) - batch["sampler_logp"])[batch["policy_mask"]]
  print(f"SmolLM2 multi-turn gap max {gap.max():.2e} mean {gap.mean():.2e} over {gap.size} tokens")
  assert gap.max() <= 1e-4 and gap.mean() <= 1e-5, (gap.max(), gap.mean())
  # GEM's GuessTheNumber: an answer without \boxed{} is a format error that ends the episode
  # (reward -0.1, terminated): the rollout records it and stops that row.
  eb = _play(params, config, tok, envs.EnvSpec("gem:game:GuessTheNumber-v0-easy"), max_turns=4)
  batch = eb.collate(pad_id=tok.pad_id)
  assert not batch["failed"].any() and batch["terminated"].any()
  ended = [e for e in eb.episodes if e.terminated]
  assert all(np.isfinite(e.turns[-1].reward) for e in ended)
