"""GHPO's hint rounds in the trainer (``config.hints``, ``train/hints_round.py``): failed groups
are sampled again with growing hints until they succeed, the rescued group (its prompt hinted)
replaces the failed one, and a record without a solution is a clear error."""

import jax
import numpy as np
import pytest

from rlvr_jax.train import config as config_lib
from rlvr_jax.train.loop import Trainer

MARKER = " h:"


def half_hint(prompts, completions, *, demonstration, **fields):
  """1 when the prompt carries at least half of the worked solution as a hint, else 0: every
  unhinted group fails, stage 0 (a quarter) fails, stage 1 (half) succeeds."""
  out = []
  for p, demo in zip(prompts, demonstration, strict=True):
    hint = p.split(MARKER, 1)[1] if MARKER in p else ""
    out.append(float(len(hint) >= 0.5 * len(demo)))
  return np.array(out, np.float32)


def _config(tmp_path, **hints):
  return config_lib.tiny_config(
    tmp_path, tokenizer=dict(alphabet="0123456789+-*=>h: "),
    data=dict(task=dict(style="worked")), rl=dict(prompts_per_step=3),
    reward=dict(name=f"{__name__}:half_hint", example_fields=("demonstration",)),
    hints=dict(enabled=True, field="demonstration", unit="tokens", marker=MARKER, **hints),
  )  # fmt: skip


def _collect(config):
  """One collected batch of a fresh trainer, and its tokenizer."""
  trainer = Trainer(config, log=lambda s: None)
  try:
    trainer.restore_or_start()
    batch, _ = trainer.collector.collect(trainer.state.params, key=jax.random.key(2))
    return batch, trainer.collector.tokenizer
  finally:
    trainer.close()


def test_failed_groups_are_rescued_at_the_stage_that_succeeds(tmp_path):
  batch, tok = _collect(_config(tmp_path))
  m = batch.metrics
  assert m["hints/failed_groups"] == 3 and m["hints/rescued"] == 3
  # two stages of 3 groups (padded to 4, the sampler's shape) x G
  assert m["hints/stages"] == 2 and m["hints/rows"] == 2 * 4 * 4
  assert (batch.rewards == 1).all()  # every group now the hinted one that succeeded
  for row in range(0, 12, 4):
    prompt = tok.decode(batch.prompt_tokens[row][batch.prompt_mask[row]])
    expr, hint = prompt.split(MARKER)
    demo = _worked(expr.rstrip("="))
    assert hint == demo[: -(-len(demo) // 2)]  # ceil(0.5 n) characters: stage 1
  # The hint is prompt: the completion mask covers only sampled tokens.
  assert batch.completion_mask.shape == batch.tokens.shape


def _worked(expr):
  from rlvr_jax.data.tasks import worked_solution

  return worked_solution(expr)


def test_groups_that_fail_every_stage_stay_unhinted(tmp_path):
  """With the fractions 0.1 and 0.25 no stage reaches half: the batch keeps the failed groups."""
  batch, tok = _collect(_config(tmp_path, fractions=(0.1, 0.25)))
  assert batch.metrics["hints/rescued"] == 0 and batch.metrics["hints/stages"] == 2
  assert (batch.rewards == 0).all()
  assert MARKER not in tok.decode(batch.prompt_tokens[0][batch.prompt_mask[0]])


def test_a_record_without_a_solution_is_an_error_naming_the_field(tmp_path):
  c = _config(tmp_path)
  c.hints.field = "solution"
  c.reward.example_fields = ("demonstration",)
  with pytest.raises(ValueError, match="field 'solution'.*set hints.field"):
    _collect(c)
