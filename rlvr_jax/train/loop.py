"""The host loop: build -> (warm start) -> evaluate -> RL steps -> evaluate -> plot.

One RL step (``Trainer.rl_step``):

  rollout batch (train.rollout.Collector: sample G per prompt, rewards in worker processes,
    advantages, dynamic sampling)
  -> rl.num_epochs x rl.num_minibatches optimiser updates (train.step; groups are shuffled
     between epochs with a key derived from (seed, step, epoch), each minibatch's normalisers
     N_tok / N_seq are computed here over the whole minibatch)
  -> metrics (JSONL, TensorBoard, progress bar) -> checkpoint every ``checkpoint.every`` steps.

Placement (one device, a mesh, several processes) is a ``train.layout.Layout`` passed to the
Trainer: it places the state, the minibatches and the sampler's params, shards the prompt stream
over processes, and gathers prompts, rollouts and rewards; ``train.sharded.MeshTrainer`` is the
Trainer with a ``MeshLayout``.

LoRA (``config.lora.rank > 0``, ``train.lora_training``): ``state.params`` holds the adapters only
and the frozen base (``self.base``) goes to every train step as a non-donated argument; the
sampler and the scoring passes read the merged policy, computed once per RL step
(``policy_params``); the reference policy is the base itself; checkpoints hold the adapters and
their optimiser state (the base is rebuilt from the config); a complete run from a Hugging Face
model writes ``workdir/peft_adapter``.

Exact resume: every source of randomness is a deterministic function of (seed, step, data position), the
data position and advantage-estimator state are in the checkpoint with the params, optimiser state
and run key, so ``N/2 steps, kill, resume, N/2 steps`` repeats an uninterrupted ``N`` steps.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax import checkpoint as ckpt_lib
from rlvr_jax import compilation
from rlvr_jax import data as data_lib
from rlvr_jax import metrics as metrics_lib
from rlvr_jax.train import (
  auxiliary_loss,
  build,
  evaluate,
  implicit_prm,
  lora_training,
  methods,
  multiturn,
  optimizer,
  packing,
  platform_info,
  rollout,
  rundir,
  sft,
  std_filter,
)
from rlvr_jax.train import config as config_lib
from rlvr_jax.train import step as step_lib
from rlvr_jax.train.layout import Layout
from rlvr_jax.train.state import TrainBatch, init_state


class Trainer:
  """Owns the run: model, data, reward runtime, jitted step, writers, checkpoints.

  ``layout`` (``train.layout.Layout``, default one device) says where the state, batches and
  sampler params live and how several processes share the host work. With several processes
  every process constructs the same Trainer; checkpoints are written collectively into
  ``config.workdir``, only the primary process logs there, the others into
  ``<workdir>/process_<i>``.

  The workdir's lifecycle is ``train.rundir``'s: a resume of a different experiment raises
  ``ConfigError`` here; for a run already complete (``self.finished``, its summary) nothing is
  built and ``run()`` returns that summary without writing anything.
  """

  def __init__(self, config, *, log=print, layout: Layout | None = None):
    config_lib.validate(config)
    self.layout = layout if layout is not None else Layout()
    config_lib.check_context(config, self.layout.context_size)  # model.attention='ring' <=> context
    if not self.layout.is_primary:
      log = _quiet
    self.c, self.log = config, log
    c = config
    # JAX's persistent compilation cache (process-wide): what an earlier run compiled is loaded.
    compilation.configure_cache(c.compilation.cache_dir)
    self.runtime = None
    self.multiturn = bool(c.env.id)  # environment episodes instead of single-turn prompts
    os.makedirs(c.workdir, exist_ok=True)
    self.checkpointer = self._open_checkpoints()
    # The run directory's lifecycle (train.rundir): refuse a different experiment, and leave a
    # finished run untouched.
    latest = self.checkpointer.latest_step() if c.checkpoint.resume else None
    if latest is not None:
      rundir.check_resume(c, latest)
    self.finished = rundir.finished_summary(c, latest)
    # Every process has read config.json / summary.json before the primary rewrites them.
    self.layout.barrier("rundir_checked")
    if self.finished is not None:
      return
    if self.layout.is_primary:
      rundir.write_text_atomic(
        os.path.join(c.workdir, "config.json"), c.to_json_best_effort(indent=2)
      )
    t0 = time.perf_counter()
    what = {"tiny": "initialising", "smollm2": "loading SmolLM2 weights"}.get(c.model.source)
    log(f"{what or f'loading weights from {c.model.path}'} ...")
    self.tokenizer, params, self.model_config = build.build_tokenizer_and_model(c)
    # Context parallelism: only the update runs ring attention on sequence-split rows. The
    # sampler, the scoring passes, the warm start and the PRM keep sequences unsplit
    # (SAMPLE_RULES) and use the platform's kernel ('auto').
    self.update_model_config = self.model_config
    if self.model_config.attention == "ring":
      self.model_config = dataclasses.replace(self.model_config, attention="auto")
    aux_step = auxiliary_loss.step_arguments(c, self.tokenizer)  # {} when off; before workers
    self.auxiliary = aux_step.get("auxiliary")
    num = sum(int(np.size(x)) for x in jax.tree.leaves(params))
    log(f"model ready: {num / 1e6:.2f} M parameters ({time.perf_counter() - t0:.1f} s)")
    # LoRA: the state trains adapters of a frozen base (train.lora_training); None: full weights.
    self.lora = lora_training.lora_config(c)
    self.base = self.merge_fn = None
    if self.lora is not None:
      self.base = lora_training.build_base(params, c)
      params = lora_training.init_adapters(self.base, self.lora, c.seed)  # the trained "params"
      self.merge_fn = lora_training.make_merge_fn(self.lora, self.model_config.activation_dtype)
      log(
        f"LoRA r={self.lora.rank} alpha={self.lora.alpha:g} on {','.join(self.lora.targets)}: "
        f"{lora_training.count(params) / 1e6:.3f} M trained parameters"
        + (" (int8 base)" if c.lora.int8_base else "")
      )
    source, self.heldout = data_lib.build_sources(c.data)
    self.source = self.layout.shard_source(source)  # this process's share of every batch
    if self.multiturn:  # rewards come from the environments: no reward worker pool
      self.collector = multiturn.MultiTurnCollector(
        config=c, model_config=self.model_config, tokenizer=self.tokenizer, layout=self.layout
      )
    else:
      self.runtime = build.build_runtime(c)
      self.collector = rollout.Collector(
        config=c,
        model_config=self.model_config,
        tokenizer=self.tokenizer,
        reward_fn=build.build_reward(c),
        runtime=self.runtime,
        source=self.source,
        layout=self.layout,
      )
    r = c.rl
    self.updates_per_step = r.num_epochs * r.num_minibatches
    # Hashable values: equal configurations share one compiled step (train.step.StepConfig).
    self.optimizer = optimizer.OptimizerSpec.from_config(
      c.optim, decay_steps=r.num_steps * self.updates_per_step
    )
    kwargs = config_lib.objective_kwargs(c)
    kwargs.setdefault(
      "seq_norm_constant", float(c.env.max_tokens if c.env.id else c.sampling.max_new_tokens)
    )
    kwargs.setdefault("group_size", c.sampling.num_samples)
    for key, value in config_lib.mismatch_defaults(c).items():  # bfloat16: TIS unless set
      kwargs.setdefault(key, value)
    objective, estimator = methods.objective(c.objective.name), methods.estimator(r.advantage)
    step_kwargs = dict(
      model_config=self.update_model_config,
      optimizer=self.optimizer,
      objective=objective,
      objective_kwargs=kwargs,
      num_microbatches=r.num_microbatches,
      temperature=c.sampling.temperature,
      chunk_size=r.logprob_chunk,
      on_policy=self.updates_per_step == 1,
      fused_loss=config_lib.FUSED_LOSS[r.fused_loss],
      lora=self.lora,
      **aux_step,
    )
    self.plain_train_step = step_lib.make_train_step(**step_kwargs)
    # rl.share_prompts: the step that runs each group's prompt once, for the minibatches whose
    # micro-batches hold whole groups of one prompt each (checked per minibatch on the host;
    # ``train_step`` calls the one chosen for the minibatch).
    G = c.sampling.num_samples
    self.shared_train_step, self.share_next = None, False
    # rl.packing: minibatches are packed on the host (``_minibatch``); packed rows hold whole
    # sequences, so they replace the shared-prompt step.
    self.packing = config_lib.packing_layout(
      c, jax.default_backend(), context=self.layout.context_size
    )
    # Balanced micro-batches change nothing but micro-batch-scope statistics (scope='micro').
    self.pack_balance = kwargs.get("scope", "step") != "micro"
    # (Not with a context axis: the shared-prompt forward does not run ring attention.)
    if r.share_prompts and G > 1 and self.packing is None and self.layout.context_size == 1:
      self.shared_train_step = step_lib.make_train_step(**step_kwargs, prompt_group=G)
    # State carried between steps by the methods (their specs say what), checkpointed.
    extra = step_lib.init_extra(objective, kwargs)
    if estimator.stateful:
      extra["estimator"] = estimator.init_state(config_lib.advantage_kwargs(c))
    extra.update(std_filter.init_std_filter_extra(c))
    # The reference policy (the PRM's token reward is relative to π_ref too); with LoRA it is the
    # base itself (``reference_params``), no copy.
    if (r.use_reference or c.implicit_prm.enabled) and self.lora is None:
      # A copy: the train step donates the state, and an alias of ``params`` inside it would be
      # donated twice (INVALID_ARGUMENT at the first update).
      extra["ref_params"] = jax.tree.map(jnp.copy, params)
    self.prm_step = None
    if c.implicit_prm.enabled:  # the implicit PRM: a second parameter tree with its own optimiser
      self.prm_optimizer = implicit_prm.prm_optimizer(c)
      extra.update(implicit_prm.init_prm_extra(params, self.prm_optimizer))
      self.prm_step = implicit_prm.make_prm_step(
        model_config=self.model_config,
        optimizer=self.prm_optimizer,
        beta=c.implicit_prm.beta,
        temperature=c.sampling.temperature,
        chunk_size=r.logprob_chunk,
      )
    self.state = init_state(params, self.optimizer, jax.random.key(c.seed), extra)
    self.layout.setup(
      self.state, model_config=self.model_config, optimizer=self.optimizer, lora=self.lora,
      base=self.base,
    )  # fmt: skip
    self.state = self.layout.place_state(self.state)
    if self.base is not None:
      self.base = self.layout.place_base(self.base)
    self.plain_train_step = self.layout.wrap_train_step(self.plain_train_step)
    if self.shared_train_step is not None:
      self.shared_train_step = self.layout.wrap_train_step(self.shared_train_step)
    self.train_step = self._train_step
    self.host_state = {"data": self.source.state(), "eval_before": None, "warm_start_done": False}
    if not self.layout.is_primary:  # checkpoints stay shared; logs, summaries, plots go elsewhere
      c = config.copy_and_resolve_references()
      c.workdir = os.path.join(config.workdir, f"process_{self.layout.process_index}")
      c.logging.progress = False
      os.makedirs(c.workdir, exist_ok=True)
      self.c = c

  # ------------------------------------------------------------------ set-up
  def _open_checkpoints(self) -> ckpt_lib.Checkpointer:
    """The workdir's checkpointer; with ``checkpoint.resume=False`` the old checkpoints are
    removed first (starting over in place)."""
    c = self.c
    directory = os.path.join(c.workdir, "checkpoints")
    if not c.checkpoint.resume and os.path.isdir(directory):
      if self.layout.is_primary:
        self.log(f"checkpoint.resume=False: starting over, removing {directory}")
        shutil.rmtree(directory)
      self.layout.barrier("rundir")
    return ckpt_lib.Checkpointer(
      directory, keep=c.checkpoint.keep, async_save=c.checkpoint.async_save
    )

  def restore_or_start(self) -> int:
    """Restore the latest complete checkpoint (if resuming), else warm start; returns the step."""
    with self.layout.context():
      step = self._restore_or_warm_start()
      self.state = self.layout.place_state(self.state)  # after a warm start, too
    return step

  def _restore_or_warm_start(self) -> int:
    c = self.c
    restored = self.checkpointer.restore(self.state) if c.checkpoint.resume else None
    if restored is not None:
      step, self.state, self.host_state = restored
      self.source.restore(self.host_state["data"])
      self.log(f"resumed from step {step} ({self.checkpointer.directory})")
      return int(step)
    if c.warm_start.num_steps > 0 and self.lora is not None:  # (config.validate refuses it)
      raise ValueError("no warm start in a LoRA run")
    if c.warm_start.num_steps > 0 and self.multiturn:
      t0 = time.perf_counter()
      params, _ = self.collector.warm_start(self.state.params, log=self.log)
      self.state = init_state(params, self.optimizer, self.state.key, dict(self.state.extra))
      self.host_state["warm_start_s"] = time.perf_counter() - t0
    elif c.warm_start.num_steps > 0:
      t0 = time.perf_counter()
      self.log(f"warm start: {c.warm_start.num_steps} supervised steps (the first compiles) ...")
      params, _ = sft.warm_start(
        self.state.params,
        source=build.warm_start_source(c),
        tokenizer=self.tokenizer,
        model_config=self.model_config,
        cfg=c.warm_start,
        max_new_tokens=c.sampling.max_new_tokens,
        log=self.log,
      )
      extra = dict(self.state.extra)
      if "ref_params" in extra:
        extra["ref_params"] = jax.tree.map(jnp.copy, params)  # not an alias (see __init__)
      if "prm_params" in extra:  # the PRM starts from the warm-started policy too
        extra.update(implicit_prm.init_prm_extra(params, self.prm_optimizer))
      self.state = init_state(params, self.optimizer, self.state.key, extra)
      self.host_state["warm_start_s"] = time.perf_counter() - t0
      self.log(f"warm start done ({self.host_state['warm_start_s']:.1f} s)")
    self.host_state["warm_start_done"] = True
    return 0

  # ------------------------------------------------------------------ the policy
  def policy_params(self):
    """The params the sampler and the scoring passes read: ``state.params``, or in a LoRA run
    the merge of the base and the adapters in the compute dtype (jitted; computed per call, so
    once per RL step and per evaluation, and dropped by the caller after use)."""
    if self.lora is None:
      return self.state.params
    with self.layout.context():
      return self.merge_fn(self.base, self.state.params)

  def reference_params(self):
    """The reference policy of ``rl.use_reference`` (and the implicit PRM), or None: the copy
    of the initial params in ``state.extra``; in a LoRA run the base itself, the policy with its
    adapters off (an int8 base dequantized, per call)."""
    if self.lora is None:
      return self.state.extra.get("ref_params")
    if not self.c.rl.use_reference:
      return None
    if lora_training.is_quantized_tree(self.base):
      with self.layout.context():
        return self.merge_fn(self.base, None)
    return self.base

  # ------------------------------------------------------------------ one RL step
  def _train_step(self, state, tb, num_tokens, num_seqs, key):
    """The update on one minibatch: the shared-prompt step when ``rl_step`` found that its groups
    share their prompts, else the plain one (both jitted, the state donated; a LoRA step also
    takes the frozen base)."""
    step = self.shared_train_step if self.share_next else self.plain_train_step
    if self.lora is not None:
      return step(state, tb, num_tokens, num_seqs, key, base=self.base)
    return step(state, tb, num_tokens, num_seqs, key)

  def _minibatch(self, batch: rollout.RolloutBatch, rows: np.ndarray):
    tokens, positions = step_lib.sequence_inputs(
      batch.prompt_tokens[rows], batch.prompt_mask[rows], jnp.asarray(batch.tokens[rows])
    )
    cmask = batch.completion_mask[rows]
    t = cmask.shape[1]
    adv = np.asarray(batch.advantages[rows])
    # [B] sequence advantages broadcast to the tokens; [B, T] (turn credit) used as they are.
    adv = (adv if adv.ndim == 2 else adv[:, None]) * cmask
    sampler_logp = batch.sampler_logp[rows]
    extras = {
      k: jnp.asarray(v[rows]) for k, v in batch.scores.items() if k not in ("old_logp", "ref_logp")
    }
    old = batch.scores.get("old_logp")
    ref = batch.scores.get("ref_logp")
    tb = TrainBatch(
      tokens=tokens,
      positions=positions,
      completion_mask=jnp.asarray(cmask),
      advantages=jnp.asarray(adv, jnp.float32),
      old_logp=jnp.asarray(old[rows] if old is not None else np.zeros((len(rows), t), np.float32)),
      sampler_logp=jnp.asarray(sampler_logp),
      ref_logp=None if ref is None else jnp.asarray(ref[rows]),
      extras=extras,
      aux=auxiliary_loss.row_inputs(
        self.auxiliary, jnp.asarray(np.asarray(batch.rewards, np.float32).reshape(-1)[rows])
      ),
    )
    num_tokens = float(cmask.sum())
    num_seqs = float((cmask.sum(-1) > 0).sum())
    if self.packing is not None:
      tb = packing.pack_batch(
        tb, num_microbatches=self.c.rl.num_microbatches, row_multiple=self.layout.row_multiple,
        layout=self.packing, balance=self.pack_balance,
      )  # fmt: skip
    # The update's padding in every layout, from the host rows (placed rows may span processes).
    padding = packing.padding_report(
      tb, num_microbatches=self.c.rl.num_microbatches, row_multiple=self.layout.row_multiple
    )
    return self.layout.place_batch(tb), num_tokens, num_seqs, padding

  def rl_step(self, step: int) -> dict:
    """One RL step (module docstring); returns its metrics."""
    with self.layout.context():
      return self._rl_step(step)

  def _rl_step(self, step: int) -> dict:
    c = self.c
    t0 = time.perf_counter()
    step_key = jax.random.fold_in(self.state.key, step)
    adv_state = self.state.extra.get("estimator")
    prm = {"prm_params": self.state.extra["prm_params"]} if self.prm_step is not None else {}
    batch, adv_state = self.collector.collect(
      self.policy_params(),  # (a LoRA run's merged tree lives only during the collection)
      key=step_key,
      ref_params=self.reference_params(),
      need_old=self.updates_per_step > 1,
      adv_state=adv_state,
      **prm,
    )
    if adv_state is not None:
      self.state = self.state.replace(extra={**self.state.extra, "estimator": adv_state})
    if std_filter.STATE_KEY in self.state.extra:  # drop low-spread groups (rl.std_filter)
      batch, filter_state = std_filter.apply_std_filter(
        batch, self.state.extra[std_filter.STATE_KEY], c.rl.std_filter
      )
      self.state = self.state.replace(
        extra={**self.state.extra, std_filter.STATE_KEY: filter_state}
      )
    t1 = time.perf_counter()
    P, G = c.rl.prompts_per_step, c.sampling.num_samples
    per_mb = P // c.rl.num_minibatches
    update_metrics, skipped_empty, shared, padding = [], 0, 0, []
    for epoch in range(c.rl.num_epochs):
      order = np.arange(P)
      if epoch > 0:
        order = np.random.default_rng([c.seed, step, epoch]).permutation(P)
      for m in range(c.rl.num_minibatches):
        groups = order[m * per_mb : (m + 1) * per_mb]
        rows = (groups[:, None] * G + np.arange(G)[None, :]).reshape(-1)
        tb, num_tokens, num_seqs, tb_padding = self._minibatch(batch, rows)
        if num_tokens == 0:  # every group masked (e.g. all zero-variance): nothing to learn
          skipped_empty += 1
          continue
        key = jax.random.fold_in(jax.random.fold_in(step_key, 1 + epoch), m)
        self.share_next = self.shared_train_step is not None and step_lib.shares_prompts(
          batch.prompt_tokens[rows], batch.prompt_mask[rows], G, c.rl.num_microbatches
        )
        shared += self.share_next
        padding.append(tb_padding)
        self.state, um = self.train_step(self.state, tb, num_tokens, num_seqs, key)
        update_metrics.append(um)
    prm_metrics = self._prm_update(batch) if self.prm_step is not None else {}
    # Placed like the old counter: a differently placed input would compile the step again.
    counter = jax.device_put(jnp.asarray(step + 1, jnp.int32), self.state.step.sharding)
    self.state = self.state.replace(step=counter)
    out = dict(batch.metrics)
    out.update(prm_metrics)
    if update_metrics:
      host = [jax.tree.map(float, jax.device_get(um)) for um in update_metrics]
      for k in host[0]:
        vals = [h[k] for h in host]
        out[k] = vals[0] if k.startswith("logp_gap/") else float(np.mean(vals))
    t2 = time.perf_counter()
    out["update/empty_skipped"] = float(skipped_empty)
    out["update/shared_prompts"] = shared / max(len(update_metrics), 1)  # rl.share_prompts
    for k in padding[0] if padding else ():  # the update's padding, unpacked and packed
      out[k] = float(np.mean([p[k] for p in padding]))
    out["update/num_skipped_total"] = float(self.state.num_skipped)
    out["time/update"] = t2 - t1
    out["time/rollout"] = t1 - t0
    out["time/step"] = t2 - t0
    return out

  def _prm_update(self, batch: rollout.RolloutBatch) -> dict:
    """One cross-entropy step of the implicit PRM on this rollout's outcome labels, in the
    same RL step as the policy update (train/implicit_prm.py); the PRM tree lives in ``state.extra``."""
    tokens, positions = step_lib.sequence_inputs(
      batch.prompt_tokens, batch.prompt_mask, jnp.asarray(batch.tokens)
    )
    labels = np.asarray(batch.correct, np.float32).reshape(-1)
    extra = dict(self.state.extra)
    extra["prm_params"], extra["prm_opt_state"], metrics = self.prm_step(
      extra["prm_params"],
      extra["prm_opt_state"],
      tokens,
      positions,
      jnp.asarray(batch.completion_mask),
      jnp.asarray(batch.scores["ref_logp"]),
      jnp.asarray(labels),
    )
    self.state = self.state.replace(extra=extra)
    return {k: float(v) for k, v in jax.device_get(metrics).items()}

  # ------------------------------------------------------------------ checkpoint / eval
  def save(self, step: int, *, force=False) -> None:
    self.host_state["data"] = self.source.state()
    state = self.state
    if self.c.checkpoint.async_save:  # the next train step donates the state's buffers
      state = jax.tree.map(jnp.copy, state)
    self.checkpointer.save(step, state, json.loads(json.dumps(self.host_state)), force=force)

  def evaluate(self) -> dict:
    t0 = time.perf_counter()
    with self.layout.context():
      if self.multiturn:
        out = self.collector.evaluate(self.policy_params())
      else:
        out = evaluate.evaluate(self.collector, self.policy_params(), self.heldout)
    out["eval/time_s"] = time.perf_counter() - t0
    return out

  # ------------------------------------------------------------------ the run
  def run(self) -> dict:
    c = self.c
    if self.finished is not None:  # train.rundir: nothing to do, nothing rewritten
      self.log(
        f"run complete ({c.rl.num_steps} RL steps): results in {c.workdir}/summary.json and "
        f"metrics.jsonl; nothing to do (a larger --config.rl.num_steps extends it)"
      )
      return self.finished
    start = self.restore_or_start()
    resume_step = start if start > 0 else None
    writer = metrics_lib.MetricsWriter(
      c.workdir,
      tensorboard=c.logging.tensorboard,
      resume_step=resume_step,
      # Killed during the final evaluation (it runs after the last save): it is redone.
      drop_eval_at=c.rl.num_steps if start == c.rl.num_steps else None,
    )
    if self.host_state.get("eval_before") is None:
      what = (
        f"{c.env.num_eval} held-out episodes"
        if self.multiturn
        else (f"{len(self.heldout)} held-out problems")
      )
      self.log(f"evaluating {what} (compiles the sampler) ...")
      before = self.evaluate()
      self.host_state["eval_before"] = before
      writer.write(0, before)
      self.log(_fmt("before RL", before) + f" ({before['eval/time_s']:.1f} s)")
    stop = c.rl.num_steps
    if c.max_steps_this_run > 0:
      stop = min(stop, start + c.max_steps_this_run)
    bar = metrics_lib.ProgressBar(c.rl.num_steps, start, enabled=c.logging.progress)
    say = bar.write if c.logging.progress else self.log  # self.log is silent off process 0
    t_run = time.perf_counter()
    last = {}
    for step in range(start, stop):
      if step == start:
        say("first RL step: compiling the sampler and the train step ...")
      last = self.rl_step(step)
      writer.write(step + 1, last)
      bar.update(last)
      if step == start:  # the ETA counts the steps after compilation only
        bar.restart_clock()
        say(
          f"first RL step done in {last['time/step']:.1f} s (rollout {last['time/rollout']:.1f} s,"
          f" update {last['time/update']:.1f} s, mostly compilation)"
        )
      done = step + 1
      if c.eval.every and done % c.eval.every == 0 and done < c.rl.num_steps:
        ev = self.evaluate()
        writer.write(done, ev)
        say(_fmt(f"step {done}", ev))
      if (c.checkpoint.every and done % c.checkpoint.every == 0) or done == stop:
        self.save(done)
    bar.close()
    summary = {
      "complete": stop == c.rl.num_steps,
      "rl_time_s": time.perf_counter() - t_run,
      "steps": stop,
      "last": last,
      "platform": platform_info.fingerprint(),
    }
    if stop == c.rl.num_steps:
      after = self.evaluate()
      writer.write(stop, after)
      summary.update(eval_before=self.host_state["eval_before"], eval_after=after)
      self.log(_fmt("before RL", self.host_state["eval_before"]))
      self.log(_fmt("after RL ", after))
    if self.lora is not None and stop == c.rl.num_steps and lora_training.exportable(c):
      summary["peft_adapter"] = self.export_adapter()
    self.checkpointer.wait()
    writer.close()
    with open(os.path.join(c.workdir, "summary.json"), "w") as f:
      json.dump(_jsonable(summary), f, indent=2)
    if c.logging.plot and stop == c.rl.num_steps:
      from rlvr_jax.train import plotting

      panels = plotting.MULTITURN_PANELS if self.multiturn else plotting.PANELS
      path = plotting.plot_runs([c.workdir], os.path.join(c.workdir, "curves.png"), panels=panels)
      self.log(f"curves: {path}")
      summary["plot"] = path
    return summary

  def export_adapter(self, path: str | None = None) -> str | None:
    """A LoRA run's adapters as a PEFT folder (default ``workdir/peft_adapter``, written by the
    primary process; collective with several processes); returns its path (None elsewhere).
    ``lora_training.export_merged`` turns it into merged Hugging Face safetensors."""
    if self.lora is None:
      raise ValueError("export_adapter: not a LoRA run (config.lora.rank = 0)")
    adapters = self.layout.gather_rollout(self.state.params)  # every tensor on this process
    if not self.layout.is_primary:
      return None
    path = lora_training.export_adapter(adapters, self.model_config, self.c, path)
    self.log(f"LoRA adapter (PEFT): {path}")
    return path

  # What a run holds on the device and in compiled code: dropped by ``close``.
  _RUN_HOLDINGS = (
    "state", "train_step", "plain_train_step", "shared_train_step", "prm_step", "base", "merge_fn",
  )  # fmt: skip

  def close(self) -> None:
    """Ends the run: waits for the checkpoint writes, stops the worker processes, and gives back
    the run's device buffers and compiled steps (``rlvr_jax.compilation``), so a process that
    runs many experiments stays the size of one. A closed Trainer keeps its config and
    ``finished`` summary; read ``state`` before closing."""
    try:
      self.checkpointer.close()
      if self.runtime is not None:
        self.runtime.close()
      if self.multiturn and hasattr(self, "collector"):
        self.collector.close()
    finally:
      for name in self._RUN_HOLDINGS:
        if hasattr(self, name):
          setattr(self, name, None)
      if hasattr(self, "collector"):
        self.collector.score_fn = None
      # The Trainer refers to itself (``train_step`` is a bound method): free it and what only
      # it held now, not at the next collection.
      gc.collect()


def _quiet(_: str) -> None:
  """The log function of the non-primary processes."""


def _fmt(label: str, ev: dict) -> str:
  parts = []
  for k, v in ev.items():
    if k == "eval/time_s" or k.endswith("_se"):
      continue
    se = ev.get(f"{k}_se")
    pm = "" if se is None or se != se else f"+-{se:.3f}"  # se != se: NaN (one problem)
    parts.append(f"{k.split('/', 1)[1]}={v:.3f}{pm}")
  return f"[{label}] held-out " + " ".join(parts)


def _jsonable(x):
  if isinstance(x, dict):
    return {k: _jsonable(v) for k, v in x.items()}
  if dataclasses.is_dataclass(x):
    return _jsonable(dataclasses.asdict(x))
  if isinstance(x, (bool, int, str)):
    return x
  try:
    return float(x)
  except (TypeError, ValueError):
    return str(x)


def train(config, *, log=print) -> dict:
  """Run an experiment end to end; returns a summary dict (also in ``workdir/summary.json``)."""
  trainer = Trainer(config, log=log)
  try:
    return trainer.run()
  finally:
    trainer.close()
