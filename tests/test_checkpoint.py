"""Orbax checkpointing: round trip with typed keys, keep-last-N, incomplete saves are ignored."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax.checkpoint import Checkpointer


def _state(v):
  return {
    "params": {"w": jnp.full((3, 2), v, jnp.float32), "b": jnp.arange(2, dtype=jnp.bfloat16)},
    "step": jnp.int32(v),
    "key": jax.random.fold_in(jax.random.key(0), v),
    "extra": {"quantiles": jnp.linspace(0, 1, 4) * v},
  }


def test_round_trip_with_typed_key_and_host_state(tmp_path):
  ck = Checkpointer(str(tmp_path), keep=2, async_save=False)
  ck.save(3, _state(3), {"data": {"position": 96}, "note": "x"})
  ck.wait()
  step, state, host = ck.restore(_state(0))
  assert step == 3 and host == {"data": {"position": 96}, "note": "x"}
  want = _state(3)
  assert jnp.issubdtype(state["key"].dtype, jax.dtypes.prng_key)
  np.testing.assert_array_equal(jax.random.key_data(state["key"]), jax.random.key_data(want["key"]))
  # The restored key draws the same numbers.
  np.testing.assert_array_equal(
    jax.random.uniform(state["key"], (4,)), jax.random.uniform(want["key"], (4,))
  )
  for a, b in zip(jax.tree.leaves(state["params"]), jax.tree.leaves(want["params"]), strict=True):
    assert a.dtype == b.dtype
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  np.testing.assert_allclose(state["extra"]["quantiles"], want["extra"]["quantiles"])
  ck.close()


def test_keep_last_n_and_async(tmp_path):
  ck = Checkpointer(str(tmp_path), keep=2, async_save=True)
  for s in (1, 2, 3, 4):
    ck.save(s, _state(s), {"s": s})
  ck.wait()
  assert ck.complete_steps() == [3, 4]
  assert sorted(n for n in os.listdir(tmp_path) if n.isdigit()) == ["3", "4"]
  ck.close()


def test_killed_mid_save_resumes_from_last_complete(tmp_path):
  ck = Checkpointer(str(tmp_path), keep=3, async_save=False)
  ck.save(2, _state(2), {"s": 2})
  ck.wait()
  ck.close()
  # What a kill during the save of step 4 leaves behind: orbax's temporary directory, and (on
  # file systems without atomic rename) a step directory without its commit marker.
  os.makedirs(tmp_path / "4.orbax-checkpoint-tmp-1234" / "state")
  os.makedirs(tmp_path / "5" / "state")
  (tmp_path / "5" / "state" / "partial").write_bytes(b"\0" * 10)
  ck = Checkpointer(str(tmp_path), keep=3, async_save=False)
  assert ck.latest_step() == 2
  step, state, host = ck.restore(_state(0))
  assert step == 2 and host == {"s": 2}
  np.testing.assert_array_equal(np.asarray(state["params"]["w"]), np.full((3, 2), 2.0))
  # The leftovers are gone, and the run can save those steps again.
  assert not (tmp_path / "5").exists() and not (tmp_path / "4.orbax-checkpoint-tmp-1234").exists()
  ck.save(4, _state(4), {"s": 4})
  ck.wait()
  assert ck.complete_steps() == [2, 4]
  ck.close()


def test_empty_directory_restores_none_and_bad_keep(tmp_path):
  ck = Checkpointer(str(tmp_path / "new"), keep=1)
  assert ck.restore(_state(0)) is None
  ck.close()
  with pytest.raises(ValueError, match="checkpoint.keep=0"):
    Checkpointer(str(tmp_path / "x"), keep=0)
