"""The continuous-batching sampler (``sampling.continuous``) against the static one: the same
tokens, masks and flags for every slot count, log-probs to float rounding, per-row budgets, the
ReMax greedy row, an 8-device mesh, prefix forks with log-prob parity, the slot statistics, and
the trainer with ``sampling.engine = "continuous"``."""

import jax
import numpy as np
import pytest
from test_sampling import COMBINED, CONFIG, _prompts

from rlvr_jax import sampling
from rlvr_jax import sharding as sharding_lib
from rlvr_jax.model import init_params, param_shardings
from rlvr_jax.sampling import Greedy, Temperature, continuous, logprob_parity
from rlvr_jax.train import config as config_lib
from rlvr_jax.train.loop import Trainer

# Stop ids the tiny model samples often enough that rows end at many different lengths.
STOPS = (3, 4, 5)
EXACT = (
  "tokens",
  "completion_mask",
  "lengths",
  "finished",
  "truncated",
  "prompt_ids",
  "sample_ids",
)
ROUNDED = ("sampler_logp", "model_logp", "sampler_threshold")


@pytest.fixture(scope="module")
def params():
  p = init_params(CONFIG, jax.random.key(0))
  return dict(p, lm_head=p["lm_head"] * 15.0)


def _both(params, prompts, strategy, *, num_slots, num_samples=4, max_new_tokens=24, **kw):
  tokens, mask = prompts
  args = dict(
    config=CONFIG, num_samples=num_samples, strategy=strategy, key=jax.random.key(1),
    max_new_tokens=max_new_tokens, stop_tokens=STOPS, phase_steps=4, **kw,
  )  # fmt: skip
  static = sampling.generate(params, tokens, mask, **args)
  slots, stats = continuous.generate(
    params, tokens, mask, num_slots=num_slots, with_stats=True, **args
  )
  return static, slots, stats


def _assert_same(a, b, atol=1e-5):
  for name in EXACT:
    np.testing.assert_array_equal(np.asarray(getattr(b, name)), np.asarray(getattr(a, name)), name)
  for name in ROUNDED:
    x, y = getattr(a, name), getattr(b, name)
    assert (x is None) == (y is None), name
    if x is not None:
      np.testing.assert_allclose(np.asarray(y), np.asarray(x), atol=atol, err_msg=name)


@pytest.mark.parametrize(
  "strategy, num_slots",
  [(Temperature(1.0), 24), (Temperature(1.0), 7), (COMBINED, 7), (COMBINED, 1), (Greedy(), 7)],
  ids=lambda x: str(x),
)
def test_same_rollout_as_static_generate(params, strategy, num_slots):
  """Every slot count (all rows, a queue refilled 7 at a time, one row at a time) samples the
  static sampler's tokens; the log-probs differ by float rounding only."""
  static, slots, stats = _both(params, _prompts(6, seed=3), strategy, num_slots=num_slots)
  _assert_same(static, slots)
  lengths = np.asarray(static.lengths)
  if not isinstance(strategy, Greedy):  # (greedy rows of this model never stop)
    assert lengths.min() < 6 and lengths.max() == 24  # early stops and a row at the limit
  # Each live slot-step decodes one token of one row: every token but the rows' first (sampled
  # from the prefill) is decoded exactly once.
  assert stats["live_slot_steps"] == lengths.sum() - len(lengths)
  assert stats["slot_steps"] == stats["steps"] * num_slots
  queued = int((lengths > 1).sum())  # rows that neither stopped at token 0 nor had budget 1
  assert stats["refills"] == max(0, queued - num_slots)


def test_fewer_slots_waste_fewer_slot_steps(params):
  """On long-tailed lengths (budgets: most rows 2-4 tokens, two rows 24) the static batch spends
  most of its slot-steps on rows that have ended; 4 refilled slots are almost always live."""
  budgets = np.full(24, 3)
  budgets[::3], budgets[5], budgets[17] = 2, 24, 24
  static, slots, stats = _both(
    params, _prompts(6, seed=3), Temperature(1.0), num_slots=4, max_lengths=budgets
  )
  _assert_same(static, slots)
  lengths = np.asarray(static.lengths)
  static_useful = (lengths.sum() - 24) / ((lengths.max() - 1) * 24)
  useful = stats["live_slot_steps"] / stats["slot_steps"]
  assert static_useful < 0.25 and useful > 0.6, (static_useful, useful)


def test_the_pallas_decode_kernel_samples_the_same_rollout(params, monkeypatch):
  """``decode_attention='pallas_gpu'`` (the kernel run by Pallas' interpreter on this CPU, over
  16-token prompts and a 32-column completion buffer) samples the einsum's tokens."""
  from rlvr_jax.model import attention as attention_lib

  calls = []
  part = attention_lib._decode_part
  monkeypatch.setattr(
    attention_lib, "_decode_part", lambda *a, **k: calls.append(1) or part(*a, **k)
  )
  prompts = _prompts(3, seed=21)
  args = dict(
    num_samples=2, strategy=COMBINED, key=jax.random.key(2), max_new_tokens=32,
    stop_tokens=STOPS, phase_steps=0, num_slots=4,
  )  # fmt: skip
  einsum = continuous.generate(params, *prompts, config=CONFIG, **args)
  kernel_config = CONFIG.replace(decode_attention="pallas_gpu")
  kernel = continuous.generate(params, *prompts, config=kernel_config, **args)
  assert calls  # traced: the kernel is in the program
  _assert_same(einsum, kernel)


def test_row_budgets_and_the_remax_greedy_row(params):
  """Per-row token budgets (``max_lengths``) end rows as truncated, in both samplers alike;
  per-row temperatures with a greedy last row (ReMax) too."""
  G = 4
  budgets = np.tile([3, 24, 9, 1], 6)
  temps = [0.8] * (G - 1) + [0.0]
  static, slots, _ = _both(
    params, _prompts(6, seed=5), Temperature(0.8), num_slots=5, max_lengths=budgets,
    temperatures=temps,
  )  # fmt: skip
  _assert_same(static, slots)
  lengths = np.asarray(slots.lengths)
  assert (lengths <= budgets).all() and (lengths[budgets == 1] == 1).all()
  cut = np.asarray(slots.truncated)
  assert (lengths[cut] == budgets[cut]).all() and cut.any() and (~cut).any()
  # The greedy rows are the argmax continuations: sampler log-prob 0 (a point mass).
  greedy = np.asarray(slots.sampler_logp)[G - 1 :: G]
  assert (greedy[np.asarray(slots.completion_mask)[G - 1 :: G]] == 0).all()


def test_same_rollout_under_an_8_device_mesh(params):
  """Slots sharded over the data axes (weights over ``tensor``) sample what one device does."""
  prompts = _prompts(4, seed=13)
  static, single, _ = _both(params, prompts, COMBINED, num_slots=8)
  mesh = sharding_lib.make_mesh(2, 2, 2)
  with jax.set_mesh(mesh):
    placed = jax.device_put(params, param_shardings(CONFIG, mesh, sharding_lib.SAMPLE_RULES))
    sharded = continuous.generate(
      placed, *prompts, config=CONFIG, num_samples=4, strategy=COMBINED, key=jax.random.key(1),
      max_new_tokens=24, stop_tokens=STOPS, phase_steps=4, num_slots=8,
    )  # fmt: skip
  assert not sharded.tokens.sharding.is_fully_replicated
  _assert_same(single, sharded)
  _assert_same(static, sharded)


def test_prefix_forks_continue_a_rollout_with_parity(params):
  """K continuations of prefixes (row, position) of a rollout: the static sampler's tokens on the
  same prefixes, and log-probs equal to a full forward pass over prompt + prefix + continuation
  (the trainer's view)."""
  base = sampling.generate(
    params, *_prompts(3, seed=7), config=CONFIG, num_samples=2, strategy=COMBINED,
    key=jax.random.key(2), max_new_tokens=12, stop_tokens=STOPS,
  )  # fmt: skip
  lengths = np.asarray(base.lengths)
  rows = [0, 3, 5, 5]
  positions = [0, min(4, lengths[3]), 1, lengths[5]]
  ids, mask = continuous.fork_prefixes(base, rows, positions)
  for r, p, seq, m in zip(rows, positions, ids, mask, strict=True):
    prompt = np.asarray(base.prompt_tokens)[r][np.asarray(base.prompt_mask)[r]]
    np.testing.assert_array_equal(seq[m], np.concatenate([prompt, np.asarray(base.tokens)[r, :p]]))
  kw = dict(
    config=CONFIG, num_samples=3, strategy=COMBINED, key=jax.random.key(9), max_new_tokens=10,
    stop_tokens=STOPS, prompt_ids=np.arange(100, 104),
  )  # fmt: skip
  forks = continuous.generate(params, ids, mask, num_slots=5, **kw)
  _assert_same(sampling.generate(params, ids, mask, **kw), forks)
  assert forks.tokens.shape == (12, 10)
  gaps = logprob_parity(params, forks, config=CONFIG, strategy=COMBINED)
  assert float(gaps["sampler_logp_gap/max"]) <= 1e-5 and float(gaps["model_logp_gap/max"]) <= 1e-5
  with pytest.raises(ValueError, match=r"\(5, 13\)"):
    continuous.fork_prefixes(base, [5], [13])


def test_kv_entries_per_row():
  """The prompt cache once per prompt and N slots: P S + N (S + T) entries against B (S + T)."""
  kv = continuous.kv_entries_per_row(
    num_prompts=32, num_samples=8, prompt_len=256, max_new_tokens=512, num_slots=128
  )
  assert kv == {"static": 768.0, "continuous": (32 * 256 + 128 * 768) / 256}


def test_bad_arguments_are_named(params):
  tokens, mask = _prompts(2)
  kw = dict(config=CONFIG, num_samples=2, strategy=Greedy(), key=jax.random.key(0))
  with pytest.raises(ValueError, match=r"num_slots must be in \[1, B = 4\]"):
    continuous.generate(params, tokens, mask, max_new_tokens=4, num_slots=5, **kw)
  with pytest.raises(ValueError, match="max_lengths"):
    continuous.generate(params, tokens, mask, max_new_tokens=4, max_lengths=[5] * 4, **kw)


def test_trainer_with_the_continuous_engine_collects_the_static_batch(tmp_path):
  """``sampling.engine = "continuous"`` (3 slots for 16 rows, and ReMax's greedy row): the
  collected batch has the static engine's tokens, rewards and advantages."""
  batches = {}
  for engine in ("static", "continuous"):
    c = config_lib.tiny_config(
      tmp_path / engine, rl=dict(advantage="remax"),
      sampling=dict(engine=engine, num_slots=3, max_new_tokens=6),
    )  # fmt: skip
    trainer = Trainer(c, log=lambda s: None)
    try:
      trainer.restore_or_start()
      batches[engine], _ = trainer.collector.collect(trainer.state.params, key=jax.random.key(4))
    finally:
      trainer.close()
  a, b = batches["static"], batches["continuous"]
  np.testing.assert_array_equal(b.tokens, a.tokens)
  np.testing.assert_array_equal(b.completion_mask, a.completion_mask)
  np.testing.assert_array_equal(b.rewards, a.rewards)
  np.testing.assert_array_equal(b.greedy_rewards, a.greedy_rewards)
  np.testing.assert_allclose(b.sampler_logp, a.sampler_logp, atol=1e-5)
  np.testing.assert_allclose(b.advantages, a.advantages, atol=1e-6)
