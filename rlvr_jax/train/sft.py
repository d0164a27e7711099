"""Supervised warm start: next-token cross-entropy on (prompt, reference answer + EOS).

Used to give a from-scratch tiny model the task's output format before RL (the embedded default
experiment). Loss = -(1/N_tok) sum over completion tokens of log pi(y_t | x, y_<t), with log-probs
from ``rlvr_jax.logprobs`` (chunked, float32), AdamW from ``train.optimizer``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlvr_jax import data as data_lib
from rlvr_jax.train import step as step_lib


def encode_sft_batch(records, tokenizer, *, prompt_texts, completion_len: int, bucket: int):
  """(tokens [B, S], positions [B, S], completion_mask [B, T]) for prompt ++ answer + EOS."""
  ids, mask = data_lib.encode_prompts(
    prompt_texts, tokenizer, add_special_tokens=True, bucket=bucket
  )
  comp = np.full((len(records), completion_len), tokenizer.pad_id, np.int32)
  comp_mask = np.zeros((len(records), completion_len), bool)
  for i, r in enumerate(records):
    target = r.get("demonstration", r["answer"])  # worked solutions: working, then the answer
    ans = tokenizer.encode(target, add_special_tokens=False) + [tokenizer.eos_ids[0]]
    if len(ans) > completion_len:
      raise ValueError(
        f"demonstration {target!r} needs {len(ans)} tokens > sampling.max_new_tokens={completion_len}"
      )
    comp[i, : len(ans)] = ans
    comp_mask[i, : len(ans)] = True
  tokens, positions = step_lib.sequence_inputs(ids, mask, jnp.asarray(comp))
  return tokens, positions, jnp.asarray(comp_mask)


def make_sft_step(*, model_config, optimizer, chunk_size: int = 128):
  """Jitted ``sft_step(params, opt_state, tokens, positions, completion_mask) -> (..., loss)``."""

  def loss_fn(params, tokens, positions, completion_mask):
    logp, _ = step_lib.completion_logprobs(
      params,
      tokens,
      positions,
      num_completion=completion_mask.shape[1],
      model_config=model_config,
      temperature=1.0,
      chunk_size=chunk_size,
    )
    m = completion_mask.astype(jnp.float32)
    return -jnp.sum(logp * m) / jnp.maximum(jnp.sum(m), 1.0)

  def sft_step(params, opt_state, tokens, positions, completion_mask):
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens, positions, completion_mask)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return jax.jit(sft_step, donate_argnums=(0, 1))


def warm_start(params, *, source, tokenizer, model_config, cfg, max_new_tokens, log=print):
  """Runs ``cfg.num_steps`` SFT steps on records drawn from ``source`` (a PromptSource).

  ``source`` is a separate stream from the RL stream (its own seed), so the RL data position is
  untouched. Returns the new params and the list of losses.
  """
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(cfg.learning_rate))
  opt_state = optimizer.init(params)
  sft_step = make_sft_step(model_config=model_config, optimizer=optimizer)
  history = []
  for i in range(cfg.num_steps):
    records = source.take(cfg.batch_size)
    tokens, positions, cmask = encode_sft_batch(
      records,
      tokenizer,
      prompt_texts=[r["prompt"] for r in records],
      completion_len=max_new_tokens,
      bucket=cfg.bucket,
    )
    params, opt_state, loss = sft_step(params, opt_state, tokens, positions, cmask)
    history.append(float(loss))
    if (i + 1) % max(cfg.num_steps // 5, 1) == 0:
      log(f"sft step {i + 1}/{cfg.num_steps}: loss {history[-1]:.4f}")
  return params, history
