"""Multi-turn continuation of the sampler (``sampling.multiturn``, ``multiturn_rollout``) on a tiny
random character model: exact token streams and masks against a reference that re-feeds the whole
history for every token (no cache), log-prob parity with the trainer's forward pass on interleaved
sequences, failure handling, and the same rollouts on 8 simulated devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import envs
from rlvr_jax import sharding as sharding_lib
from rlvr_jax.data.char_tokenizer import CharTokenizer
from rlvr_jax.model import ModelConfig, forward, init_params, param_shardings
from rlvr_jax.sampling import Greedy, Temperature, TopK, truncated_logprobs_from_hidden
from rlvr_jax.sampling import multiturn as mt
from rlvr_jax.sampling.multiturn_rollout import rollout_episodes
from rlvr_jax.train import step as step_lib

TOK = CharTokenizer()
CONFIG = ModelConfig.tiny(vocab_size=TOK.vocab_size, eos_token_ids=(TOK.eos_id,))
RENDER = envs.PlainRenderer(TOK, template=" {obs}:")
# Stop on EOS, on a few frequent characters and on a two-character string, so turns end at
# different steps (and some on their budget).
STOPS = [[TOK.eos_id], TOK.encode("e", add_special_tokens=False),
         TOK.encode(" ", add_special_tokens=False), TOK.encode("ab", add_special_tokens=False)]  # fmt: skip
REF_LEN = 160


@pytest.fixture(scope="module")
def params():
  p = init_params(CONFIG, jax.random.key(3))
  return dict(p, lm_head=p["lm_head"] * 12.0)


@pytest.fixture(scope="module")
def pool():
  with envs.EnvPool(envs.EnvSpec("scripted"), num_workers=2, timeout_s=2.0) as p:
    yield p


def _specs(turns):
  return [envs.EnvSpec("scripted", {"num_turns": n, "template": "r{turn} {action}"}) for n in turns]


def _decode(ids):
  return TOK.decode(ids)


def _rollout(params, pool, strategy, *, seeds, specs=None, max_tokens=60, turn_tokens=8, **kw):
  return rollout_episodes(
    params, pool, RENDER, config=CONFIG, strategy=strategy, key=jax.random.key(7), seeds=seeds,
    decode=_decode, max_tokens=max_tokens, turn_tokens=turn_tokens, stop_sequences=STOPS,
    pad_id=TOK.pad_id, eos_ids=TOK.eos_ids, specs=specs, chunk_steps=3, buckets=(16,),
    obs_buckets=(16,), cache_buckets=(160,), **kw,
  )  # fmt: skip


_full = jax.jit(lambda p, t, pos: forward(p, t, pos, config=CONFIG, return_logits=True)[0])


def _reference_policy(params, turn_tokens):
  """Greedy policy_fn for ``play_episodes`` that runs the whole context through the model (no
  cache) for every token: the re-prefill reference of the cache continuation."""

  def logits_of(ids):
    tokens = np.zeros((1, REF_LEN), np.int32)
    pos = np.full((1, REF_LEN), -1, np.int32)
    tokens[0, : len(ids)], pos[0, : len(ids)] = ids, np.arange(len(ids))
    return np.asarray(_full(params, tokens, pos))[0, len(ids) - 1]

  def policy(contexts, budgets):
    out = {}
    for b, ctx in contexts.items():
      ctx, action, logps = list(ctx), [], []
      while len(action) < min(turn_tokens, budgets[b]):
        logits = logits_of(ctx)
        tok = int(np.argmax(logits))
        logps.append(float(logits[tok] - jax.nn.logsumexp(logits)))
        action.append(tok)
        ctx.append(tok)
        if any(action[-len(s) :] == list(s) for s in STOPS):
          break
      out[b] = (action, logps)
    return out

  return policy


def test_stop_table_right_aligns_and_pads():
  table = mt.stop_table([[5], [7, 8]])
  assert table.shape == (8, 2)
  np.testing.assert_array_equal(table[:2], [[-1, 5], [7, 8]])
  assert (table[2:] == mt._NEVER).all()
  with pytest.raises(ValueError, match="non-empty"):
    mt.stop_table([[]])


def test_cache_continuation_equals_reprefilling_the_history(params, pool):
  """Greedy rollouts of scripted episodes that end at turns 2..5: the token stream, every mask,
  the rewards and flags equal the reference loop's, which re-feeds the whole history per token;
  model log-probs agree to 1e-5."""
  turns, seeds = [2, 5, 3, 4], [0, 1, 2, 3]
  got = _rollout(params, pool, Greedy(), seeds=seeds, specs=_specs(turns), max_tokens=100)
  ref_eps = envs.play_episodes(
    pool, RENDER, _reference_policy(params, 8), seeds=seeds, decode=_decode,
    eos_ids=TOK.eos_ids, specs=_specs(turns), max_tokens=100,
  )  # fmt: skip
  ours = got.collate(pad_id=TOK.pad_id)
  ref = envs.collate(ref_eps, pad_id=TOK.pad_id)
  for k in ("tokens", "policy_mask", "token_mask", "turn_index", "num_turns", "terminated",
            "truncated", "failed"):  # fmt: skip
    np.testing.assert_array_equal(ours[k], ref[k], err_msg=k)
  np.testing.assert_array_equal(ours["turn_rewards"], ref["turn_rewards"])
  np.testing.assert_array_equal(ours["num_turns"], turns)
  ref_logp = np.zeros_like(ours["model_logp"])
  for b, e in enumerate(ref_eps):
    ref_logp[b, ours["policy_mask"][b]] = np.concatenate([t.action_logp for t in e.turns])
  np.testing.assert_allclose(ours["model_logp"], ref_logp, atol=1e-5)
  # The stream really is interleaved: observation tokens are context only.
  obs = ours["token_mask"] & ~ours["policy_mask"]
  assert obs.sum() > 0 and (ours["turn_index"][obs] == 0).all()
  # Turns ended for different reasons: some on a stop sequence, some on the budget.
  lengths = [len(t.action_ids) for e in got.episodes for t in e.turns]
  assert min(lengths) < 8 and max(lengths) == 8
  assert got.metrics["turns"] == 5
  # Rows whose turn ended early were sent to the envs while the others still decoded.
  assert got.metrics["env_submits"] > got.metrics["turns"]


def test_context_limit_truncates_with_a_flag(params, pool):
  got = _rollout(params, pool, Greedy(), seeds=[0, 1], specs=_specs([20, 20]), max_tokens=30)
  batch = got.collate(pad_id=TOK.pad_id)
  assert batch["truncated"].all() and not batch["terminated"].any()
  assert all(e.truncation == "context" for e in got.episodes)
  assert (batch["token_mask"].sum(1) <= 30).all()


def _trainer_logp(params, batch, temperature):
  tokens, positions = step_lib.sequence_inputs(
    batch["prompt_tokens"], batch["prompt_mask"], jnp.asarray(batch["tokens"])
  )
  return step_lib.completion_logprobs(
    params, tokens, positions, num_completion=batch["tokens"].shape[1], model_config=CONFIG,
    temperature=temperature, chunk_size=32,
  )[0]  # fmt: skip


def _prompts(episodes):
  ids, mask = TOK.encode_batch([""] * len(episodes), add_special_tokens=False, pad_to=32)
  for b, e in enumerate(episodes):
    n = len(e.prompt_ids)
    ids[b, 32 - n :], mask[b, 32 - n :] = e.prompt_ids, True
  return ids, mask


@pytest.mark.parametrize("strategy", [Temperature(0.8), TopK(5, temperature=1.2)])
def test_logprob_parity_on_interleaved_episodes(params, pool, strategy):
  """Sampled multi-turn episodes re-scored by the trainer's one forward pass over
  [prompt, a1, o1, a2, ...]: |sampler - trainer| <= 1e-5 on every action token (float32)."""
  got = _rollout(params, pool, strategy, seeds=[4, 5, 6, 7], specs=_specs([3, 4, 2, 5]))
  batch = got.collate(pad_id=TOK.pad_id)
  batch["prompt_tokens"], batch["prompt_mask"] = _prompts(got.episodes)
  pm = batch["policy_mask"]
  assert pm.sum() > 20 and (batch["token_mask"] & ~pm).sum() > 20
  model_logp = np.asarray(_trainer_logp(params, batch, 1.0))
  assert np.abs(model_logp - batch["model_logp"])[pm].max() <= 1e-5
  if not strategy.truncates:
    sampler = np.asarray(_trainer_logp(params, batch, strategy.temperature))
  else:
    tokens, positions = step_lib.sequence_inputs(
      batch["prompt_tokens"], batch["prompt_mask"], jnp.asarray(batch["tokens"])
    )
    T = batch["tokens"].shape[1]
    hidden, _ = forward(params, tokens, positions, config=CONFIG)
    sampler = np.asarray(truncated_logprobs_from_hidden(
      hidden[:, -T - 1 : -1], params["lm_head"], jnp.asarray(batch["tokens"]),
      jnp.asarray(batch["sampler_threshold"]), temperature=strategy.temperature,
    ))  # fmt: skip
  assert np.abs(sampler - batch["sampler_logp"])[pm].max() <= 1e-5


def test_samples_do_not_depend_on_the_batch(params, pool):
  """A row's episode is the same alone or in a batch with rows of other lengths (per-row keys
  and positions; holes are never attended)."""
  both = _rollout(params, pool, Temperature(1.0), seeds=[8, 9], specs=_specs([3, 5]),
                  prompt_ids=[0, 1])  # fmt: skip
  alone = _rollout(params, pool, Temperature(1.0), seeds=[9], specs=_specs([5]), prompt_ids=[1])
  a, b = both.collate(pad_id=0), alone.collate(pad_id=0)
  L = b["tokens"].shape[1]
  np.testing.assert_array_equal(a["tokens"][1, :L], b["tokens"][0])
  np.testing.assert_allclose(a["sampler_logp"][1, :L], b["sampler_logp"][0], atol=1e-5)


def test_env_failures_mark_their_episode_and_the_rest_goes_on(params):
  """An env that raises, one that returns a malformed tuple and one that hangs: those episodes
  are failed with their cause (rewards NaN, excluded), the healthy one plays to its end."""
  fail = lambda turn, mode: envs.EnvSpec(
    "env_fixtures:FailAtTurnEnv", {"turn": turn, "mode": mode, "num_turns": 3}
  )
  specs = [fail(2, "raise"), fail(1, "malformed"), fail(2, "hang"), fail(99, "raise")]
  with envs.EnvPool(num_workers=2, timeout_s=1.0) as pool:
    got = _rollout(params, pool, Greedy(), seeds=[0, 1, 2, 3], specs=specs)
    counts = pool.metrics()
  causes = [e.failure.cause if e.failure else None for e in got.episodes]
  assert causes == ["exception", "malformed", "timeout", None]
  batch = got.collate(pad_id=0)
  np.testing.assert_array_equal(batch["failed"], [True, True, True, False])
  assert np.isnan(batch["turn_rewards"][:3]).all()
  assert batch["num_turns"][3] == 3 and batch["terminated"][3]
  assert counts["env/fail/exception"] == 1 and counts["env/fail/timeout"] == 1


@pytest.mark.parametrize("shape", [(8, 1, 1), pytest.param((2, 2, 2), marks=pytest.mark.slow)])
def test_same_episodes_on_one_device_and_on_8_device_mesh(params, pool, shape):
  seeds, specs = list(range(8)), _specs([2, 3, 4, 5, 2, 3, 4, 5])
  one = _rollout(params, pool, Temperature(1.0), seeds=seeds, specs=specs).collate(pad_id=0)
  mesh = sharding_lib.make_mesh(*shape)
  with jax.set_mesh(mesh):
    placed = jax.device_put(params, param_shardings(CONFIG, mesh, sharding_lib.SAMPLE_RULES))
    many = _rollout(placed, pool, Temperature(1.0), seeds=seeds, specs=specs).collate(pad_id=0)
  np.testing.assert_array_equal(one["tokens"], many["tokens"])
  np.testing.assert_array_equal(one["policy_mask"], many["policy_mask"])
  np.testing.assert_allclose(one["sampler_logp"], many["sampler_logp"], atol=1e-5)


def test_new_episodes_of_the_same_shapes_do_not_recompile(params, pool):
  """Other seeds, turn counts and observation lengths within the buckets reuse every program."""
  _rollout(params, pool, Temperature(1.0), seeds=[0, 1], specs=_specs([2, 3]))
  fns = (mt.start_episodes, mt.begin_turn, mt.decode_chunk, mt.append)
  sizes = [f._cache_size() for f in fns]
  _rollout(params, pool, Temperature(1.0), seeds=[5, 6], specs=_specs([4, 1]))
  assert [f._cache_size() for f in fns] == sizes
