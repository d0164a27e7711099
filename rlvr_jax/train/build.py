"""Builders from a validated config: tokenizer, model, reward function, prompt streams."""

from __future__ import annotations

import jax

from rlvr_jax import data as data_lib
from rlvr_jax import model, rewards
from rlvr_jax.train import reward_config


def build_model(c, *, vocab_size: int | None = None, eos_id: int | None = None, pad_id: int = 0):
  """(params, ModelConfig, tokenizer or None) for ``config.model``.

  ``tiny``: a from-scratch Llama-style model sized by the config, initialised from the run seed
  (its tokenizer is built separately, e.g. the character tokenizer). ``smollm2``: the embedded
  SmolLM2-135M-Instruct. ``hf``: a local Hugging Face checkpoint directory. The params are in
  ``model.dtype`` (the master copy); ``model.compute_dtype`` goes into the ``ModelConfig``, and
  every forward pass runs on ``model.compute_params`` of them (``rlvr_jax.model.precision``).
  """
  m = c.model
  if m.source == "tiny":
    cfg = model.ModelConfig.tiny(
      vocab_size=vocab_size,
      hidden_size=m.hidden_size,
      intermediate_size=m.intermediate_size,
      num_layers=m.num_layers,
      num_heads=m.num_heads,
      num_kv_heads=m.num_kv_heads,
      head_dim=m.head_dim,
      bos_token_id=1,
      eos_token_ids=(eos_id,),
      pad_token_id=pad_id,
      dtype=m.dtype,
      compute_dtype=m.compute_dtype,
      remat=m.remat,
      attention=m.attention,
      decode_attention=m.decode_attention,
    )
    return model.init_params(cfg, jax.random.key(c.seed)), cfg, None
  if m.source == "smollm2":
    params, cfg, tok = model.load_smollm2(dtype=m.dtype)
    return params, cfg.replace(**_runtime_fields(m)), tok
  params, cfg = model.load_hf(m.path, dtype=m.dtype)
  cfg = cfg.replace(**_runtime_fields(m))
  return params, cfg, model.Tokenizer.from_pretrained(m.path)


def _runtime_fields(m) -> dict:
  """The ``ModelConfig`` fields a run sets on a loaded checkpoint's config (not read from it)."""
  return dict(
    remat=m.remat, compute_dtype=m.compute_dtype, attention=m.attention,
    decode_attention=m.decode_attention,
  )  # fmt: skip


def build_tokenizer_and_model(c):
  """(tokenizer, params, model_config)."""
  if c.tokenizer.kind == "char":
    tok = data_lib.CharTokenizer(c.tokenizer.alphabet)
    params, cfg, _ = build_model(c, vocab_size=tok.vocab_size, eos_id=tok.eos_id, pad_id=tok.pad_id)
    return tok, params, cfg
  params, cfg, tok = build_model(c)
  return tok, params, cfg


def build_reward(c):
  """The reward of ``config.reward`` (``reward.name`` or ``reward.components``): see
  ``train.reward_config``."""
  return reward_config.build_reward(c)


def build_runtime(c):
  return rewards.RewardRuntime(num_workers=c.reward.num_workers, timeout_s=c.reward.timeout_s)


def warm_start_source(c):
  """The supervised warm-start stream: the train split with its own seed. With
  ``warm_start.drop_carry_prob > 0``, the demonstrations after the first
  ``warm_start.clean_steps`` batches come from a flawed teacher that drops carries with that
  probability (the clean phase lets the tiny model form its digit circuits first; the flawed
  phase then plants a systematic error for RL to fix)."""
  if c.data.source != "task":  # the train records, in an order of their own
    train, _ = data_lib.build_sources(c.data)
    return data_lib.PromptSource(records=train.records, seed=c.warm_start.seed)
  spec = data_lib.task_spec(c.data)
  source = data_lib.PromptSource(task=spec, seed=c.warm_start.seed, split="train")
  prob = float(c.warm_start.drop_carry_prob)
  if prob == 0.0:
    return source
  clean = int(c.warm_start.clean_steps) * int(c.warm_start.batch_size)
  return _FlawedTeacher(source, prob, seed=c.warm_start.seed, clean_records=clean)


class _FlawedTeacher:
  """Replaces the reference answer by the carry-less digit sum with probability ``prob`` for
  stream records at index >= ``clean_records``."""

  def __init__(self, source, prob: float, *, seed: int, clean_records: int = 0):
    self.source, self.prob, self.seed, self.clean = source, prob, seed, clean_records

  def take(self, n: int):
    import numpy as np

    out = []
    for r in self.source.take(n):
      if r["index"] < self.clean:
        out.append(r)
        continue
      if np.random.default_rng([self.seed, 7, r["index"]]).random() < self.prob:
        r = {**r, "answer": data_lib.tasks.no_carry_sum(r["key"])}
        if "demonstration" in r:  # the worked style: working and answer both without carries
          r["demonstration"] = data_lib.tasks.worked_solution(r["key"], carry=False)
      out.append(r)
    return out
