"""rl.share_prompts: a group's common prompt runs through the model once, with the values and
gradients of the plain forward over the concatenated rows."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlvr_jax import model
from rlvr_jax.train import step as step_lib
from rlvr_jax.train.state import TrainBatch, init_state

CFG = model.ModelConfig.tiny(
  vocab_size=40,
  hidden_size=32,
  intermediate_size=64,
  num_layers=2,
  num_heads=4,
  num_kv_heads=2,
  head_dim=8,
)
P, G, S_P, T = 3, 4, 6, 5


def _rows(seed=0):
  """P prompts (left-padded to different lengths) repeated G times, B = P * G completions."""
  rng = np.random.default_rng(seed)
  prompt = rng.integers(3, CFG.vocab_size, (P, S_P)).astype(np.int32)
  pmask = np.ones((P, S_P), bool)
  pmask[0, :3] = False
  pmask[2, :1] = False
  prompt[~pmask] = 0
  comp = rng.integers(3, CFG.vocab_size, (P * G, T)).astype(np.int32)
  return np.repeat(prompt, G, 0), np.repeat(pmask, G, 0), comp


@pytest.mark.parametrize("compute_dtype,tol", [("float32", 2e-5), ("bfloat16", 3e-2)])
def test_forward_shared_prompt_equals_forward_on_concatenated_rows(compute_dtype, tol):
  cfg = CFG.replace(compute_dtype=compute_dtype) if compute_dtype != "float32" else CFG
  params = model.init_params(CFG, jax.random.key(0))
  prompt, pmask, comp = _rows()
  tokens, positions = step_lib.sequence_inputs(prompt, pmask, jnp.asarray(comp))
  full, _ = model.forward(params, tokens, positions, config=cfg)
  hp, hc = model.forward_shared_prompt(
    params, tokens[::G, :S_P], positions[::G, :S_P], tokens[:, S_P:], positions[:, S_P:], config=cfg
  )
  assert hp.shape == (P, S_P, CFG.hidden_size) and hc.shape == (P * G, T, CFG.hidden_size)
  f32 = lambda a: np.asarray(a, np.float32)
  np.testing.assert_allclose(f32(hc), f32(full[:, S_P:]), atol=tol, rtol=tol)
  real = pmask[::G]  # padding outputs are garbage in both
  np.testing.assert_allclose(f32(hp)[real], f32(full[::G, :S_P])[real], atol=tol, rtol=tol)


def test_forward_shared_prompt_rejects_mismatched_rows():
  params = model.init_params(CFG, jax.random.key(0))
  z = lambda *s: jnp.zeros(s, jnp.int32)
  with pytest.raises(ValueError, match="multiple of P"):
    model.forward_shared_prompt(params, z(3, 4), z(3, 4), z(7, 2), z(7, 2), config=CFG)


def _step(prompt_group, *, objective="grpo", num_microbatches=1, remat=False):
  cfg = CFG.replace(remat=True) if remat else CFG
  opt = optax.sgd(1.0)  # the update is the gradient: equal params <=> equal gradients
  step = step_lib.make_train_step(
    model_config=cfg, optimizer=opt, objective=objective, num_microbatches=num_microbatches,
    chunk_size=2, prompt_group=prompt_group,
  )  # fmt: skip
  prompt, pmask, comp = _rows(1)
  rng = np.random.default_rng(2)
  cmask = np.arange(T)[None, :] < rng.integers(1, T + 1, P * G)[:, None]
  tokens, positions = step_lib.sequence_inputs(prompt, pmask, jnp.asarray(comp))
  old = jnp.asarray(rng.normal(size=(P * G, T)).astype(np.float32) * 0.1 - 3.0)
  batch = TrainBatch(
    tokens=tokens, positions=positions, completion_mask=jnp.asarray(cmask),
    advantages=jnp.asarray(rng.normal(size=(P * G, 1)).astype(np.float32) * cmask),
    old_logp=old, sampler_logp=old, ref_logp=None, extras={},
  )  # fmt: skip
  state = init_state(model.init_params(cfg, jax.random.key(0)), opt, jax.random.key(1))
  n_tok, n_seq = float(cmask.sum()), float(P * G)
  state, metrics = step(state, batch, n_tok, n_seq, jax.random.key(5))
  return state, jax.device_get(metrics)


@pytest.mark.parametrize(
  "objective,num_microbatches,remat",
  [("grpo", 1, False), ("grpo", 3, True), ("gspo", 1, False)],
)
def test_shared_prompt_step_equals_plain_step(objective, num_microbatches, remat):
  plain, m_plain = _step(1, objective=objective, num_microbatches=num_microbatches, remat=remat)
  shared, m_shared = _step(G, objective=objective, num_microbatches=num_microbatches, remat=remat)
  assert float(m_plain["update_norm"]) > 1e-3
  for a, b in zip(jax.tree.leaves(plain.params), jax.tree.leaves(shared.params), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=2e-6)
  for key in ("loss", "grad_norm", "ratio/mean", "logp_gap/mean", "entropy/mean"):
    np.testing.assert_allclose(m_plain[key], m_shared[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_shared_prompt_scoring_equals_plain_scoring():
  params = model.init_params(CFG, jax.random.key(3))
  prompt, pmask, comp = _rows(4)
  tokens, positions = step_lib.sequence_inputs(prompt, pmask, jnp.asarray(comp))
  score = step_lib.make_score_fn(model_config=CFG, chunk_size=2, num_microbatches=3)
  plain = score(params, tokens, positions, T)
  shared = score(params, tokens, positions, T, prompt_group=G)
  for a, b in zip(plain, shared, strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_shares_prompts():
  prompt, pmask, _ = _rows()
  assert step_lib.shares_prompts(prompt, pmask, G)
  assert step_lib.shares_prompts(prompt, pmask, G, num_microbatches=3)
  # a micro-batch boundary inside a group, a group size that does not divide the rows
  assert not step_lib.shares_prompts(prompt, pmask, G, num_microbatches=2)
  assert not step_lib.shares_prompts(prompt, pmask, 5)
  assert not step_lib.shares_prompts(prompt, pmask, 1)
  other = prompt.copy()
  other[G + 1, -1] += 1  # one row of the second group has another prompt
  assert not step_lib.shares_prompts(other, pmask, G)
  shifted = pmask.copy()
  shifted[1, 3] = False  # the same tokens, one more padding column
  assert not step_lib.shares_prompts(prompt, shifted, G)
  padded = prompt.copy()
  padded[0, 0] = 7  # a different token under the padding mask does not matter
  assert step_lib.shares_prompts(padded, pmask, G)


@pytest.mark.parametrize(
  "rl",
  [
    # two minibatches: an old-log-prob scoring pass, then an off-policy second update
    dict(num_minibatches=2, num_microbatches=2, use_reference=True),
    # ReMax's greedy row: generate makes G + 1 = 5 rows per prompt for the scoring passes
    dict(advantage="remax", use_reference=True),
  ],
)
def test_trainer_shares_prompts_with_the_same_result(tmp_path, rl):
  """Two steps of the tiny run with rl.share_prompts on and off: every update and the no-grad
  passes (old and reference log-probs) run each prompt once, and the run's numbers agree."""
  from rlvr_jax.metrics import read_jsonl
  from rlvr_jax.train import config as config_lib
  from rlvr_jax.train.loop import train

  runs = {}
  for share in (True, False):
    workdir = tmp_path / str(share)
    c = config_lib.tiny_config(workdir, rl=dict(rl, share_prompts=share))
    # eps = 1: Adam's update is ~lr * g for small g. With the default eps a minibatch whose
    # groups all have zero advantage (exact-zero gradient) becomes lr * sign(round-off) on one
    # side and 0 on the other, and the two runs part ways.
    c.optim.update(learning_rate=1.0, eps=1.0)
    c.objective.kwargs.kl_coef = 0.1  # the reference log-probs enter the loss
    train(c, log=lambda s: None)
    runs[share] = [r for r in read_jsonl(str(workdir / "metrics.jsonl")) if "loss" in r]
  on, off = runs[True], runs[False]
  assert len(on) == len(off) == 2
  assert [r["update/shared_prompts"] for r in on] == [1.0, 1.0]
  assert [r["update/shared_prompts"] for r in off] == [0.0, 0.0]
  for a, b in zip(on, off, strict=True):
    assert a["reward/mean"] == b["reward/mean"]  # the same samples
    for key in ("loss", "grad_norm", "ratio/mean", "kl/k3", "entropy/mean"):
      assert key in a, key
      np.testing.assert_allclose(a[key], b[key], rtol=1e-4, atol=1e-6, err_msg=key)
