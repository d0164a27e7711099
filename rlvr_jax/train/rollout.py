"""Rollout collection: prompts -> G samples each -> rewards -> advantages (host orchestration).

``Collector.collect(params, ...)`` returns one rollout batch of exactly P groups of G rows:

1. take P_gen prompts from the train stream, format (chat template) and left-pad them (with several
   processes each loads and formats only its contiguous share, and the token ids are gathered into
   the whole batch: ``train.layout.Layout``);
2. ``sampling.generate`` G completions per prompt (keys from the run key, the step, the
   generation round and each prompt's global data index, so samples do not depend on batching);
3. decode and submit the completions to the ``RewardRuntime`` (worker processes, per-item
   timeouts; failed items get NaN and are excluded from advantages); while the workers score, the
   device computes the no-grad scoring passes this batch needs (old log-probs for several updates
   per batch, reference log-probs, the min-p proxy log-probs of an objective with a
   ``proxy_logp`` input): JAX dispatch is asynchronous, so the two overlap;
4. groups the configured filter rejects (``rl.group_filter``, ``advantages.GROUP_FILTERS``; by
   default zero-variance: constant *outcome*, METHODS.md 2.11) are kept with A = 0 (``keep``),
   masked out of the loss and its normalisers (``mask``), or dropped and refilled by generating
   more prompts until P informative groups are found (``refill``, dynamic sampling, METHODS.md 6.1; after
   ``rl.max_gen_batches`` rounds the batch is completed with masked zero-variance groups and
   ``rollout/refill_short`` is logged);
5. advantages from the configured estimator over the P kept groups, given what its spec reads
   (``EstimatorSpec.reads``: the rewards; the completion mask; the answers' ids; the reward of one
   extra greedy row per prompt, which step 2 then generates; the reward components; per-token
   rewards); its extra outputs become per-token objective inputs and its state is threaded
   through the run.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax import advantages as adv_lib
from rlvr_jax import data as data_lib
from rlvr_jax import regularizers, sampling
from rlvr_jax.rewards import extract_answer
from rlvr_jax.train import branching, hints_round, methods, retries, reward_results, tree_round
from rlvr_jax.train import config as config_lib
from rlvr_jax.train import lookahead_round as lookahead_lib
from rlvr_jax.train import model_rewards as model_rewards_lib
from rlvr_jax.train import step as step_lib
from rlvr_jax.train.layout import Layout


@dataclasses.dataclass
class RolloutBatch:
  """P groups x G rows, host (numpy) arrays, group ordered.

  ``completion_mask`` already has masked (zero-variance / failed-only) groups removed.
  ``scores`` holds [B, T] arrays from the no-grad passes (``old_logp``, ``ref_logp``,
  ``proxy_logp``) when they were computed.
  """

  prompt_tokens: np.ndarray
  prompt_mask: np.ndarray
  tokens: np.ndarray
  completion_mask: np.ndarray
  sampler_logp: np.ndarray
  lengths: np.ndarray
  advantages: np.ndarray
  rewards: np.ndarray
  correct: np.ndarray
  scores: dict
  metrics: dict
  greedy_rewards: np.ndarray | None = (
    None  # [P] the greedy row's reward, when the estimator reads it
  )


def _left_pad(x: np.ndarray, width: int, value) -> np.ndarray:
  if x.shape[1] == width:
    return x
  pad = np.full((x.shape[0], width - x.shape[1]), value, x.dtype)
  return np.concatenate([pad, x], axis=1)


class Collector:
  """Builds rollout batches; see the module docstring.

  ``layout`` (a ``train.layout.Layout``, default one device) places the params for sampling and,
  with several processes, shares the host work: ``source`` is then this process's shard of the
  train stream (``Layout.shard_source``), so ``collect`` loads, formats and rewards only this
  process's prompts (``Layout.local_groups``) and gathers prompts, rollouts and rewards into the
  whole batch, the same on every process.
  """

  def __init__(self, *, config, model_config, tokenizer, reward_fn, runtime, source, layout=None):
    self.c, self.model_config, self.tokenizer = config, model_config, tokenizer
    self.reward_fn, self.runtime, self.source = reward_fn, runtime, source
    self.layout = layout if layout is not None else Layout()
    s = config.sampling
    if s.top_k or s.top_p < 1.0:
      self.strategy = sampling.Combined(
        temperature=s.temperature, top_k=s.top_k or None, top_p=s.top_p if s.top_p < 1 else None
      )
    else:
      self.strategy = sampling.Temperature(s.temperature)
    self.pad_id = tokenizer.pad_id
    self.score_fn = step_lib.make_score_fn(
      model_config=model_config,
      temperature=s.temperature,
      chunk_size=config.rl.logprob_chunk,
      num_microbatches=config.rl.num_microbatches,
    )
    # The methods, read from their specs: what to compute for them and what they read.
    self.objective = methods.objective(config.objective.name)
    self.estimator = methods.estimator(config.rl.advantage)
    self.estimator_kwargs = tuple(
      sorted((k, tuple(v) if isinstance(v, list) else v)
             for k, v in config_lib.advantage_kwargs(config).items())
    )  # fmt: skip
    self.group_filter = adv_lib.GROUP_FILTERS[config.rl.group_filter]
    self.model_reward_fn = None
    m = config.model_reward
    if m.name:  # on-device rewards (issue 17): one jitted no-grad pass, see train/model_rewards
      marker = tuple(tokenizer.encode(m.marker, add_special_tokens=False)) if m.marker else ()
      self.model_reward_fn = model_rewards_lib.make_model_reward_fn(
        model_config=model_config,
        kind=m.name,
        marker_ids=marker,
        pad_id=self.pad_id,
        chunk_size=config.rl.logprob_chunk,
      )

  # ------------------------------------------------------------------ pieces
  def prompts(self, records):
    d = self.c.data
    texts = data_lib.format_prompts(
      records, self.tokenizer, chat_template=d.chat_template, system_prompt=d.system_prompt
    )
    ids, mask = data_lib.encode_prompts(
      texts, self.tokenizer, add_special_tokens=d.add_special_tokens, bucket=d.prompt_bucket
    )
    return texts, ids, mask

  def sample(self, params, records, *, key, strategy=None, num_samples=None):
    """(prompt texts, rollout of every row) for ``records``, the whole batch: with several
    processes every process passes the same records (e.g. the held-out set)."""
    with self.layout.context():
      texts, ids, mask = self.prompts(records)
      prompt_ids = np.asarray([r.get("index", i) for i, r in enumerate(records)], np.int32)
      rollout = self._generate(
        self.layout.sampling_params(params), ids, mask, prompt_ids, key, strategy, num_samples
      )
    return texts, rollout

  def _sample_local(self, params, records, *, key, greedy_row=False):
    """Like ``sample`` for this process's records (each with its global ``index``) of a batch;
    ``params`` already in the sampling layout. Returns this process's texts, every row's rollout.

    ``greedy_row``: G + 1 rows per prompt, the last one greedy (per-row temperature 0, in the
    same ``generate`` call; a greedy baseline); the G sampled rows are those of a plain call."""
    texts, ids, mask = self.prompts(records)
    prompt_ids = np.asarray([r["index"] for r in records], np.int32)
    ids, mask, prompt_ids = self.layout.gather_prompts(ids, mask, prompt_ids, pad_id=self.pad_id)
    num_samples = temperatures = None
    if greedy_row:
      G = self.c.sampling.num_samples
      num_samples, temperatures = G + 1, [self.c.sampling.temperature] * G + [0.0]
    return texts, self._generate(
      params, ids, mask, prompt_ids, key, None, num_samples, temperatures
    )

  def _generate(
    self, params, ids, mask, prompt_ids, key, strategy, num_samples, temperatures=None, *,
    max_new_tokens=None, max_lengths=None, buckets=None,
  ):  # fmt: skip
    """The configured engine on prompts [P, S]; by default ``sampling.max_new_tokens``, no
    per-row budgets (``max_lengths``) and the prompts' own width as the only bucket."""
    s = self.c.sampling
    num_samples = num_samples or s.num_samples
    engine = {}
    if s.engine == "continuous":
      # Slots beyond the call's rows are never used: N = min(num_slots, B).
      rows = ids.shape[0] * num_samples
      engine = dict(num_slots=min(s.num_slots, rows) if s.num_slots else rows)
    generate = sampling.generate if s.engine == "static" else sampling.continuous.generate
    rollout = generate(
      params,
      ids,
      mask,
      config=self.model_config,
      num_samples=num_samples,
      strategy=strategy or self.strategy,
      key=key,
      max_new_tokens=max_new_tokens or s.max_new_tokens,
      stop_tokens=tuple(self.tokenizer.eos_ids),
      prompt_ids=prompt_ids,
      pad_id=self.pad_id,
      buckets=buckets or (ids.shape[1],),
      phase_steps=s.phase_steps,
      temperatures=temperatures,
      max_lengths=max_lengths,
      **engine,
    )
    return self.layout.gather_rollout(rollout)

  def submit_rewards(self, texts, records, rollout, num_samples):
    """Decodes every row and scores this process's groups (``Layout.local_groups``) of the whole
    batch ``records`` (every process passes the same); returns (completions of every row, future
    of every row's ``RewardResult``)."""
    g0, g1 = self.layout.local_groups(len(records))
    return self._submit_local(texts[g0:g1], records[g0:g1], rollout, num_samples, len(records))

  def _submit_local(self, texts, records, rollout, num_samples, num_groups):
    """``submit_rewards`` given only this process's ``texts`` and ``records``."""
    g0, g1 = self.layout.local_groups(num_groups)
    if len(records) != g1 - g0:
      raise ValueError(
        f"process {self.layout.process_index} holds {len(records)} of {num_groups} prompts, its "
        f"layout expects groups [{g0}, {g1}): shard the source with Layout.shard_source"
      )
    tokens = np.asarray(rollout.tokens)
    cmask = np.asarray(rollout.completion_mask)
    # Every row's text (the host loop may use them, e.g. for answer ids): decoding is cheap.
    completions = self.tokenizer.decode_batch(tokens, cmask)
    rows = slice(g0 * num_samples, g1 * num_samples)
    fields = reward_results.reward_fields(records, num_samples, self.c.reward.example_fields)
    prompts = [t for t in texts for _ in range(num_samples)]
    future = self.runtime.submit(
      self.reward_fn,
      prompts,
      completions[rows],
      completion_lengths=cmask[rows].sum(-1).tolist(),
      group_size=num_samples,
      **fields,
    )
    return completions, self.layout.gather_rewards(future, num_groups, num_samples)

  def _scores(
    self, params, ref_params, rollout, *, need_old: bool, prm_params=None, answers=None,
    rows_per_prompt: int,
  ):  # fmt: skip
    """Dispatches the no-grad passes (async); returns a dict of device [B_gen, T] arrays (and
    the [B_gen] ``model_reward`` / ``model_reward/*`` of ``config.model_reward``).
    ``rows_per_prompt``: G_gen, the rows ``generate`` made per prompt (G, or G + 1 with a
    greedy row)."""
    out = {}
    t = rollout.tokens.shape[1]
    tokens, positions = step_lib.sequence_inputs(
      rollout.prompt_tokens, rollout.prompt_mask, rollout.tokens
    )
    # ``generate`` returns each prompt's G_gen rows side by side, so whole micro-batches of groups
    # can run each prompt once (rl.share_prompts).
    G, B = rows_per_prompt, rollout.prompt_tokens.shape[0]
    shared = self.c.rl.share_prompts and step_lib.whole_groups(B, G, self.c.rl.num_microbatches)
    score = functools.partial(self.score_fn, prompt_group=G if shared else 1)
    if need_old:
      out["old_logp"], _ = score(params, tokens, positions, t)
    if ref_params is not None:
      out["ref_logp"], _ = score(ref_params, tokens, positions, t)
    if prm_params is not None:  # the implicit PRM (a second parameter tree)
      out["prm_logp"], _ = score(prm_params, tokens, positions, t)
    if self.model_reward_fn is not None:
      out.update(
        model_rewards_lib.score(
          self.model_reward_fn, self.c.model_reward, self.tokenizer, params, rollout, answers
        )
      )
    for inp in self.objective.inputs_from("proxy_logp"):
      out[inp.name] = proxy_logprobs(
        params, tokens, positions, num_completion=t, model_config=self.model_config
      )
    return out

  # ------------------------------------------------------------------ main entry
  def collect(
    self, params, *, key, ref_params=None, need_old=False, adv_state=None, prm_params=None
  ):
    """One rollout batch of P groups; returns (RolloutBatch, new advantage state)."""
    with self.layout.context():
      params = self.layout.sampling_params(params)
      ref_params = self.layout.sampling_params(ref_params)
      prm_params = self.layout.sampling_params(prm_params)
      return self._collect(params, key, ref_params, need_old, adv_state, prm_params)

  def _collect(self, params, key, ref_params, need_old, adv_state, prm_params=None):
    c = self.c
    P = c.rl.prompts_per_step
    refill = c.rl.zero_variance == "refill"
    rounds = c.rl.max_gen_batches if refill else 1
    groups, spare, metrics = [], [], {"time/sample": 0.0, "time/reward": 0.0}
    reward_metrics = []
    scoring = dict(ref_params=ref_params, need_old=need_old, prm_params=prm_params)
    for n in range(rounds):
      records = self.source.take(P)  # this process's share of the P prompts
      texts, round_groups = self._round(
        params, records, jax.random.fold_in(key, n), P, metrics, reward_metrics, **scoring
      )
      if c.hints.enabled:  # GHPO: failed groups again with hints (train/hints_round.py)
        round_groups = hints_round.hinted_groups(
          self, params, records, round_groups, key=jax.random.fold_in(key, 104729 + n),
          metrics=metrics, reward_metrics=reward_metrics, **scoring,
        )  # fmt: skip
      for g in round_groups:
        (spare if (refill and g["zero_var"]) else groups).append(g)
      if not refill or len(groups) >= P:
        break
    metrics["rollout/num_gen_batches"] = float(n + 1)
    if refill:
      metrics["rollout/kept_frac"] = len(groups) / float((n + 1) * P)
      metrics["rollout/refill_short"] = float(max(P - len(groups), 0))
      groups = (groups + spare)[:P]
    return self._assemble(groups, metrics, reward_metrics, adv_state)

  def _round(
    self, params, records, key, num_groups, metrics, reward_metrics, *, ref_params, need_old,
    prm_params,
  ):  # fmt: skip
    """Samples, scores and rewards the groups of ``records`` (this process's share of
    ``num_groups``); adds to ``metrics`` / ``reward_metrics``. Returns (prompt texts, the
    ``num_groups`` group dicts ``_assemble`` reads)."""
    c = self.c
    P, G = num_groups, c.sampling.num_samples
    reads = self.estimator.reads
    greedy_row = "greedy_rewards" in reads
    G_gen = G + 1 if greedy_row else G  # rows generated per prompt (+ a greedy row to score)
    t0 = time.perf_counter()
    tree = latr = None
    if "tree_values" in reads:  # SPO-tree: the G rows are a tree's leaves (train/tree_round.py)
      texts, rollout, tree = tree_round.sample_tree(self, params, records, key=key)
    elif c.latr.enabled:  # LATR: roots and lookahead branches (train/lookahead_round.py)
      texts, rollout, latr = lookahead_lib.sample_lookahead(self, params, records, key=key)
    else:
      texts, rollout = self._sample_local(params, records, key=key, greedy_row=greedy_row)
    jax.block_until_ready(rollout.tokens)
    t1 = time.perf_counter()
    metrics["time/sample"] += t1 - t0
    # Every token sampled this step (branch and retry rounds add theirs): the budget that
    # methods which sample more than G rows per prompt are compared at.
    if tree is not None:  # the leaves share prefixes: the levels' own count (train/tree_round.py)
      sampled = tree["sampled_tokens"]
    elif latr is not None:  # its own count, pruned windows too (train/lookahead_round.py)
      sampled = latr["latr/sampled_tokens"]
      _add_metrics(metrics, latr)
    else:
      sampled = np.asarray(rollout.completion_mask).sum()
    _add_metrics(metrics, {"rollout/sampled_tokens": float(sampled)})
    completions, future = self._submit_local(texts, records, rollout, G_gen, P)
    # Dispatched while the reward workers score (asynchronous dispatch): the two overlap.
    answers = [r.get("answer", "") for r in records for _ in range(G_gen)]
    scores = self.layout.gather_rollout(
      self._scores(
        params,
        ref_params,
        rollout,
        need_old=need_old,
        prm_params=prm_params,
        answers=answers,
        rows_per_prompt=G_gen,
      )  # fmt: skip
    )
    result = future.result()
    metrics["time/reward"] += time.perf_counter() - t1
    reward_metrics.append(result.metrics)
    reward_results.log_reward_failures(result)
    host = jax.tree.map(np.asarray, rollout)
    scores = {k: np.asarray(v) for k, v in scores.items()}
    rewards = result.rewards.reshape(P, G_gen)
    if "model_reward" in scores:  # R = R_host + w R_model (or w R_model with replace)
      rewards, model_metrics = model_rewards_lib.apply(scores, result.rewards, self.c.model_reward)
      rewards = rewards.reshape(P, G_gen)
      reward_metrics[-1] = {**reward_metrics[-1], **model_metrics}
    correct = np.asarray(result.info.get("correct", result.rewards), np.float32)
    correct = correct.reshape(P, G_gen)
    greedy = rewards[:, G] if greedy_row else np.full(P, np.nan, np.float32)
    rewards, correct = rewards[:, :G], correct[:, :G]  # the sampled rows
    retry_prefix = None
    if retries.READS & set(reads):  # failed rows retried from a failure point (train/retries.py)
      host, rewards, correct, completions, scores, retry_prefix, retry_metrics = (
        retries.retry_failures(
          self, params, host, rewards, correct, completions, scores, records, texts,
          key=jax.random.fold_in(key, 6007), rows_per_prompt=G_gen, ref_params=ref_params,
          need_old=need_old, prm_params=prm_params,
        )
      )  # fmt: skip
      _add_metrics(metrics, retry_metrics)
      metrics["rollout/sampled_tokens"] += retry_metrics["retry/tokens"]
    zero_var = np.asarray(self.group_filter.fn(jnp.asarray(correct)))
    row_inputs = _row_inputs(result, reads, P * G_gen)
    if retry_prefix is not None:
      row_inputs["retry_prefix"] = retry_prefix
    if tree is not None:  # SPO-tree: node values and segments of the leaves (train/tree_round.py)
      row_inputs.update(tree_round.tree_inputs(c, host, rewards, tree))
      _add_metrics(metrics, tree["metrics"])
    if "prm_logp" in scores:  # the implicit PRM's token rewards (train/implicit_prm.py)
      row_inputs["prm_token_rewards"] = np.asarray(
        adv_lib.implicit_process_rewards(
          scores.pop("prm_logp"), scores["ref_logp"], host.completion_mask,
          beta=c.implicit_prm.beta,
        )
      )  # fmt: skip
    if "segment_values" in reads:  # SPO: Monte Carlo values of prefixes (train/branching)
      spo_inputs, spo_metrics = branching.segment_values(
        self, params, host, rewards, records, texts, key=jax.random.fold_in(key, 7919)
      )
      row_inputs.update(spo_inputs)
      _add_metrics(metrics, spo_metrics)
      metrics["rollout/sampled_tokens"] += spo_metrics["spo/branch_tokens"]
    groups = []
    for p in range(P):
      rows = slice(p * G_gen, p * G_gen + G)
      groups.append(dict(
        prompt_tokens=host.prompt_tokens[rows],
        prompt_mask=host.prompt_mask[rows],
        tokens=host.tokens[rows],
        completion_mask=host.completion_mask[rows],
        sampler_logp=host.sampler_logp[rows],
        lengths=host.lengths[rows],
        truncated=host.truncated[rows],
        rewards=rewards[p],
        correct=correct[p],
        zero_var=bool(zero_var[p]),
        greedy_reward=greedy[p],
        completions=completions[rows],
        scores={k: v[rows] for k, v in scores.items()},
        inputs={k: v[rows] for k, v in row_inputs.items()},
      ))  # fmt: skip
    return texts, groups

  def _assemble(self, groups, metrics, reward_metrics, adv_state):
    c = self.c
    width = max(g["prompt_tokens"].shape[1] for g in groups)
    cat = lambda k: np.concatenate([g[k] for g in groups], axis=0)
    prompt_tokens = np.concatenate(
      [_left_pad(g["prompt_tokens"], width, self.pad_id) for g in groups], axis=0
    )
    prompt_mask = np.concatenate([_left_pad(g["prompt_mask"], width, False) for g in groups], 0)
    rewards = np.stack([g["rewards"] for g in groups])
    correct = np.stack([g["correct"] for g in groups])
    zero_var = np.array([g["zero_var"] for g in groups])
    valid = np.isfinite(rewards)
    completion_mask = cat("completion_mask")
    scores = {k: np.concatenate([g["scores"][k] for g in groups], 0) for k in groups[0]["scores"]}
    adv, extras, adv_state, greedy_rewards = self._advantages(
      groups, rewards, valid, completion_mask, adv_state
    )
    for k, v in extras.items():  # the estimator's extra outputs: per-token objective inputs
      v = np.asarray(v, np.float32)
      scores[k] = (v.reshape(-1, 1) if v.ndim == 2 and v.shape != completion_mask.shape else v) * (
        completion_mask
      )
    if greedy_rewards is not None:
      metrics["reward/greedy_mean"] = float(np.nanmean(greedy_rewards))
    if c.rl.zero_variance in ("mask", "refill"):
      row_keep = np.repeat(~zero_var, rewards.shape[1])
      completion_mask = completion_mask & row_keep[:, None]
    if "retry_prefix" in groups[0]["inputs"]:  # pivotal credit: no shared prefix in the loss
      shared = np.concatenate([g["inputs"]["retry_prefix"] for g in groups])
      completion_mask = np.asarray(adv_lib.pivotal_mask(completion_mask, shared))
    # Rows whose reward failed carry no signal (A = 0): drop them from the normalisers too.
    completion_mask = completion_mask & valid.reshape(-1)[:, None]
    lengths = cat("lengths")
    finite_r = rewards[valid]
    finite_c = correct[np.isfinite(correct)]
    flat_c = correct.reshape(-1)
    # Completion length by outcome (NaN when a step has no row of that outcome): per-sequence
    # length normalisation of the loss is said to let wrong answers grow long (arXiv 2503.20783).
    by_outcome = lambda rows: float(lengths[rows].mean()) if rows.any() else float("nan")
    metrics.update(
      {
        "reward/mean": float(finite_r.mean()) if finite_r.size else float("nan"),
        "accuracy/mean": float(finite_c.mean()) if finite_c.size else float("nan"),
        "length/mean": float(lengths.mean()),
        "length/max": float(lengths.max()),
        "length/correct_mean": by_outcome(flat_c > 0.5),
        "length/incorrect_mean": by_outcome(flat_c <= 0.5),
        "length/truncated_frac": float(cat("truncated").mean()),
        "groups/zero_var_frac": float(zero_var.mean()),
        "reward/fail_frac": float((~valid).mean()),
        "advantage/abs_mean": float(np.abs(adv).mean()),
      }
    )
    metrics.update(reward_results.merge_reward_metrics(reward_metrics, exclude=metrics))
    batch = RolloutBatch(
      prompt_tokens=prompt_tokens,
      prompt_mask=prompt_mask,
      tokens=cat("tokens"),
      completion_mask=completion_mask,
      sampler_logp=cat("sampler_logp"),
      lengths=lengths,
      advantages=(adv.reshape(-1) if self.estimator.level == "sequence" else adv).astype(
        np.float32
      ),
      rewards=rewards,
      correct=correct,
      scores=scores,
      metrics=metrics,
      greedy_rewards=greedy_rewards,
    )
    return batch, adv_state

  def _advantages(self, groups, rewards, valid, completion_mask, adv_state):
    """(advantages [P, G] or [B, T], extra objective inputs, estimator state, greedy rewards):
    the configured estimator run on what its spec reads."""
    reads = self.estimator.reads
    inputs = {"rewards": rewards, "valid": valid}
    greedy_rewards = None
    if "completion_mask" in reads:
      inputs["completion_mask"] = completion_mask
    if "completion_tokens" in reads:
      inputs["completion_tokens"] = np.concatenate([g["tokens"] for g in groups], axis=0)
    if "answer_ids" in reads:
      inputs["answer_ids"] = answer_ids(groups)
    if "greedy_rewards" in reads:
      greedy_rewards = np.array([g["greedy_reward"] for g in groups], np.float32)
      inputs["greedy_rewards"] = greedy_rewards
    # The extra rounds' per-row inputs (train/branching.py, tree_round.py, retries.py).
    extra_rounds = branching.READS | tree_round.READS | retries.READS
    for k in ("reward_components", "token_rewards", "prm_token_rewards", *sorted(extra_rounds)):
      if k in reads:
        v = np.concatenate([g["inputs"][k] for g in groups], axis=0)
        inputs[k] = v.reshape(*rewards.shape, -1) if k == "reward_components" else v
    out = estimate(
      {k: jnp.asarray(v) for k, v in inputs.items()}, adv_state, spec=self.estimator,
      hp=self.estimator_kwargs,
    )  # fmt: skip
    extras = {k: np.asarray(v) for k, v in out.extras.items()}
    return np.asarray(out.advantages), extras, out.state, greedy_rewards


def _add_metrics(metrics: dict, more: dict) -> None:
  """Adds an extra round's metrics into the step's (summed over the step's rounds)."""
  for k, v in more.items():
    metrics[k] = metrics.get(k, 0.0) + v


def _row_inputs(result, reads, num_rows: int) -> dict:
  """Per-row estimator inputs taken from the reward result: ``reward_components`` [B, K] (the
  ``<component>/reward`` columns of a component reward, in name order) and ``token_rewards``."""
  out = {}
  if "reward_components" in reads:
    keys = sorted(k for k in result.info if k.endswith("/reward"))
    if not keys:
      raise ValueError(
        "the advantage estimator reads reward_components, but the reward has no components "
        "(configure reward.components)"
      )
    out["reward_components"] = np.stack([np.asarray(result.info[k], np.float32) for k in keys], -1)
  if "token_rewards" in reads:
    if result.token_rewards is None:
      raise ValueError(
        "the advantage estimator reads token_rewards, which the reward does not give"
      )
    out["token_rewards"] = np.asarray(result.token_rewards, np.float32).reshape(num_rows, -1)
  return out


def answer_ids(groups) -> np.ndarray:
  """[P, G] int ids of the extracted answers, equal within a group iff the answers are equal
  (answer consistency). Completions without an extractable answer get an id of their own."""
  out = np.zeros((len(groups), len(groups[0]["completions"])), np.int32)
  for p, g in enumerate(groups):
    seen = {}
    for j, text in enumerate(g["completions"]):
      ans = extract_answer(text, ("answer_tag", "boxed", "last_number"))
      key = ans if ans is not None else ("none", j)
      out[p, j] = seen.setdefault(key, len(seen))
  return out


@functools.partial(jax.jit, static_argnames=("spec", "hp"))
def estimate(inputs, state, *, spec, hp):
  """``spec.compute(inputs, state, **dict(hp))`` jitted once per (estimator spec, settings)."""
  return spec.compute(inputs, state, **dict(hp))


@functools.partial(jax.jit, static_argnames=("num_completion", "model_config", "min_p"))
def proxy_logprobs(params, tokens, positions, *, num_completion, model_config, min_p=0.02):
  """Proxy log-probs [B, T] of the min-p filtered policy at temperature 1 (one matmul pass
  over token tiles of the unembedding: never the [B, T, V] logits)."""
  h, unembed, targets = step_lib.completion_hidden(
    params, tokens, positions, num_completion=num_completion, model_config=model_config
  )
  return regularizers.min_p_proxy_logp_from_hidden(h, unembed, targets, min_p=min_p)
