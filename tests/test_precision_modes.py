"""Every precision mode trains: a few RL steps of the tiny trainer (``Trainer.rl_step``, what
``rlvr_jax.main`` / ``api.run`` run) in float32, mixed (float32 masters, bfloat16 compute) and
pure bfloat16 (``model.dtype=bfloat16``), each with finite metrics, no skipped update, the
parameters' dtype kept and the parameters moved.

Pure bfloat16 once crashed at the first update: ``train.step.apply_update``'s ``lax.cond``
returned a bfloat16 ``update_norm`` from the update branch and a float32 zero from the skip
branch (a type error when the step was traced).
"""

import jax
import numpy as np
import pytest

from rlvr_jax.train import config as config_lib
from rlvr_jax.train.loop import Trainer

NUM_STEPS = 2
MODES = {
  "float32": dict(dtype="float32", compute_dtype="float32"),
  "mixed": dict(dtype="float32", compute_dtype="bfloat16"),
  "bfloat16": dict(dtype="bfloat16"),
}
PARAM_DTYPE = {"float32": np.float32, "mixed": np.float32, "bfloat16": jax.numpy.bfloat16}


def _leaves(params) -> dict[str, np.ndarray]:
  flat = jax.tree_util.tree_leaves_with_path(jax.device_get(params))
  return {jax.tree_util.keystr(path): np.asarray(x) for path, x in flat}


@pytest.mark.parametrize("mode", list(MODES))
def test_precision_mode_trains(tmp_path, mode):
  c = config_lib.tiny_config(tmp_path, model=MODES[mode])
  trainer = Trainer(c, log=lambda s: None)
  try:
    trainer.restore_or_start()
    before = _leaves(trainer.state.params)
    assert {x.dtype for x in before.values()} == {np.dtype(PARAM_DTYPE[mode])}
    for step in range(NUM_STEPS):
      metrics = trainer.rl_step(step)
      for name in ("loss", "grad_norm", "update_norm", "param_norm"):
        assert np.isfinite(metrics[name]), (step, name, metrics[name])
      assert metrics["skipped"] == 0.0, step
      assert metrics["update_norm"] > 0.0, step  # a step that was not skipped moved something
    assert metrics["update/num_skipped_total"] == 0.0 and int(trainer.state.num_skipped) == 0
    after = _leaves(trainer.state.params)
  finally:
    trainer.close()
  # The master dtype is kept: bfloat16 stays bfloat16; mixed precision keeps float32 masters.
  assert {k: x.dtype for k, x in after.items()} == {k: x.dtype for k, x in before.items()}
  assert all(np.isfinite(x.astype(np.float32)).all() for x in after.values())
  moved = {k for k in before if not np.array_equal(before[k], after[k])}
  # Every weight matrix moves. The RMSNorm gains (all 1.0) may not in bfloat16: an AdamW step of
  # ~lr = 1e-3 is below half the bfloat16 spacing next to 1.0 (2^-9 below, 2^-8 above) and rounds
  # back to 1.0 (measured: the three gains unchanged after 2 steps, every matrix moved).
  weights = {k for k in before if "norm" not in k}
  assert weights <= moved, sorted(weights - moved)
  if mode != "bfloat16":
    assert moved == set(before), sorted(set(before) - moved)
