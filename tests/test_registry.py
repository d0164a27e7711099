"""The method registries: ``losses.OBJECTIVES`` (``ObjectiveSpec``) and ``advantages.ESTIMATORS``
(``EstimatorSpec``): every description is consistent with its function, the views derived from the
tables, and the public registration API."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlvr_jax import advantages, losses

B, T, G = 8, 5, 4


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  logp = jnp.asarray(-rng.uniform(0.1, 2.0, (B, T)), jnp.float32)
  mask = jnp.asarray(np.arange(T)[None] < rng.integers(1, T + 1, B)[:, None])
  return dict(
    logp=logp,
    old_logp=logp + jnp.asarray(rng.normal(0, 0.2, (B, T)), jnp.float32),
    advantages=jnp.asarray(np.repeat(rng.normal(size=(B, 1)), T, 1), jnp.float32),
    completion_mask=mask,
    entropy=jnp.asarray(rng.uniform(0, 2, (B, T)), jnp.float32),
    noise=jnp.asarray(rng.uniform(size=(B, T)), jnp.float32),
  )


@pytest.mark.parametrize("name", sorted(losses.STEP_STAT_OBJECTIVES))
def test_step_stats_return_exactly_the_declared_keywords(name):
  spec = losses.OBJECTIVES[name]
  d = _batch()
  n_tok = jnp.sum(d["completion_mask"]).astype(jnp.float32)
  stats = losses.step_statistics(
    name, d["logp"], d["old_logp"], d["advantages"], d["completion_mask"], entropy=d["entropy"],
    noise=d["noise"], num_tokens=n_tok, num_seqs=jnp.float32(B),
  )  # fmt: skip
  assert tuple(sorted(stats)) == tuple(sorted(spec.stat_kwargs))
  params = inspect.signature(spec).parameters
  for kw in spec.array_kwargs() - losses.registry.BATCH_KWARGS:
    assert kw in params, (name, kw)  # every declared input / statistic / state kwarg is a keyword
  assert not set(spec.hyperparameters()) & spec.array_kwargs()


def test_objective_specs_are_hashable_values_and_views_follow_the_table():
  specs = list(losses.OBJECTIVES.values())
  assert len({hash(s) for s in specs}) == len(specs)
  assert set(losses.TOKEN_LOCAL_OBJECTIVES) == {s.name for s in specs if s.token_local}
  assert set(losses.STEP_STAT_OBJECTIVES) == {s.name for s in specs if s.step_stats}
  assert losses.is_token_local("grpo", {}) and not losses.is_token_local("grpo", {"scope": "micro"})
  assert not losses.is_token_local("gspo", {}) and not losses.is_token_local("nope", {})
  # SIREN needs its statistics at any scope; Clip-Cov only at 'step'.
  assert losses.OBJECTIVES["siren"].needs_step_stats({"scope": "micro"})
  assert not losses.OBJECTIVES["clip_cov"].needs_step_stats({"scope": "micro"})
  assert [i.name for i in losses.OBJECTIVES["copo"].inputs_from("estimator")] == [
    "global_advantages", "local_weight"]  # fmt: skip
  with pytest.raises(ValueError, match="source"):
    losses.Input("x", "from_the_sky")


def test_siren_state_freezes_the_first_anchor():
  st = losses.OBJECTIVES["siren"].state
  s0 = st.init({})
  assert np.isnan(float(s0))
  kw = st.step_kwargs(s0, {"siren_selected_entropy": jnp.float32(1.5)}, {})
  assert float(kw["siren_anchor"]) == 1.5
  s1 = st.update(s0, {"siren_selected_entropy": jnp.float32(1.5)}, {}, {})
  s2 = st.update(s1, {"siren_selected_entropy": jnp.float32(0.2)}, {}, {})
  assert float(s2) == 1.5


def _user_objective(logp, old_logp, advantages, completion_mask, *, num_tokens, num_seqs,
                    ref_logp=None, sampler_logp=None, entropy=None, mean_log_softmax=None,
                    scale=2.0, **options):  # fmt: skip
  """A user's REINFORCE: -scale * A * logp, token mean."""
  m = jnp.asarray(completion_mask, jnp.float32)
  loss = -scale * jnp.sum(m * advantages * logp) / num_tokens
  return loss, {"loss/total": (loss * num_tokens, jnp.sum(m))}


def test_register_objective_public_api():
  spec = losses.ObjectiveSpec("test_user_reinforce", _user_objective, token_local=True)
  try:
    assert losses.register_objective(spec) is spec
    assert losses.register_objective(spec) is spec  # the same value again: fine
    assert "test_user_reinforce" in losses.TOKEN_LOCAL_OBJECTIVES  # views are live
    assert losses.get_objective("test_user_reinforce").hyperparameters() == {"scale": 2.0}
    with pytest.raises(ValueError, match="already registered"):
      losses.register_objective(losses.ObjectiveSpec("test_user_reinforce", _user_objective))
    d = _batch()
    loss, _ = losses.OBJECTIVES["test_user_reinforce"](
      d["logp"], d["old_logp"], d["advantages"], d["completion_mask"], num_tokens=10.0, num_seqs=8.0
    )
    m = np.asarray(d["completion_mask"], np.float32)
    want = -2.0 * np.sum(m * np.asarray(d["advantages"]) * np.asarray(d["logp"])) / 10.0
    np.testing.assert_allclose(float(loss), want, rtol=1e-6)
  finally:
    losses.OBJECTIVES.pop("test_user_reinforce", None)
  with pytest.raises(TypeError):
    losses.register_objective(_user_objective)
  with pytest.raises(ValueError, match="unknown objective"):
    losses.get_objective("test_user_reinforce")


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  P = B // G
  rewards = rng.integers(0, 2, (P, G)).astype(np.float32)
  rewards[0] = [1, 0, 1, 0]
  turns = rng.integers(1, 4, B)
  turn_r = rng.integers(0, 2, (B, 3)).astype(np.float32)
  index = np.minimum(np.arange(T) // max(T // 3, 1) + 1, 3)[None, :].repeat(B, 0)
  return {
    "rewards": jnp.asarray(rewards),
    "valid": jnp.ones((P, G), bool),
    "completion_mask": jnp.asarray(np.arange(T)[None] < rng.integers(1, T + 1, B)[:, None]),
    "answer_ids": jnp.asarray(rng.integers(0, 3, (P, G)), jnp.int32),
    "greedy_rewards": jnp.asarray(rng.integers(0, 2, P), jnp.float32),
    "metric": jnp.asarray(rng.uniform(size=(P, G)), jnp.float32),
    "token_rewards": jnp.asarray(rng.normal(size=(B, T)), jnp.float32),
    "prm_token_rewards": jnp.asarray(rng.normal(size=(B, T)), jnp.float32),
    "values": jnp.asarray(rng.normal(size=(B, T)), jnp.float32),
    "old_logp": jnp.asarray(-rng.uniform(0.1, 2, (B, T)), jnp.float32),
    "sum_pi_squared": jnp.asarray(rng.uniform(0.1, 0.9, (B, T)), jnp.float32),
    "reward_components": jnp.asarray(rng.integers(0, 2, (P, G, 2)), jnp.float32),
    # episodes of 1-3 turns of T // 3 action tokens each (reached turns get a reward)
    "turn_rewards": jnp.asarray(
      np.where(np.arange(3) < turns[:, None], turn_r, np.nan), jnp.float32
    ),
    "turn_index": jnp.asarray(np.where(index <= turns[:, None], index, 0), jnp.int32),
    "completion_tokens": jnp.asarray(rng.integers(0, 3, (B, T)), jnp.int32),
    "retry_prefix": jnp.asarray(rng.integers(0, 3, B), jnp.int32),
    **_spo_inputs(rng),
  }


def _spo_inputs(rng, M=3):
  """SPO's branch-round (and tree-round) inputs: segments cut at every 2nd cutpoint of a random
  cutpoint mask."""
  from rlvr_jax import advantages as adv

  mask = jnp.asarray(np.arange(T)[None] < rng.integers(1, T + 1, B)[:, None])
  cut = mask & jnp.asarray(rng.uniform(size=(B, T)) < 0.5)
  ids, _, nseg = adv.spo_segments(cut, mask, cutpoint_interval=2, max_segments=M)
  values = jnp.asarray(rng.uniform(size=(B, M)), jnp.float32)
  out = dict(segment_values=values, segment_ids=ids, num_segments=nseg, spo_cutpoints=cut)
  return {**out, "tree_values": values}  # SPO-tree: its ancestors' values, the same [B, M] form


REQUIRED = {
  "passk_training": {"k": 2},
  "pkpo": {"k": 2},
  "riskpo": {"bundle_size": 2},
  "pure": {"separator_ids": (1,)},  # token 1 ends a step
  "pure_token_rewards": {"separator_ids": (1,)},
}


@pytest.mark.parametrize("name", sorted(advantages.ESTIMATORS))
def test_every_estimator_runs_from_its_description(name):
  spec = advantages.ESTIMATORS[name]
  hp = REQUIRED.get(name, {})
  assert spec.check is None or spec.check(B // G, G, hp) is None
  state = spec.init_state(hp) if spec.stateful else None
  out = spec.compute(_inputs(), state, **hp)
  shape = (B // G, G) if spec.level == "sequence" else (B, T)
  assert out.advantages.shape == shape and np.all(np.isfinite(np.asarray(out.advantages)))
  assert sorted(out.extras) == sorted(spec.outputs)
  assert (out.state is not None) == spec.stateful
  assert not set(spec.hyperparameters()) & set(advantages.READS)
  with pytest.raises(ValueError, match="reads"):
    spec.compute({"rewards": _inputs()["rewards"]} if len(spec.reads) > 1 else {}, state, **hp)


def test_sequence_estimators_view_and_register_estimator():
  view = advantages.SEQUENCE_ESTIMATORS
  assert {"grpo", "dr_grpo", "lite_ppo", "rloo", "passk_training", "pkpo", "grpo_passk"} <= set(
    view
  )
  assert not {"remax", "copo", "riskpo", "gae"} & set(view)
  assert view["grpo"] is advantages.grpo_advantages

  def halved(rewards, *, valid=None, scale=0.5):
    """Half the GRPO advantage (a test estimator)."""
    return scale * advantages.grpo_advantages(rewards, valid=valid)

  spec = advantages.EstimatorSpec("test_halved", halved)
  try:
    advantages.register_estimator(spec)
    assert view["test_halved"] is halved and spec.hyperparameters() == {"scale": 0.5}
    with pytest.raises(ValueError, match="already registered"):
      advantages.register_estimator(advantages.EstimatorSpec("test_halved", halved, level="token",
                                                             reads=("rewards", "completion_mask")))  # fmt: skip
  finally:
    advantages.ESTIMATORS.pop("test_halved", None)
  assert "test_halved" not in view
  with pytest.raises(ValueError, match="reads"):
    advantages.EstimatorSpec("bad", halved, reads=("rewards", "tea_leaves"))
  with pytest.raises(ValueError, match="unknown advantage estimator"):
    advantages.get_estimator("test_halved")


def test_adaptive_entropy_state_drives_the_coefficient():
  spec = losses.OBJECTIVES["adaptive_entropy"]
  hp = {"target_entropy": 1.0, "entropy_coef_init": 0.1, "entropy_coef_delta": 0.05}
  s0 = spec.state.init(hp)
  kw = spec.state.step_kwargs(s0, {}, hp)
  assert float(kw["adaptive_entropy_coef"]) == pytest.approx(0.1)  # H_last = 0 <= target
  d = _batch()
  n_tok = jnp.sum(d["completion_mask"]).astype(jnp.float32)

  def loss(entropy, coef):
    return spec(d["logp"], d["old_logp"], d["advantages"], d["completion_mask"], num_tokens=n_tok,
                num_seqs=jnp.float32(B), entropy=entropy, adaptive_entropy_coef=coef)[0]  # fmt: skip

  # The bonus is -c mean(H): its gradient w.r.t. H is -c / N_tok on valid tokens.
  g = jax.grad(loss)(d["entropy"], kw["adaptive_entropy_coef"])
  m = np.asarray(d["completion_mask"], np.float32)
  np.testing.assert_allclose(np.asarray(g), -0.1 * m / float(n_tok), rtol=1e-5)
  s1 = spec.state.update(s0, {}, {"entropy/mean": jnp.float32(0.5)}, hp)  # below target: c up
  assert float(s1.coef) == pytest.approx(0.15)
  s2 = spec.state.update(s1, {}, {"entropy/mean": jnp.float32(2.0)}, hp)  # above: c down, off
  assert float(s2.coef) == pytest.approx(0.1)
  assert float(spec.state.step_kwargs(s2, {}, hp)["adaptive_entropy_coef"]) == 0.0
  with pytest.raises(ValueError, match="adaptive_entropy_coef"):
    loss(d["entropy"], None)
