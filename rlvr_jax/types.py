"""Shared data types, registered as pytrees, and the dimension glossary.

Dimension glossary (used in every docstring and einsum string of the package):

  B  batch rows (sequences);  B = P * G for grouped rollouts
  P  prompts in a rollout batch
  G  samples (completions) per prompt
  T  completion tokens (padded response length)
  S  full sequence length (prompt + completion)
  V  vocabulary size
  D  model width (hidden size)
  N  query heads,  K  key/value heads,  H  head dim
  L  decoder layers
  F  MLP hidden size

Rows are *group ordered*: row ``b`` holds sample ``b % G`` of prompt ``b // G``.
"""

from __future__ import annotations

import dataclasses

import jax


def pytree_dataclass(cls):
  """A frozen dataclass registered as a pytree whose fields are all leaves/children.

  Fields listed in the class attribute ``_static_fields`` (a tuple of names) are treated as
  static metadata (hashable, not traced).
  """
  cls = dataclasses.dataclass(frozen=True)(cls)
  static = tuple(getattr(cls, "_static_fields", ()))
  data = tuple(f.name for f in dataclasses.fields(cls) if f.name not in static)
  return jax.tree_util.register_dataclass(cls, data_fields=list(data), meta_fields=list(static))


@pytree_dataclass
class Rollout:
  """What the sampler returns for B = P * G sequences.

  Attributes:
    prompt_tokens: [B, S_prompt] int32, left-padded prompt ids (pad where ``prompt_mask`` is 0).
    prompt_mask: [B, S_prompt] bool, True on real prompt tokens.
    tokens: [B, T] int32 completion ids (pad after the end).
    sampler_logp: [B, T] float32 log-prob of each sampled token under the distribution actually
      sampled from (after temperature and truncation).
    model_logp: [B, T] float32 log-prob under the unmodified model distribution at temperature 1.
    completion_mask: [B, T] bool, True on generated tokens up to and including the stop token.
    lengths: [B] int32 number of generated tokens (= completion_mask.sum(-1)).
    finished: [B] bool, True where a stop token was produced.
    truncated: [B] bool, True where ``max_new_tokens`` was hit without a stop token.
    prompt_ids: [B] int32 index of the prompt of each row.
    sample_ids: [B] int32 index of the sample within its group.
    sampler_threshold: [B, T] float32 or None. With a truncating strategy (top-k / top-p / min-p
      / greedy) the smallest kept scaled logit z = logits / temperature at each step: the sampled
      distribution is softmax(z) restricted to {v : z_v >= threshold}. Re-apply it to the
      trainer's logits with ``rlvr_jax.sampling.truncated_token_logprobs``. None when the
      strategy does not truncate (the distribution is the full softmax(z)).
  """

  prompt_tokens: jax.Array
  prompt_mask: jax.Array
  tokens: jax.Array
  sampler_logp: jax.Array
  model_logp: jax.Array
  completion_mask: jax.Array
  lengths: jax.Array
  finished: jax.Array
  truncated: jax.Array
  prompt_ids: jax.Array
  sample_ids: jax.Array
  sampler_threshold: jax.Array | None = None
