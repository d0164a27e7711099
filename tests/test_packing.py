"""The packed update layout: the plan on hand-made lengths, and the train step on packed rows equal
to the padded step (loss, every metric, the updated params) for several objectives and
micro-batch splits."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlvr_jax import model
from rlvr_jax.train import config as config_lib
from rlvr_jax.train import packing
from rlvr_jax.train import step as step_lib
from rlvr_jax.train.state import TrainBatch, init_state

CFG = model.ModelConfig.tiny(
  vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
  head_dim=8, attention="xla",
)  # fmt: skip
B, S_P, T = 8, 5, 9


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  prompt = rng.integers(3, CFG.vocab_size, (B, S_P)).astype(np.int32)
  prompt_len = rng.integers(1, S_P + 1, B)
  pmask = np.arange(S_P)[None, :] >= (S_P - prompt_len)[:, None]  # left padding
  comp = rng.integers(3, CFG.vocab_size, (B, T)).astype(np.int32)
  lengths = np.array([T, 1, 4, 0, 7, 2, T, 3])  # long-tailed, one empty row
  cmask = np.arange(T)[None, :] < lengths[:, None]
  cmask[4, 2] = False  # a hole inside a completion (a tool's tokens in a multi-turn episode)
  adv = rng.normal(size=(B, 1)).astype(np.float32) * cmask
  tokens, positions = step_lib.sequence_inputs(prompt, pmask, jnp.asarray(comp))
  old = rng.normal(size=(B, T)).astype(np.float32) * 0.1 - 3.0
  batch = TrainBatch(
    tokens=tokens, positions=positions, completion_mask=jnp.asarray(cmask),
    advantages=jnp.asarray(adv), old_logp=jnp.asarray(old), sampler_logp=jnp.asarray(old + 0.01),
    ref_logp=jnp.asarray(old - 0.02), extras={},
  )  # fmt: skip
  return batch, cmask


def test_balanced_order_golden():
  # Longest first to the lighter block with room: 9 -> A, 7 -> B, 5 -> B (12), 4 -> A (13),
  # 3 -> B (15), 1 -> A (14): blocks {0, 3, 5} and {1, 2, 4}, each listed in row order.
  order = packing.balanced_order([9, 7, 5, 4, 3, 1], 2)
  np.testing.assert_array_equal(order, [0, 3, 5, 1, 2, 4])


def test_first_fit_decreasing_golden():
  # Sorted 7, 5, 4, 3, 1 into width 8: [7, 1], [5, 3], [4].
  assert packing.first_fit_decreasing([3, 7, 5, 1, 4], 8) == [[1, 3], [2, 0], [4]]
  with pytest.raises(ValueError, match="9 tokens"):
    packing.first_fit_decreasing([9], 8)


def test_ragged_width_grid():
  widths = [packing.ragged_width(n) for n in range(1, 5000)]
  assert all(w >= n and w % 8 == 0 for n, w in enumerate(widths, 1))
  grid = sorted(set(widths))
  big = [w for w in grid if w >= 512]  # below, rounding to multiples of 8 widens the steps
  assert all(b / a <= 1.105 for a, b in zip(big, big[1:], strict=False))  # 9% apart
  assert packing.ragged_width(2720) == 2904  # ceil(2^(92/8)) = 2897, to a multiple of 8


@pytest.mark.parametrize("layout", packing.LAYOUTS)
def test_pack_batch_layout(layout):
  batch, cmask = _batch()
  packed = packing.pack_batch(batch, num_microbatches=2, buckets=4, layout=layout).packed
  tokens, positions = np.asarray(batch.tokens), np.asarray(batch.positions)
  prompt_len, kept = packing.sequence_lengths(positions, cmask)
  np.testing.assert_array_equal(kept, [T, 1, 4, 0, 7, 2, T, 3])
  lengths = prompt_len + kept
  M, b = 2, B // 2
  r, W = packed.tokens.shape[0] // M, packed.tokens.shape[1]
  if layout == "rows":
    assert r <= b and W == S_P + T
  else:  # one row per micro-batch, as wide as the longer micro-batch's tokens on the grid
    most = max(lengths[:b].sum(), lengths[b:].sum())
    assert r == 1 and W == packing.ragged_width(most)
  # Every real token is packed once; padding is gone up to the row rounding.
  assert int((np.asarray(packed.segment_ids) > 0).sum()) == int(lengths.sum())
  pk_tok = np.asarray(packed.tokens).reshape(M, r * W)
  pk_pos = np.asarray(packed.positions).reshape(M, r * W)
  for i in range(B):
    m, c = i // b, kept[i]
    at, pred = np.asarray(packed.token_index)[i, :c], np.asarray(packed.predict_index)[i, :c]
    np.testing.assert_array_equal(pk_tok[m, at], tokens[i, S_P : S_P + c])
    np.testing.assert_array_equal(pk_pos[m, at], positions[i, S_P : S_P + c])
    np.testing.assert_array_equal(pk_tok[m, pred], tokens[i, S_P - 1 : S_P - 1 + c])
  # Segments are numbered 1, 2, ... along each row, contiguous, padding (0) only at the end.
  for row in np.asarray(packed.segment_ids):
    real = row[row > 0]  # empty for the rows the rounding of r adds
    assert (np.diff(real) >= 0).all() and (np.diff(real) <= 1).all() and real[:1].sum() <= 1
    assert (row[len(real) :] == 0).all()
  assert packed.max_segments >= max(
    len(set(row[row > 0])) for row in np.asarray(packed.segment_ids)
  )
  before = packing.padding_fraction(lengths, B, S_P + T)
  after = packing.padding_fraction(lengths, packed.tokens.shape[0], W)
  assert after < before


def _step(objective, kwargs, num_microbatches, fused):
  opt = optax.sgd(0.5)  # the update is the gradient: equal params <=> equal gradients
  return step_lib.make_train_step(
    model_config=CFG, optimizer=opt, objective=objective, objective_kwargs=kwargs,
    num_microbatches=num_microbatches, chunk_size=4, fused_loss=fused,
  ), opt  # fmt: skip


@pytest.mark.parametrize(
  "objective,kwargs,num_microbatches,fused,layout",
  [
    ("grpo", {}, 1, "auto", "rows"),  # fused into the log-prob sweep
    ("grpo", {"kl_coef": 0.1}, 2, False, "ragged"),  # KL to the reference, unfused
    ("gspo", {}, 2, "auto", "rows"),  # sequence-level ratio
    ("clip_cov", {"clip_cov_ratio": 0.25}, 2, "auto", "ragged"),  # step-scope statistics
  ],
)
def test_packed_step_equals_padded(objective, kwargs, num_microbatches, fused, layout):
  batch, cmask = _batch()
  step, opt = _step(objective, kwargs, num_microbatches, fused)
  num_tokens, num_seqs = float(cmask.sum()), float((cmask.sum(-1) > 0).sum())
  extra = step_lib.init_extra(objective, kwargs) or None
  results = []
  # ragged: micro-batches rebalanced (rows reordered), which changes no loss, gradient or metric
  packed = packing.pack_batch(
    batch, num_microbatches=num_microbatches, layout=layout, balance=layout == "ragged"
  )
  for b in (batch, packed):
    # The same initial params, fresh each time: the step donates its state.
    state = init_state(model.init_params(CFG, jax.random.key(0)), opt, jax.random.key(1), extra)
    state, metrics = step(state, b, num_tokens, num_seqs, jax.random.key(5))
    results.append((jax.device_get(state.params), jax.device_get(metrics)))
  (p0, m0), (p1, m1) = results
  assert set(m0) == set(m1)
  for k in m0:
    np.testing.assert_allclose(m1[k], m0[k], rtol=2e-5, atol=2e-6, err_msg=k)
  assert m0["update_norm"] > 0
  jax.tree.map(lambda a, b: np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-6), p0, p1)


def _first_step_metrics(c):
  from rlvr_jax.train.loop import Trainer

  trainer = Trainer(c, log=lambda s: None)
  try:
    trainer.restore_or_start()
    return trainer.rl_step(0), trainer.packing
  finally:
    trainer.close()


def test_trainer_packed_first_step_equals_padded(tmp_path):
  # The first RL step samples the same rollout either way (same params and keys); its update
  # on packed rows gives the same loss, gradient norm and metrics. On a (data 2, fsdp 2,
  # tensor 2) mesh: the packed rows are sharded over data x fsdp (one ragged row per shard of a
  # micro-batch) and the states gathered back across devices. (The rows layout: the step-level
  # tests above.)
  runs = []
  for packing_mode in ("off", "ragged"):
    c = config_lib.tiny_mesh_config(
      tmp_path / packing_mode, rl=dict(packing=packing_mode, num_microbatches=2)
    )
    runs.append(_first_step_metrics(c))
  (m0, packed0), (m1, packed1) = runs
  assert packed0 is None and packed1 in packing.LAYOUTS
  # Both runs report the padding of every layout (the same rollout: the same numbers).
  assert m1["update/padding_ragged"] == m0["update/padding_ragged"]
  assert m0["update/padding_ragged"] < m0["update/padding_padded"]
  for k in ("loss", "grad_norm", "update_norm", "entropy/mean", "logp_gap/mean", "reward/mean"):
    np.testing.assert_allclose(m1[k], m0[k], rtol=1e-4, atol=1e-6, err_msg=k)
