"""Per-token log-probs, entropy and mean log-softmax in float32, from hidden states or logits, without
ever building the [N, V] float32 logits (N = B·T tokens); and a token-local objective fused into the
same sweep.

    from rlvr_jax import logprobs
    logp, entropy = logprobs.token_logprobs_from_hidden(hidden, unembed, tokens, temperature=tau)

Parts (the formulas and the memory argument are in each part's docstring):

* ``token_stats``: ``token_stats_from_{hidden,logits}`` / ``token_logprobs_from_{hidden,logits}``,
  chunked over tokens (and vocabulary blocks from hidden states) with a custom VJP that recomputes
  each logits tile in the backward pass;
* ``fused``: ``fused_objective_from_hidden``, the loss gradient taken inside the forward sweep for
  token-local objectives (three matmul passes instead of four);
* ``model_rewards``: rewards computed by a forward pass (self-certainty, reference-answer
  likelihood on a spliced sequence and RLPR, LaSeR's last-token self-reward), from the same
  statistics or hidden states;
* ``tiles``: the tile math both share (online logsumexp per vocabulary block, the dz rules, input
  checks).

This package imports only jax (``tests/test_import_rules.py`` checks it).
"""

from rlvr_jax.logprobs.fused import DEFAULT_FUSED_CHUNK_SIZE, fused_objective_from_hidden
from rlvr_jax.logprobs.model_rewards import (
  ReferenceLikelihood,
  Spliced,
  find_marker,
  last_token_hidden,
  last_token_self_reward,
  next_token_logprob,
  reference_likelihood,
  rlpr_reward,
  self_certainty,
  self_certainty_from_hidden,
  splice_reference,
)
from rlvr_jax.logprobs.token_stats import (
  DEFAULT_CHUNK_SIZE,
  DEFAULT_VOCAB_CHUNK_SIZE,
  TokenStats,
  token_logprobs_from_hidden,
  token_logprobs_from_logits,
  token_stats_from_hidden,
  token_stats_from_logits,
)

__all__ = [
  "DEFAULT_CHUNK_SIZE",
  "DEFAULT_FUSED_CHUNK_SIZE",
  "DEFAULT_VOCAB_CHUNK_SIZE",
  "ReferenceLikelihood",
  "Spliced",
  "TokenStats",
  "find_marker",
  "last_token_hidden",
  "last_token_self_reward",
  "next_token_logprob",
  "reference_likelihood",
  "rlpr_reward",
  "self_certainty",
  "self_certainty_from_hidden",
  "splice_reference",
  "fused_objective_from_hidden",
  "token_logprobs_from_hidden",
  "token_logprobs_from_logits",
  "token_stats_from_hidden",
  "token_stats_from_logits",
]
