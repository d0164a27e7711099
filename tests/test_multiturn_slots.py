"""Multi-turn episodes on decode slots (``sampling.multiturn_slots``): the same episodes as the
lockstep sampler (``multiturn_rollout``), token for token, with fewer slots than episodes (a
queue), env failures, an 8-device mesh and no recompiles across batches."""

import jax
import numpy as np
import pytest
import test_multiturn_sampling as lockstep
from test_multiturn_sampling import CONFIG, RENDER, STOPS, TOK, _decode, _rollout, _specs

from rlvr_jax import envs
from rlvr_jax import sharding as sharding_lib
from rlvr_jax.model import param_shardings
from rlvr_jax.sampling import Greedy, Temperature, TopK
from rlvr_jax.sampling import multiturn_slots as ms

params, pool = lockstep.params, lockstep.pool  # the fixtures (module scope)

EXACT = ("tokens", "policy_mask", "token_mask", "turn_index", "num_turns", "terminated",
         "truncated", "failed")  # fmt: skip


def _slots(params, pool, strategy, *, seeds, specs=None, max_tokens=60, turn_tokens=8, **kw):
  return ms.rollout_episodes_on_slots(
    params, pool, RENDER, config=CONFIG, strategy=strategy, key=jax.random.key(7), seeds=seeds,
    decode=_decode, max_tokens=max_tokens, turn_tokens=turn_tokens, stop_sequences=STOPS,
    pad_id=TOK.pad_id, eos_ids=TOK.eos_ids, specs=specs, chunk_steps=3, buckets=(16,),
    obs_buckets=(16,), cache_buckets=(96,), **kw,
  )  # fmt: skip


def _assert_same(a, b):
  for k in EXACT:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  np.testing.assert_array_equal(a["turn_rewards"], b["turn_rewards"])
  for k in ("sampler_logp", "model_logp", "sampler_threshold"):
    np.testing.assert_allclose(a[k], b[k], atol=1e-5, err_msg=k)


@pytest.mark.parametrize(
  "strategy, turns, num_slots",
  [
    (Greedy(), [2, 5, 3, 4], 0),  # a slot per episode
    (Temperature(1.0), [3, 1, 4, 2, 5, 2], 2),  # six episodes through two slots
    (TopK(5, temperature=1.2), [4, 2, 3, 5, 1], 3),
  ],
)
def test_slots_play_the_lockstep_episodes(params, pool, strategy, turns, num_slots):
  """Every token, mask, reward and flag equals the lockstep sampler's; log-probs within 1e-5."""
  seeds = list(range(10, 10 + len(turns)))
  ids = dict(prompt_ids=np.arange(len(turns)) // 2, sample_ids=np.arange(len(turns)) % 2)
  lock = _rollout(params, pool, strategy, seeds=seeds, specs=_specs(turns), max_tokens=80, **ids)
  got = _slots(
    params, pool, strategy, seeds=seeds, specs=_specs(turns), max_tokens=80, num_slots=num_slots,
    **ids,
  )  # fmt: skip
  a, b = got.collate(pad_id=TOK.pad_id), lock.collate(pad_id=TOK.pad_id)
  _assert_same(a, b)
  assert (a["policy_mask"].sum(1) > 0).all()
  m = got.metrics
  N = num_slots or len(turns)
  assert m["slots"] == N and m["admissions"] == len(turns)
  assert m["turns"] == sum(len(e.turns) for e in got.episodes)
  # Each slot-step of a slot in its turn sampled one action token, and nothing else did.
  assert m["useful_frac"] * m["decode_steps"] * N == pytest.approx(a["policy_mask"].sum())
  assert 0 < m["useful_frac"] <= 1
  # A slot row holds one episode's stream (96 columns); the lockstep cache grew to hold every
  # turn's longest row and the widest observation of the batch, holes included.
  assert m["cache_slots"] == 96 and lock.metrics["holes"] > 0


def test_context_limit_and_env_failures_on_slots(params):
  """Failed envs (exception, malformed, hang) fail their episode and free the slot; the context
  limit truncates with its flag; the rest plays to its end, as in the lockstep sampler."""
  fail = lambda turn, mode: envs.EnvSpec(
    "env_fixtures:FailAtTurnEnv", {"turn": turn, "mode": mode, "num_turns": 3}
  )
  specs = [fail(2, "raise"), fail(1, "malformed"), fail(2, "hang"), fail(99, "raise")]
  specs += _specs([20])
  with envs.EnvPool(num_workers=2, timeout_s=1.0) as pool:
    got = _slots(params, pool, Greedy(), seeds=[0, 1, 2, 3, 4], specs=specs, num_slots=2)
    lock = _rollout(params, pool, Greedy(), seeds=[0, 1, 2, 3, 4], specs=specs)
  causes = [e.failure.cause if e.failure else None for e in got.episodes]
  assert causes == ["exception", "malformed", "timeout", None, None]
  assert got.episodes[4].truncation == "context"
  _assert_same(got.collate(pad_id=0), lock.collate(pad_id=0))


def test_same_episodes_on_an_8_device_mesh(params, pool):
  seeds, specs = list(range(12)), _specs([2, 3, 4, 5, 2, 3, 4, 5, 1, 2, 3, 4])
  one = _slots(params, pool, Temperature(1.0), seeds=seeds, specs=specs, num_slots=8)
  mesh = sharding_lib.make_mesh(2, 2, 2)
  with jax.set_mesh(mesh):
    placed = jax.device_put(params, param_shardings(CONFIG, mesh, sharding_lib.SAMPLE_RULES))
    many = _slots(placed, pool, Temperature(1.0), seeds=seeds, specs=specs, num_slots=8)
  _assert_same(one.collate(pad_id=0), many.collate(pad_id=0))


def test_new_batches_reuse_every_program(params, pool):
  _slots(params, pool, Temperature(1.0), seeds=[0, 1, 2], specs=_specs([2, 3, 1]), num_slots=2)
  fns = (ms.init_slots, ms.admit, ms.begin_turns, ms.decode_chunk, ms.append)
  sizes = [f._cache_size() for f in fns]
  _slots(params, pool, Temperature(1.0), seeds=[5, 6, 7], specs=_specs([4, 1, 2]), num_slots=2)
  assert [f._cache_size() for f in fns] == sizes
