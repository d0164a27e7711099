"""LoRA runs of the trainer: the ``config.lora`` block, the frozen base, the merged policy, export.

Config section ``config.lora``::

  rank       r: 0 = off (full fine-tuning, the default); r > 0 trains rank-r adapters only
  alpha      the update is (alpha / r) A @ B; 0 = 2 x rank (the usual choice)
  targets    comma-separated projections to adapt, of q,k,v,o,gate,up,down (default: all seven)
  int8_base  store the frozen base's projections (and an untied lm_head) as int8, per output
             channel (``model.lora.quantize_int8``): about a quarter of the float32 base's bytes

What a LoRA run does differently (``train.loop.Trainer``; the adapters themselves are
``rlvr_jax.model.lora``):

  build      the base as for full fine-tuning (``model.source``, in ``model.dtype``), then int8
             with ``int8_base``; the adapters by ``lora.init_lora`` with a key from the run seed
             (``adapter_key``: A uniform, B = 0, so the run starts at the base policy), float32
             whatever ``model.dtype`` (the adapters are the master copy: a bfloat16 base with
             float32 adapters is the usual LoRA setting).
  state      ``TrainState.params`` holds the ADAPTERS only: the optimiser state, the update,
             ``grad_norm`` / ``param_norm`` / ``update_norm`` and the checkpoints are the
             adapters'. The base lives beside the state (``Trainer.base``, placed by the layout:
             ``Layout.place_base``) and is passed to every train step as its ``base`` argument,
             not donated, never optimised, never saved: a resume rebuilds it from the config
             (bit for bit: the same seed or the same checkpoint file).
  update     ``train.step`` with ``StepConfig.lora``: the loss differentiates
             ``lora.adapter_loss`` (merged in the compute dtype, per layer in the layer scan
             when ``model.remat``), the statistics pass runs on the merged tree.
  sampling   once per RL step (and per evaluation) ``merged_params`` = merge(base, adapters) in
             the compute dtype, jitted, is the policy the sampler, the scoring passes (old
             log-probs), the model rewards and the min-p proxy read; it is dropped after the
             rollout. Its values are those the update's forward pass uses, so on-policy sampler
             and trainer log-probs agree as in full fine-tuning.
  reference  ``rl.use_reference`` (a KL penalty): the base itself, the policy with its adapters
             off (``lora.merge`` with B = 0 is the base bit for bit), so no ``ref_params`` copy;
             an int8 base is dequantized for the scoring pass (``reference_params``, per step).
  export     at the end of a complete run from ``model.source`` 'smollm2' or 'hf':
             ``workdir/peft_adapter`` (``adapter_config.json`` + ``adapter_model.safetensors``,
             ``model.peft_export.export_peft_adapter``), loadable with
             ``peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), path)``.
             ``export_merged(config, out_dir)`` writes a plain Hugging Face folder (merged
             safetensors + tokenizer) from a run's config and adapter folder.

Not with LoRA (``validate_lora`` refuses them): the supervised warm start (it trains the full
weights, which a resume could not rebuild) and the implicit PRM (a second full parameter tree).

For SmolLM2 the base is the embedded GGUF's dequantized Q4_1 / Q8_0 weights, not the original
float weights on the Hugging Face hub: the exported adapter was trained on the former (close, not
equal); ``export_merged`` merges into the same weights the run trained on.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
from ml_collections import ConfigDict

from rlvr_jax.model import lora as lora_lib
from rlvr_jax.train import step as step_lib

ADAPTER_DIR = "peft_adapter"  # in the workdir
# ``adapter_key``: fold_in(key(seed), ADAPTER_SALT), apart from the model init (key(seed)) and
# the run key (key(seed) folded with the RL step).
ADAPTER_SALT = 0x10BA
HUB_NAMES = {"smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct"}


def lora_section() -> ConfigDict:
  return ConfigDict(
    dict(rank=0, alpha=0.0, targets=",".join(lora_lib.ALL_TARGETS), int8_base=False)
  )


def parse_targets(text: str) -> tuple[str, ...]:
  """``"q,k,v"`` -> ("q", "k", "v") (spaces ignored, empty entries dropped)."""
  return tuple(t.strip() for t in str(text).split(",") if t.strip())


def validate_lora(c, error) -> None:
  """Raises ``error(field, message)`` for a bad ``config.lora`` or what LoRA cannot run with."""
  s = c.get("lora")
  if s is None:  # a config built without the block: full fine-tuning
    return
  if not (isinstance(s.rank, int) and s.rank >= 0):
    raise error("lora.rank", f"must be an integer >= 0 (0 = off), got {s.rank!r}")
  if not s.alpha >= 0:
    raise error("lora.alpha", f"must be >= 0 (0 = 2 x rank), got {s.alpha}")
  targets = parse_targets(s.targets)
  unknown = [t for t in targets if t not in lora_lib.TARGETS]
  if unknown or not targets or len(set(targets)) != len(targets):
    raise error(
      "lora.targets",
      f"{s.targets!r}: expected distinct comma-separated names of {','.join(lora_lib.ALL_TARGETS)}",
    )
  if s.int8_base and s.rank == 0:
    raise error("lora.int8_base", "an int8 base is frozen: it needs LoRA (lora.rank > 0)")
  if s.rank == 0:
    return
  if c.warm_start.num_steps > 0:
    raise error(
      "warm_start.num_steps",
      "the warm start trains the full weights, a LoRA run (lora.rank > 0) only adapters of a "
      "base rebuilt from the config on resume: use warm_start.num_steps=0 with LoRA",
    )
  if c.implicit_prm.enabled:
    raise error(
      "implicit_prm.enabled", "the implicit PRM is a second full parameter tree: not with LoRA"
    )


def lora_config(c) -> lora_lib.LoraConfig | None:
  """The ``LoraConfig`` of ``config.lora`` (alpha 0 -> 2 x rank), or None when ``rank`` is 0."""
  s = c.get("lora")
  if s is None or not s.rank:
    return None
  alpha = float(s.alpha) if s.alpha else 2.0 * s.rank
  return lora_lib.LoraConfig(rank=int(s.rank), alpha=alpha, targets=parse_targets(s.targets))


def adapter_key(seed: int) -> jax.Array:
  """The key of the adapters' initialisation (A): from the run seed."""
  return jax.random.fold_in(jax.random.key(seed), ADAPTER_SALT)


def build_base(params, c):
  """The frozen base of a LoRA run from the built params: as they are, or int8 (``int8_base``)."""
  if not c.lora.int8_base:
    return params
  return step_lib.owned_jit(lora_lib.quantize_int8)(params)


def is_quantized_tree(base) -> bool:
  """Whether ``base`` holds int8 weights (``lora.quantize_int8``)."""
  leaves = jax.tree.leaves(base, is_leaf=lora_lib.is_quantized)
  return any(lora_lib.is_quantized(x) for x in leaves)


def init_adapters(base, lcfg: lora_lib.LoraConfig, seed: int):
  """The run's initial adapters (float32; A from ``adapter_key(seed)``, B = 0)."""
  return lora_lib.init_lora(base, lcfg, adapter_key(seed), "float32")


def _merged_parts(base, adapters, *, lcfg, dtype):
  """The entries of ``lora.merge``'s tree that differ from the base's: the layers and an int8
  ``lm_head`` (jitted outputs are new buffers: the embedding is not copied)."""
  merged = lora_lib.merge(base, adapters, lcfg, dtype)
  return {k: v for k, v in merged.items() if k == "layers" or lora_lib.is_quantized(base[k])}


def make_merge_fn(lcfg: lora_lib.LoraConfig, dtype: str):
  """``merge(base, adapters)`` -> the merged params (``lora.merge`` in ``dtype``, the compute
  dtype), jitted and owned by the returned callable (``step.owned_jit``); the entries the merge
  leaves as they are (the embedding, the final norm) are the base's own arrays. ``adapters=None``:
  the base (dequantized when int8). Placement follows the base's (the layout reshards the tree
  for sampling)."""
  fn = step_lib.owned_jit(_merged_parts, static_argnames=("lcfg", "dtype"))
  dtype = jax.numpy.dtype(dtype).name

  def merge(base, adapters):
    return dict(base, **fn(base, adapters, lcfg=lcfg, dtype=dtype))

  return merge


def base_model_name(c) -> str | None:
  """What the PEFT folder names as its base: the hub name of SmolLM2, the folder of an 'hf' run."""
  if c.model.source == "hf":
    return c.model.path
  return HUB_NAMES.get(c.model.source)


def exportable(c) -> bool:
  """Whether a run's adapters make a PEFT folder: a Hugging Face model (not the tiny one)."""
  return c.model.source in ("smollm2", "hf")


def export_adapter(adapters, model_config, c, path: str | None = None) -> str:
  """Writes the PEFT adapter folder of ``adapters`` (host or device arrays, every tensor
  addressable) to ``path`` (default ``workdir/peft_adapter``); returns the path."""
  from rlvr_jax.model import peft_export

  lcfg = lora_config(c)
  if lcfg is None:
    raise ValueError("export_adapter: config.lora.rank is 0 (not a LoRA run)")
  path = path or os.path.join(c.workdir, ADAPTER_DIR)
  host = jax.tree.map(np.asarray, adapters)
  return peft_export.export_peft_adapter(
    host, model_config, lcfg, path, base_model_name_or_path=base_model_name(c)
  )


def export_merged(c, path: str, *, adapter_dir: str | None = None, dtype: str | None = None) -> str:
  """A plain Hugging Face folder (``config.json``, merged ``model*.safetensors``, tokenizer) of a
  LoRA run: the float base rebuilt from the run's config ``c`` (never the int8 one: the merge
  adds the adapters to the weights the int8 base was made from), the adapters read from
  ``adapter_dir`` (default ``c.workdir/peft_adapter``), merged in float32
  (``model.peft_export.export_merged_hf``), written in ``dtype`` (default ``model.dtype``).

    from rlvr_jax import api
    from rlvr_jax.train import lora_training
    c = api.make_config("experiments/smollm2_lora.py")
    lora_training.export_merged(c, "runs/smollm2_lora/merged_hf")
  """
  from rlvr_jax.model import peft_export
  from rlvr_jax.train import build

  tokenizer, base, model_config = build.build_tokenizer_and_model(c)
  adapters, lcfg = peft_export.load_peft_adapter(
    adapter_dir or os.path.join(c.workdir, ADAPTER_DIR), model_config
  )
  return peft_export.export_merged_hf(
    base, adapters, model_config, lcfg, path, dtype=dtype or c.model.dtype,
    tokenizer=None if c.tokenizer.kind == "char" else tokenizer,
  )  # fmt: skip


def count(tree: Any) -> int:
  return sum(int(np.size(x)) for x in jax.tree.leaves(tree))
