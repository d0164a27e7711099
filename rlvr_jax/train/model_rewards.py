"""Model-side rewards in the trainer: a jitted no-grad pass over the rollout that returns [B]
rewards computed from the policy's own distribution, added to the host reward.

Config section ``config.model_reward``::

  name         '' (off) | 'self_certainty' | 'reference_logp' | 'reference_mean_logp' |
               'reference_prob' | 'rlpr'
  weight       w in R = R_host + w R_model (with ``replace``: R = w R_model)
  replace      drop the host reward (label-free Intuitor training: name='self_certainty')
  marker       text that starts the answer span (e.g. '<answer>'); the reasoning kept before the
               reference is the completion up to its first occurrence ('' : the whole completion),
               and the splice is [x, z, marker, y*] with only y* scored (without reasoning:
               [x, marker, y*]), so y* is read where the policy writes its answer

RLPR's R = (1 − c_f) Δ + c_f r_fmt is ``name='rlpr'`` with ``weight = 1 − c_f`` and a host format
reward weighted c_f (``reward.components``); the model reward itself is Δ.

Formulas in ``rlvr_jax.logprobs.model_rewards`` (METHODS.md §5.6-5.7). Everything runs through the
tiled log-prob sweep, never a [B, T, V] array. The reference answer is the record's ``answer``
field, tokenised on the host and spliced by ids.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import ConfigDict

from rlvr_jax import logprobs
from rlvr_jax.train import step as step_lib

KINDS = ("", "self_certainty", "reference_logp", "reference_mean_logp", "reference_prob", "rlpr")
REFERENCE_KINDS = KINDS[2:]


def model_reward_section() -> ConfigDict:
  return ConfigDict(dict(name="", weight=1.0, replace=False, marker=""))


def validate_model_reward(c, error) -> None:
  """Raises ``error(field, message)`` for a bad ``config.model_reward``."""
  m = c.model_reward
  if m.name not in KINDS:
    raise error("model_reward.name", f"{m.name!r} not in {KINDS}")
  if m.replace and not m.name:
    raise error("model_reward.replace", "needs model_reward.name")


def reference_ids(
  tokenizer, answers, *, pad_id: int, prefix: tuple[int, ...] = ()
) -> tuple[np.ndarray, np.ndarray]:
  """Host: token ids of the reference answers after ``prefix`` (the marker's ids), right padded:
  ([B, A] int32, [B, A] bool)."""
  ids = [[*prefix, *tokenizer.encode(str(a), add_special_tokens=False)] for a in answers]
  width = max(1, max(len(x) for x in ids))
  out = np.full((len(ids), width), pad_id, np.int32)
  mask = np.zeros((len(ids), width), bool)
  for b, x in enumerate(ids):
    out[b, : len(x)], mask[b, : len(x)] = x, True
  return out, mask


@functools.lru_cache(maxsize=8)
def make_model_reward_fn(
  *,
  model_config,
  kind: str,
  marker_ids: tuple[int, ...] = (),
  pad_id: int = 0,
  chunk_size: int = 128,
  format_coef: float = 0.1,
):
  """Jitted ``fn(params, prompt_tokens, prompt_mask, tokens, completion_mask, reference,
  reference_mask, format_reward) -> dict of [B] float32`` (no gradient; ``kind`` static).

  Keys: ``model_reward`` (the reward) plus diagnostics (``mean_prob``, ``mean_prob_no_reasoning``
  for the reference kinds). ``reference`` / ``reference_mask`` / ``format_reward`` are ignored by
  ``self_certainty`` (pass None). With ``marker_ids`` each reference row starts with them
  (``reference_ids(..., prefix=marker_ids)``): they are spliced after the reasoning but not
  scored. Distributions are at temperature 1 (the model's own).
  """
  if kind not in KINDS[1:]:
    raise ValueError(f"make_model_reward_fn: kind must be one of {KINDS[1:]}, got {kind!r}")

  def hidden_of(params, prompt_tokens, prompt_mask, tokens):
    seq, pos = step_lib.sequence_inputs(prompt_tokens, prompt_mask, tokens)
    return step_lib.completion_hidden(
      params, seq, pos, num_completion=tokens.shape[1], model_config=model_config
    )

  def spliced_likelihood(params, prompt_tokens, prompt_mask, tokens, keep, reference, ref_mask):
    scored = ref_mask & (jnp.arange(reference.shape[1])[None, :] >= len(marker_ids))
    sp = logprobs.splice_reference(
      tokens, keep, reference, ref_mask, score_mask=scored, pad_id=pad_id
    )
    h, unembed, targets = hidden_of(params, prompt_tokens, prompt_mask, sp.tokens)
    logp, _ = logprobs.token_logprobs_from_hidden(
      h, unembed, targets, chunk_size=chunk_size, compute_entropy=False
    )
    return logprobs.reference_likelihood(logp, sp.score_mask)

  def fn(params, prompt_tokens, prompt_mask, tokens, completion_mask, reference, ref_mask, fmt):
    if kind == "self_certainty":
      h, unembed, targets = hidden_of(params, prompt_tokens, prompt_mask, tokens)
      sc = logprobs.self_certainty_from_hidden(
        h, unembed, targets, completion_mask, chunk_size=chunk_size
      )
      return {"model_reward": sc}
    if marker_ids:
      keep = logprobs.find_marker(tokens, completion_mask, marker_ids)
    else:
      keep = completion_mask.sum(axis=1).astype(jnp.int32)
    lik = spliced_likelihood(params, prompt_tokens, prompt_mask, tokens, keep, reference, ref_mask)
    out = {"mean_prob": lik.mean_prob}
    if kind == "reference_logp":
      out["model_reward"] = lik.sum_logp
    elif kind == "reference_mean_logp":
      out["model_reward"] = lik.mean_logp
    elif kind == "reference_prob":
      out["model_reward"] = lik.mean_prob
    else:  # rlpr: debiased by the same answer without reasoning
      empty = spliced_likelihood(
        params, prompt_tokens, prompt_mask, tokens, jnp.zeros_like(keep), reference, ref_mask
      )
      out["mean_prob_no_reasoning"] = empty.mean_prob
      out["model_reward"] = logprobs.rlpr_reward(
        lik.mean_prob, empty.mean_prob, format_reward=fmt, format_coef=format_coef
      )
    return out

  return jax.jit(fn)


def combine_rewards(host: np.ndarray, model: np.ndarray, cfg) -> np.ndarray:
  """R = R_host + w R_model, or w R_model with ``replace`` (NaN host rows stay NaN unless replaced:
  a failed host reward is not silently turned into a model-only reward)."""
  model = np.asarray(model, np.float32) * np.float32(cfg.weight)
  if cfg.replace:
    return model
  return np.asarray(host, np.float32) + model


def score(fn, cfg, tokenizer, params, rollout, answers) -> dict:
  """Dispatches ``fn`` on a rollout: {"model_reward": [B], "model_reward/<diagnostic>": [B]}
  (device arrays; the reference kinds tokenise ``answers`` on the host first)."""
  ref = ref_mask = None
  if cfg.name in REFERENCE_KINDS:
    marker = tuple(tokenizer.encode(cfg.marker, add_special_tokens=False)) if cfg.marker else ()
    ref, ref_mask = reference_ids(tokenizer, answers, pad_id=tokenizer.pad_id, prefix=marker)
  got = fn(
    params, rollout.prompt_tokens, rollout.prompt_mask, rollout.tokens, rollout.completion_mask,
    ref, ref_mask, None,
  )  # fmt: skip
  return {
    ("model_reward" if k == "model_reward" else f"model_reward/{k}"): v for k, v in got.items()
  }


def apply(scores: dict, host_rewards: np.ndarray, cfg) -> tuple[np.ndarray, dict]:
  """Pops the model-reward entries from the host ``scores``; returns ([B] combined rewards,
  metrics ``reward/model/mean`` and ``reward/model/<diagnostic>``)."""
  model = scores.pop("model_reward")
  metrics = {"reward/model/mean": float(np.mean(model))}
  for key in [k for k in scores if k.startswith("model_reward/")]:
    metrics[f"reward/model/{key.split('/', 1)[1]}"] = float(np.mean(scores.pop(key)))
  return combine_rewards(host_rewards, model, cfg), metrics
