"""The precision policy: which copy of the weights the forward pass runs on.

Three modes, from ``ModelConfig.dtype`` (parameter storage) and ``ModelConfig.compute_dtype``:

  dtype     compute_dtype  mode                 params / optimizer state   matmuls, activations, KV
  float32   float32        float32 (default)    float32                    float32
  float32   bfloat16       mixed precision      float32 (master copy)      bfloat16 copy of weights
  bfloat16  (either)       pure bfloat16        bfloat16                   bfloat16

In every mode RMSNorm, RoPE, the attention softmax, logits (float32 matmul accumulation) and the
log-prob / entropy statistics of ``rlvr_jax.logprobs`` are float32, and so is the loss.

Mixed precision casts the float32 master weights with ``compute_params`` INSIDE the jitted
function that uses them: in the train step the cast sits inside the differentiated loss, so the
gradient of w32 is the bfloat16 cotangent of w16 = bf16(w32) cast back to float32 (d w16 / d w32 =
1) and the optimiser updates float32 weights with float32 moments. The sampler casts once per
``generate`` call, before its decode loop (a decode step never re-casts).

The RMSNorm gains keep the master dtype: ``rms_norm`` multiplies in float32 anyway, so a bfloat16
copy of them would only round them.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from rlvr_jax.model.config import ModelConfig


def _is_norm(path) -> bool:
  last = path[-1]
  name = getattr(last, "key", getattr(last, "name", ""))
  return isinstance(name, str) and name.endswith("norm")


def compute_params(params: Any, config: ModelConfig) -> Any:
  """``params`` with every weight except the norm gains in ``config.activation_dtype``.

  The identity (the same tree, no operation) when the params already have that dtype, e.g. in
  float32 mode (bit-identical to not calling it) or on params cast before. Works on stacked and
  ``unstack_layers``-ed trees. Differentiable: the cast's gradient is the cotangent cast back.
  """
  dtype = jnp.dtype(config.activation_dtype)

  def cast(path, x):
    if _is_norm(path) or x.dtype == dtype or not jnp.issubdtype(x.dtype, jnp.floating):
      return x
    return x.astype(dtype)

  return jax.tree_util.tree_map_with_path(cast, params)
