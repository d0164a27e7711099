"""Sampling: strategies (frozen dataclasses), prefill / decode_step / generate, log-prob parity.

Public API:
  Greedy, Temperature, TopK, TopP, MinP, Combined, Strategy, truncated_token_logprobs
  per_row_log_probs, temperature_scale (per-row temperatures; 0 = greedy row)
  prefill, decode_step, generate, row_temperatures, pad_to_bucket, bucket_length, DEFAULT_BUCKETS
  continuous (continuous.generate: decode slots refilled from a queue; fork_prefixes)
  step_key, row_keys, position_keys
  recompute_logprobs, logprob_parity, truncated_logprobs_from_hidden
"""

from rlvr_jax.sampling import continuous
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
  row_temperatures,
)
from rlvr_jax.sampling.strategies import (
  Combined,
  Greedy,
  MinP,
  Strategy,
  Temperature,
  TopK,
  TopP,
  per_row_log_probs,
  temperature_scale,
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
  "continuous",
  "decode_step",
  "generate",
  "logprob_parity",
  "pad_to_bucket",
  "per_row_log_probs",
  "position_keys",
  "prefill",
  "recompute_logprobs",
  "row_keys",
  "row_temperatures",
  "step_key",
  "temperature_scale",
  "truncated_logprobs_from_hidden",
  "truncated_token_logprobs",
]
