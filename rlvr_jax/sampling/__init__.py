"""Sampling: strategies (frozen dataclasses), prefill / decode_step / generate, log-prob parity.

Public API:
  Greedy, Temperature, TopK, TopP, MinP, Combined, Strategy, truncated_token_logprobs
  prefill, decode_step, generate, pad_to_bucket, bucket_length, DEFAULT_BUCKETS
  step_key, row_keys, position_keys
  recompute_logprobs, logprob_parity, truncated_logprobs_from_hidden
"""

from rlvr_jax.sampling.keys import position_keys, row_keys, step_key
from rlvr_jax.sampling.parity import (
  logprob_parity,
  recompute_logprobs,
  truncated_logprobs_from_hidden,
)
from rlvr_jax.sampling.sampler import (
  DEFAULT_BUCKETS,
  bucket_length,
  decode_step,
  generate,
  pad_to_bucket,
  prefill,
)
from rlvr_jax.sampling.strategies import (
  Combined,
  Greedy,
  MinP,
  Strategy,
  Temperature,
  TopK,
  TopP,
  truncated_token_logprobs,
)

__all__ = [
  "DEFAULT_BUCKETS",
  "Combined",
  "Greedy",
  "MinP",
  "Strategy",
  "Temperature",
  "TopK",
  "TopP",
  "bucket_length",
  "decode_step",
  "generate",
  "logprob_parity",
  "pad_to_bucket",
  "position_keys",
  "prefill",
  "recompute_logprobs",
  "row_keys",
  "step_key",
  "truncated_logprobs_from_hidden",
  "truncated_token_logprobs",
]
