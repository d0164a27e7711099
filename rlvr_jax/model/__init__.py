"""Llama / Qwen2 / Qwen3 decoders as pure functions over a params pytree.

Public API (see ``rlvr_jax/model/*.py`` for details):

  ModelConfig, init_params, param_specs, abstract_params, param_shardings, logical_axes,
  KVCache, init_cache, grow_cache, SlotCache, init_slot_cache, fill_slot_prompts, grow_slot_cache, decode_slots,
  forward, forward_at_columns, forward_into_new_cache, forward_shared_prompt, hidden_states_per_layer, unembed_matrix, logits_from_hidden,
  unstack_layers, with_unembed, layer_params, compute_params (the bfloat16 copy of mixed precision),
  load_hf, load_gguf, export_hf, Tokenizer, load_smollm2, NNXAdapter.

Loading, export and the tokenizer import ``transformers`` / ``safetensors`` / ``gguf`` lazily, so
``import rlvr_jax.model`` stays light.
"""

from rlvr_jax.model.cache import (
  KVCache,
  SlotCache,
  cache_logical_axes,
  cache_shardings,
  fill_slot_prompts,
  grow_cache,
  grow_slot_cache,
  init_cache,
  init_slot_cache,
)
from rlvr_jax.model.config import ModelConfig, UnsupportedModelError
from rlvr_jax.model.decoder import (
  decode_slots,
  forward,
  forward_at_columns,
  forward_into_new_cache,
  forward_shared_prompt,
  hidden_states_per_layer,
  layer_params,
  logits_from_hidden,
  unembed_matrix,
  unstack_layers,
  with_unembed,
)
from rlvr_jax.model.params import (
  ParamSpec,
  abstract_params,
  check_params,
  count_params,
  init_params,
  logical_axes,
  param_shardings,
  param_specs,
)
from rlvr_jax.model.precision import compute_params

_LAZY = {
  "load_hf": "rlvr_jax.model.loading",
  "CheckpointError": "rlvr_jax.model.loading",
  "load_gguf": "rlvr_jax.model.gguf_loading",
  "export_hf": "rlvr_jax.model.export",
  "Tokenizer": "rlvr_jax.model.tokenizer",
  "load_smollm2": "rlvr_jax.model.smollm2",
  "SMOLLM2_GGUF": "rlvr_jax.model.smollm2",
  "NNXAdapter": "rlvr_jax.model.nnx_adapter",
}


def __getattr__(name):
  if name in _LAZY:
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
  raise AttributeError(f"module 'rlvr_jax.model' has no attribute {name!r}")


__all__ = [
  "KVCache",
  "ModelConfig",
  "SlotCache",
  "ParamSpec",
  "UnsupportedModelError",
  "abstract_params",
  "cache_logical_axes",
  "cache_shardings",
  "check_params",
  "compute_params",
  "count_params",
  "decode_slots",
  "fill_slot_prompts",
  "forward",
  "forward_at_columns",
  "forward_into_new_cache",
  "forward_shared_prompt",
  "grow_cache",
  "grow_slot_cache",
  "hidden_states_per_layer",
  "init_cache",
  "init_params",
  "init_slot_cache",
  "layer_params",
  "logical_axes",
  "logits_from_hidden",
  "param_shardings",
  "param_specs",
  "unembed_matrix",
  "unstack_layers",
  "with_unembed",
  *_LAZY,
]
