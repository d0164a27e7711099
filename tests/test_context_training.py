"""Context parallelism in the trainer: a ``context`` mesh axis splits the update's token rows along
the sequence and ``model.attention="ring"`` computes attention across it. The first RL step on a
(data 2, fsdp 1, tensor 1, context 4) mesh of simulated CPU devices equals one device with the
einsum attention; the config errors; meshes without a context axis unchanged."""

import jax
import numpy as np
import pytest

from rlvr_jax import sharding as S
from rlvr_jax.model.context_parallel import CONTEXT_AXIS
from rlvr_jax.train import config as config_lib
from rlvr_jax.train import sharded
from rlvr_jax.train.loop import Trainer
from rlvr_jax.train.state import TrainBatch


def _first_step(c, layout=None):
  trainer = Trainer(c, log=lambda s: None, layout=layout)
  try:
    trainer.restore_or_start()
    metrics = trainer.rl_step(0)
    return metrics, jax.device_get(trainer.state.params), trainer
  finally:
    trainer.close()


def test_first_step_on_a_context_mesh_equals_one_device(tmp_path):
  # The same params and keys: the same rollout (the sampler and scoring passes use 'auto', the
  # einsum on CPU, in both runs); the update's rows split into 4 sequence chunks, ring attention.
  ref = config_lib.tiny_mesh_config(tmp_path / "one", model=dict(attention="xla"))
  m0, p0, _ = _first_step(ref)
  ctx = config_lib.tiny_mesh_config(tmp_path / "ctx", model=dict(attention="ring"))
  m1, p1, trainer = _first_step(ctx, sharded.MeshLayout(S.make_mesh(2, 1, 1, 4)))
  assert trainer.update_model_config.attention == "ring"
  assert trainer.model_config.attention == "auto"
  assert trainer.shared_train_step is None  # the shared-prompt forward has no ring
  for k in ("loss", "grad_norm", "update_norm", "entropy/mean"):
    np.testing.assert_allclose(m1[k], m0[k], rtol=1e-4, atol=1e-6, err_msg=k)
  assert m0["update_norm"] > 0
  for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(p1), strict=True):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def test_token_rows_are_left_padded_and_split_along_the_sequence():
  mesh = S.make_mesh(2, 1, 1, 4)
  B, S_, T = 4, 7, 3
  tokens = np.arange(B * S_, dtype=np.int32).reshape(B, S_)
  positions = np.tile(np.arange(S_, dtype=np.int32), (B, 1))
  zeros = np.zeros((B, T), np.float32)
  tb = TrainBatch(tokens, positions, zeros > 0, zeros, zeros, zeros, None, {})
  placed = sharded.shard_sequences(tb, mesh)
  assert placed.tokens.shape == (B, 8)  # 7 -> 8: one column of prompt padding on the left
  assert placed.tokens.sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"), CONTEXT_AXIS)
  assert placed.completion_mask.sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"), None)
  np.testing.assert_array_equal(np.asarray(placed.tokens)[:, 1:], tokens)
  np.testing.assert_array_equal(np.asarray(placed.positions)[:, 0], -1)
  np.testing.assert_array_equal(np.asarray(placed.positions)[:, 1:], positions)


def test_meshes_without_a_context_axis_are_unchanged():
  assert S.CONTEXT_AXIS == CONTEXT_AXIS
  mesh = S.make_mesh(2, 2, 2, 1)
  assert mesh.axis_names == S.MESH_AXES and S.context_size(mesh) == 1
  assert S.make_mesh(2, 2, 1, 2).axis_names == (*S.MESH_AXES, CONTEXT_AXIS)
  assert dict(S.make_mesh(2, 1, 1, -1).shape)[CONTEXT_AXIS] == 4
  # The sequence rule is a no-op without the axis; the sampling layout never splits sequences.
  assert S.logical_to_spec(("batch", "seq"), S.TRAIN_RULES, shape=(8, 6), mesh=mesh) == (
    jax.sharding.PartitionSpec(("data", "fsdp"), None)
  )
  cp = S.make_mesh(2, 2, 1, 2)
  assert S.logical_to_spec(("batch", "seq"), S.SAMPLE_RULES, shape=(8, 6), mesh=cp) == (
    jax.sharding.PartitionSpec(("data", "fsdp"), None)
  )
  assert sharded.parse_mesh("2,2,2") == (2, 2, 2)
  assert sharded.parse_mesh("2,1,1,4") == (2, 1, 1, 4)
  with pytest.raises(ValueError, match="or four 'data,fsdp,tensor,context', got 5"):
    sharded.parse_mesh("1,1,1,1,8")


def test_context_axis_and_ring_attention_go_together(tmp_path):
  with pytest.raises(config_lib.ConfigError, match=r"model.attention='ring' needs a context mesh"):
    Trainer(config_lib.tiny_config(tmp_path / "a", model=dict(attention="ring")))
  layout = sharded.MeshLayout(S.make_mesh(2, 1, 1, 4))
  with pytest.raises(
    config_lib.ConfigError, match=r"model.attention='auto' with a context mesh axis of size 4"
  ):
    Trainer(config_lib.tiny_mesh_config(tmp_path / "b"), layout=layout)
  c = config_lib.tiny_mesh_config(tmp_path / "c", model=dict(attention="ring"))
  c.rl.packing = "ragged"
  with pytest.raises(config_lib.ConfigError, match=r"rl.packing='ragged' with a context mesh"):
    Trainer(c, layout=layout)
  # 'auto' packing is off with a context axis (packed widths do not split into equal chunks).
  c.rl.packing = "auto"
  assert config_lib.packing_layout(c, "gpu", context=4) is None
  assert config_lib.packing_layout(c, "gpu") == "ragged"
