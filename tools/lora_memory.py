"""Memory of one LoRA update vs one full fine-tuning update, from XLA's compiled analysis.

Both are lowered and compiled on abstract shapes (nothing allocated, no device needed), for a named
Hugging Face config (``rlvr_jax.model.config.HF_CONFIGS``, default Qwen2.5-7B), a GRPO loss on
rows x tokens (the prompt one eighth of each row), bfloat16 compute, remat and blockwise attention:

  full   the trainer's jitted train step (``tools/update_memory.py``): float32 master weights,
         float32 AdamW moments, float32 gradients.
  lora   ``lora_update`` below: a bfloat16 base (or the int8 base of ``lora.quantize_int8`` with
         ``--int8``), frozen and closed over under ``stop_gradient``; float32 LoRA adapters
         (rank ``--rank`` on all seven projections) with float32 AdamW moments. Each micro-batch
         merges the adapters into the base in bfloat16 (``lora.merge``) inside the differentiated
         loss, and runs the trainer's own micro-batch loss (``train.step.micro_batch_loss``) on
         the merged tree; gradients are accumulated for the adapters only; the trainer's AdamW
         (``OptimizerSpec.fused_apply``) updates them. The trainer's step takes adapters itself
         (``train.step.make_train_step(lora=...)``, what a run with ``config.lora`` uses); this
         tool lowers its own ``lora_update``, the same update built from ``train.step``'s public
         pieces without the step's metrics, so that the whole-tree merge can be measured with
         remat on (the trainer's step merges per layer when ``model.remat``).

  lora --per-layer   the same, but the adapters ride along in the params (``lora.attach``) and
         each layer's weights are merged inside the decoder's layer scan (``lora.merge_attached``,
         called by ``rlvr_jax.model.decoder._differentiable``): what the trainer's step runs with
         remat. ``decoder_hook`` still wraps ``_differentiable`` while lowering; on the decoder
         that has the hook, its second ``merge_attached`` gets merged layers and changes nothing.

The peak bound is arguments + outputs - aliased (donated) + temporaries. XLA:CPU compiles what it
would run on the CPU; on a GPU fusions and scheduling differ, so these are estimates.

    .venv/bin/python tools/lora_memory.py                    # Qwen2.5-7B, 1 x 4096 tokens, r=64
    .venv/bin/python tools/lora_memory.py --shapes 1x4096,8x4096 --int8
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import optax

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # run as a script it is there already; imported, the importer's choice
  sys.path.insert(0, _HERE)
import update_memory  # noqa: E402

from rlvr_jax import model  # noqa: E402
from rlvr_jax.model import lora  # noqa: E402
from rlvr_jax.model.config import HF_CONFIGS  # noqa: E402
from rlvr_jax.train import config as config_lib  # noqa: E402
from rlvr_jax.train import step as step_lib  # noqa: E402
from rlvr_jax.train.optimizer import OptimizerSpec  # noqa: E402

GB = 1e9


@contextlib.contextmanager
def decoder_hook():
  """Makes every scanned layer body first run ``lp = lora.merge_attached(lp,
  config.activation_dtype)`` while lowering (a no-op on params without attached adapters or int8
  weights). The decoder now does this itself, so the wrapper merges nothing more. Restored on
  exit."""
  from rlvr_jax.model import decoder

  original = decoder._differentiable

  def with_merge(layer, config):
    dtype = config.activation_dtype
    return original(lambda x, lp: layer(x, lora.merge_attached(lp, dtype)), config)

  decoder._differentiable = with_merge
  try:
    yield
  finally:
    decoder._differentiable = original


def lora_update(
  base, adapters, opt_state, batch, num_tokens, num_seqs, *, cfg, lcfg, per_layer=False
):
  """One LoRA update: (adapters', opt_state', loss, grad_norm). ``cfg`` is the trainer's
  ``StepConfig`` (its objective must need no step statistics, e.g. GRPO), ``lcfg`` the
  ``LoraConfig``; the merge runs in ``cfg.model_config.activation_dtype``. ``per_layer``: attach
  the adapters for a decoder with the per-layer hook (trace under ``decoder_hook``)."""
  if cfg.objective.needs_step_stats(cfg.hp) or cfg.objective.state is not None:
    raise ValueError(f"lora_update: objective {cfg.objective.name!r} needs step statistics")
  dtype = cfg.model_config.activation_dtype

  def mb_loss(params, mb):
    return step_lib.micro_batch_loss(cfg, params, mb, num_tokens, num_seqs, {})

  loss_fn = lora.adapter_loss(mb_loss, base, lcfg, dtype=dtype, attached=per_layer)
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  mbs = step_lib.split_microbatches(batch, cfg.num_microbatches)
  (loss, _), grads = grad_fn(adapters, jax.tree.map(lambda x: x[0], mbs))
  if cfg.num_microbatches > 1:

    def body(carry, mb):
      loss_acc, grads_acc = carry
      (mb_loss_value, _), g = grad_fn(adapters, mb)
      return (loss_acc + mb_loss_value, jax.tree.map(jnp.add, grads_acc, g)), None

    rest = jax.tree.map(lambda x: x[1:], mbs)
    (loss, grads), _ = jax.lax.scan(body, (loss, grads), rest)
  grad_norm = optax.global_norm(grads)
  adapters, opt_state, _ = cfg.optimizer.fused_apply(grads, opt_state, adapters, grad_norm)
  return adapters, opt_state, loss, grad_norm


lora_update_jit = jax.jit(
  lora_update, static_argnames=("cfg", "lcfg", "per_layer"), donate_argnums=(1, 2)
)


def step_config(model_cfg, optim, num_microbatches: int) -> step_lib.StepConfig:
  """The trainer's ``StepConfig`` for a GRPO update (as ``update_memory`` builds it)."""
  step = step_lib.make_train_step(
    model_config=model_cfg, optimizer=optim, objective="grpo", num_microbatches=num_microbatches,
    chunk_size=1024,
  )  # fmt: skip
  return step.keywords["cfg"]


def lora_update_memory(
  base_cfg: model.ModelConfig,
  lcfg: lora.LoraConfig,
  rows: int,
  tokens: int,
  *,
  microbatch_tokens: int = 32768,
  int8: bool = False,
  per_layer: bool = False,
) -> dict:
  """The compiled memory analysis of one ``lora_update`` (bytes), with the compile time.

  ``base_cfg.dtype`` is the base's storage dtype (bfloat16 for the usual setting);
  ``int8``: the base's projections and lm_head as int8 (``lora.quantize_int8``); ``per_layer``:
  merged inside the layer scan (``decoder_hook``)."""
  optim = OptimizerSpec.from_config(config_lib.base_config().optim, decay_steps=1000)
  base = jax.eval_shape(lambda: model.init_params(base_cfg, jax.random.key(0)))
  if int8:
    base = jax.eval_shape(lora.quantize_int8, base)
  adapters = lora.abstract_lora(base, lcfg)
  opt_state = jax.eval_shape(optim.init, adapters)
  num_microbatches = update_memory.num_microbatches_for(rows, tokens, microbatch_tokens)
  cfg = step_config(base_cfg, optim, num_microbatches)
  t0 = time.perf_counter()
  with decoder_hook() if per_layer else contextlib.nullcontext():
    lowered = lora_update_jit.lower(
      base, adapters, opt_state, update_memory.abstract_batch(rows, tokens), 1.0, 1.0,
      cfg=cfg, lcfg=lcfg, per_layer=per_layer,
    )  # fmt: skip
  compiled = lowered.compile()
  out = dict(
    rows=rows, tokens=tokens, rank=lcfg.rank, int8=int8, per_layer=per_layer,
    num_microbatches=num_microbatches,
    adapter_params=lora.count_lora_params(adapters), compile_s=round(time.perf_counter() - t0, 1),
  )  # fmt: skip
  out.update(update_memory.analysis_bytes(compiled))
  return out


def configs(model_name: str, attention: str = "blockwise"):
  """(full fine-tuning config: float32 masters, bfloat16 compute; LoRA base config: bfloat16)."""
  hf = HF_CONFIGS[model_name]
  full = model.ModelConfig.from_hf_dict(
    hf, dtype="float32", compute_dtype="bfloat16", remat=True, attention=attention
  )
  return full, full.replace(dtype="bfloat16")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default="Qwen/Qwen2.5-7B", choices=sorted(HF_CONFIGS))
  parser.add_argument("--shapes", default="1x4096", help="rows x tokens, ','")
  parser.add_argument("--rank", type=int, default=64)
  parser.add_argument("--alpha", type=float, default=128.0)
  parser.add_argument("--int8", action="store_true", help="also the int8 base")
  parser.add_argument(
    "--per-layer", action="store_true", help="also merged inside the layer scan (the hook)"
  )
  parser.add_argument("--no-full", action="store_true", help="skip full fine-tuning")
  parser.add_argument("--attention", default="blockwise")
  parser.add_argument("--microbatch-tokens", type=int, default=32768)
  parser.add_argument("--json-out", default="")
  args = parser.parse_args()
  full_cfg, base_cfg = configs(args.model, args.attention)
  lcfg = lora.LoraConfig(rank=args.rank, alpha=args.alpha)
  results = []
  print(f"| {args.model}: rows x tokens | update | arguments GB | temporaries GB | peak GB |")
  print("|---|---|---|---|---|")

  def row(name, r):
    results.append(dict(r, update=name, model=args.model))
    print(
      f"| {r['rows']} x {r['tokens']:,} | {name} | {r['argument_bytes'] / GB:.1f} | "
      f"{r['temp_bytes'] / GB:.1f} | {r['peak_bytes'] / GB:.1f} |",
      flush=True,
    )

  for shape in args.shapes.split(","):
    rows, tokens = (int(x) for x in shape.split("x"))
    kw = dict(microbatch_tokens=args.microbatch_tokens)
    for per_layer in (False, True) if args.per_layer else (False,):
      where = ", per-layer merge" if per_layer else ""
      for int8 in (False, True) if args.int8 else (False,):
        r = lora_update_memory(base_cfg, lcfg, rows, tokens, int8=int8, per_layer=per_layer, **kw)
        row(f"LoRA r={args.rank}, {'int8' if int8 else 'bf16'} base{where}", r)
    if not args.no_full:
      r = update_memory.full_update_memory(full_cfg, rows, tokens, **kw)
      row("full, f32 masters", r)
  if args.json_out:
    with open(args.json_out, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  main()
