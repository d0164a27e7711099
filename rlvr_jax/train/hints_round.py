"""GHPO's hint rounds in the trainer (``config.hints``; Liu et al., arXiv 2507.10628).

After a rollout round (``rollout.Collector._round``), a group none of whose G rollouts succeeded
(``data.hints.needs_hint`` on the reward's ``correct``) is sampled again from its prompt with the
start of the record's reference solution appended (``hints.field``; ``data.hints.hinted_prompt``:
the first ``fractions[k]`` of its words, or of its tokenizer ids with ``hints.unit='tokens'``).
Stage k = 0, 1, ... runs only the groups that still fail, each at the next fraction; a group that
succeeds at stage k replaces its unhinted group in the batch (its prompt is the hinted one, so the
hint tokens are prompt: never in the loss), a group that fails at every stage stays as it was (a
zero-variance group, handled by ``rl.zero_variance``). Each stage samples, scores and rewards like
the first round (same strategy, engine, estimator inputs and reward workers) with its own key.

Metrics: ``hints/failed_groups`` (groups that needed a hint), ``hints/rescued`` (groups replaced
by a hinted one), ``hints/stages`` (hint stages run), ``hints/rows`` (rows the stages sampled, padding included).
One process only: the failing groups differ between processes.
"""

from __future__ import annotations

import math

import jax
import numpy as np

from rlvr_jax.data import hints
from rlvr_jax.train import branching


def hinted_groups(collector, params, records, groups, *, key, metrics, reward_metrics, **scoring):
  """``groups`` (one dict per record, ``Collector._round``) with the failed ones replaced by
  hinted groups that succeeded (see the module docstring)."""
  h = collector.c.hints
  if collector.layout.process_count > 1:
    raise NotImplementedError("hints.enabled (GHPO) runs on one process; this run has several")
  fractions = tuple(float(f) for f in h.fractions)
  failed = [
    int(p) for p in np.flatnonzero(hints.needs_hint(np.stack([g["correct"] for g in groups])))
  ]
  for p in failed:
    solution = records[p].get(h.field)
    if solution is None or not str(solution).strip():
      raise ValueError(
        f"hints.enabled (GHPO) needs each record's reference solution in field {h.field!r}; "
        f"record {records[p].get('index', p)} (prompt {str(records[p].get('prompt'))[:60]!r}) "
        "has none: set hints.field to the field that holds it"
      )
  tokenizer = {}
  if h.unit == "tokens":
    tok = collector.tokenizer
    tokenizer = dict(
      tokenize=lambda s: tok.encode(s, add_special_tokens=False), detokenize=tok.decode
    )
  out = list(groups)
  pending, stage, rescued, rows = failed, 0, 0, 0
  G = collector.c.sampling.num_samples
  # The scoring passes split a stage's rows into rl.num_microbatches equal parts.
  M = collector.c.rl.num_microbatches
  groups_per_microbatch = M // math.gcd(M, G)
  while pending:
    hinted = [
      dict(
        records[p],
        prompt=hints.hinted_prompt(
          records[p]["prompt"],
          str(records[p][h.field]),
          stage,
          marker=h.marker,
          fractions=fractions,
          **tokenizer,
        ),
      )  # fmt: skip
      for p in pending
    ]
    # The stage's group count varies: padded to a power of two (and whole micro-batches) with
    # repeats of the first group, dropped after: the sampler and scoring passes compile for a
    # few shapes only.
    padded = list(branching.padded_rows(np.arange(len(hinted)), groups_per_microbatch))
    _, new = collector._round(
      params, [hinted[i] for i in padded], jax.random.fold_in(key, stage), len(padded), metrics,
      reward_metrics, **scoring,
    )  # fmt: skip
    new = new[: len(hinted)]
    rows += len(padded) * G
    still = []
    for p, g in zip(pending, new, strict=True):
      success = not hints.needs_hint(g["correct"][None])[0]
      if success:
        out[p] = dict(g, hint_stage=stage + 1)
        rescued += 1
      elif hints.next_stage(stage, False, num_stages=len(fractions)) is not None:
        still.append(p)
    pending, stage = still, stage + 1
  counts = {"failed_groups": len(failed), "rescued": rescued, "stages": stage, "rows": rows}
  for name, count in counts.items():  # summed over the generation rounds of a step
    metrics[f"hints/{name}"] = metrics.get(f"hints/{name}", 0.0) + count
  return out
