"""Mixed precision (``model.compute_dtype='bfloat16'`` with float32 parameters), on a tiny model.

Stated tolerances, measured on this model (V = 48, D = 64, L = 2; its embedding and unembedding
scaled x5 so that the next-token distributions are far from uniform, log-probs -3.6 on average):

* one bfloat16-mixed train step vs the float32 step on the same batch: loss within 1e-3 absolute,
  gradient (= the SGD update) within 2% relative L2 error (measured 0.6%);
* bfloat16 sampler log-probs vs the bfloat16 trainer forward: mean |gap| <= 1e-5 nats, max <= 1e-4
  (measured 1.3e-7 / 4.8e-7, the float32 level: both keep the residual stream in float32; it was
  1.7e-3 / 7.8e-3 with a bfloat16 one); float32: the same bounds (measured 1.7e-7 / 7.2e-7). A
  bfloat16 trainer on a float32 sampler's tokens: mean <= 5e-3, max <= 0.03 (measured 2.0e-3 /
  8.7e-3); the correction tests use that gap.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlvr_jax import losses, model, sampling
from rlvr_jax.train import config as config_lib
from rlvr_jax.train import step as step_lib
from rlvr_jax.train.state import TrainBatch, init_state

F32 = model.ModelConfig.tiny(
  vocab_size=48,
  hidden_size=64,
  intermediate_size=128,
  num_layers=2,
  num_heads=4,
  num_kv_heads=2,
  head_dim=16,
)
MIXED = F32.replace(compute_dtype="bfloat16")
P, S, G, T = 4, 6, 4, 12


@functools.cache
def _params():
  params = model.init_params(F32, jax.random.key(0))
  return dict(params, embed=params["embed"] * 5, lm_head=params["lm_head"] * 5)


@functools.cache
def _rollout(config):
  rng = np.random.default_rng(0)
  prompts = rng.integers(3, F32.vocab_size, (P, S)).astype(np.int32)
  mask = np.ones((P, S), bool)
  mask[::2, :2] = False
  return sampling.generate(
    _params(), prompts, mask, config=config, num_samples=G, strategy=sampling.Temperature(1.0),
    key=jax.random.key(3), max_new_tokens=T, stop_tokens=(), phase_steps=0,
  )  # fmt: skip


def _batch(rollout):
  tokens, positions = step_lib.sequence_inputs(
    rollout.prompt_tokens, rollout.prompt_mask, rollout.tokens
  )
  cmask = np.asarray(rollout.completion_mask)
  adv = np.random.default_rng(1).normal(size=(P * G, 1)).astype(np.float32) * cmask
  batch = TrainBatch(
    tokens=tokens, positions=positions, completion_mask=jnp.asarray(cmask),
    advantages=jnp.asarray(adv), old_logp=rollout.sampler_logp,
    sampler_logp=rollout.sampler_logp, ref_logp=None, extras={},
  )  # fmt: skip
  return batch, float(cmask.sum()), float((cmask.sum(-1) > 0).sum())


OPTIMIZERS = {"sgd": optax.sgd(1.0), "adamw": optax.adamw(1e-3)}  # sgd: the update is -grad


@functools.cache
def _step(config, rollout_config, opt="sgd", **kwargs):
  """(state, metrics) after one on-policy GRPO step of ``config`` on the rollout sampled with
  ``rollout_config`` (cached: each configuration compiles and runs once for the whole file)."""
  step = step_lib.make_train_step(
    model_config=config, optimizer=OPTIMIZERS[opt], objective="grpo", objective_kwargs=kwargs,
    on_policy=True, chunk_size=8,
  )  # fmt: skip
  batch, num_tokens, num_seqs = _batch(_rollout(rollout_config))
  params = jax.tree.map(jnp.copy, _params())
  if config.dtype == "bfloat16":
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  state = init_state(params, OPTIMIZERS[opt], jax.random.key(1))
  state, metrics = step(state, batch, num_tokens, num_seqs, jax.random.key(2))
  return state, jax.device_get(metrics)


def _flat(tree):
  return np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(tree)])


def test_compute_params_casts_weights_once_and_float32_is_the_identity():
  params = _params()
  same = model.compute_params(params, F32)
  assert all(a is b for a, b in zip(jax.tree.leaves(same), jax.tree.leaves(params), strict=True))
  cast = model.compute_params(params, MIXED)
  assert cast["embed"].dtype == jnp.bfloat16 and cast["layers"]["wq"].dtype == jnp.bfloat16
  assert cast["lm_head"].dtype == jnp.bfloat16
  # Norm gains keep the master dtype (rms_norm multiplies in float32).
  assert (
    cast["layers"]["attn_norm"].dtype == jnp.float32 and cast["final_norm"].dtype == jnp.float32
  )
  again = model.compute_params(cast, MIXED)  # already cast: nothing to do
  assert again["layers"]["wq"] is cast["layers"]["wq"]
  # The unembedding the log-prob kernels get is the bfloat16 copy too.
  assert model.unembed_matrix(params, MIXED).dtype == jnp.bfloat16
  assert model.unembed_matrix(params, F32).dtype == jnp.float32
  # bfloat16 activations and KV cache; logits float32.
  logits, cache, _ = sampling.prefill(
    params, jnp.ones((2, 4), jnp.int32), jnp.ones((2, 4), bool), config=MIXED, cache_len=8
  )
  assert cache.k[0].dtype == jnp.bfloat16 and logits.dtype == jnp.float32
  assert MIXED.activation_dtype == "bfloat16" and MIXED.mixed_precision
  pure = F32.replace(dtype="bfloat16")  # pure bfloat16: computes in bfloat16 whatever compute_dtype
  assert pure.activation_dtype == "bfloat16" and not pure.mixed_precision
  assert F32.activation_dtype == "float32" and not F32.mixed_precision


def test_model_config_rejects_unknown_compute_dtype():
  with pytest.raises(ValueError, match="compute_dtype must be 'float32' or 'bfloat16'"):
    F32.replace(compute_dtype="float16")


def test_mixed_step_equals_float32_step_within_tolerance():
  # One batch (sampled in float32) for both: only the precision of the step differs.
  s32, m32 = _step(F32, F32)
  s16, m16 = _step(MIXED, F32)
  assert float(m32["grad_norm"]) > 1e-2  # a real gradient
  np.testing.assert_allclose(m16["loss"], m32["loss"], atol=1e-3)
  g32 = _flat(s32.params) - _flat(_params())
  g16 = _flat(s16.params) - _flat(_params())
  rel = np.linalg.norm(g16 - g32) / np.linalg.norm(g32)
  assert 0 < rel < 0.02, rel  # > 0: the mixed step did not run in float32
  np.testing.assert_allclose(m16["grad_norm"], m32["grad_norm"], rtol=0.02)


def test_master_params_and_optimizer_state_stay_float32():
  """The gradient reached the float32 master weights through the cast; Adam's moments are float32."""
  state, _ = _step(MIXED, MIXED, "adamw")
  for leaf in jax.tree.leaves((state.params, state.opt_state)):
    assert not jnp.issubdtype(leaf.dtype, jnp.floating) or leaf.dtype == jnp.float32, leaf.dtype
  assert float(optax.global_norm(jax.tree.map(jnp.subtract, state.params, _params()))) > 0


def test_pure_bfloat16_keeps_bfloat16_params():
  state, m = _step(F32.replace(dtype="bfloat16"), F32)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(state.params))
  assert np.isfinite(float(m["loss"])) and float(m["grad_norm"]) > 0


def _gaps(rollout, config):
  batch, _, _ = _batch(rollout)
  logp, _ = step_lib.completion_logprobs(
    _params(), batch.tokens, batch.positions, num_completion=T, model_config=config,
    temperature=1.0, chunk_size=8,
  )  # fmt: skip
  m = np.asarray(rollout.completion_mask)
  return np.abs(np.asarray(logp) - np.asarray(rollout.sampler_logp))[m]


def test_bfloat16_sampler_matches_the_bfloat16_trainer_forward():
  """The bfloat16 sampler (KV-cache decode) and the bfloat16 trainer forward (one scan over the
  sequence) give the same log-probs up to float32 rounding: both round the same matmul outputs to
  bfloat16 and keep the residual stream in float32, where the small differences of the two
  attention paths stay small. (With a bfloat16 residual stream they were amplified to a mean of
  1.7e-3 nats, docs/design.md "Mixed precision".)"""
  f32 = _gaps(_rollout(F32), F32)
  assert f32.mean() <= 1e-5 and f32.max() <= 1e-4
  same = _gaps(_rollout(MIXED), MIXED)
  assert same.mean() <= 1e-5 and same.max() <= 1e-4
  # The sampler really ran in bfloat16: scored in float32 its tokens are far off.
  across = _gaps(_rollout(MIXED), F32)
  assert across.mean() > 1e-4 and across.mean() > 100 * same.mean()


def test_gap_metric_is_logged_every_step():
  _, m32 = _step(F32, F32)
  _, m16 = _step(MIXED, MIXED)
  _, cross = _step(MIXED, F32)  # a bfloat16 trainer on a float32 sampler's tokens
  for m in (m32, m16):
    assert float(m["logp_gap/mean"]) <= 1e-5 and float(m["logp_gap/max"]) <= 1e-4
  assert 1e-4 < float(cross["logp_gap/mean"]) <= 5e-3
  assert float(cross["logp_gap/mean"]) < float(cross["logp_gap/max"]) <= 0.03
  # the metric is the gap of the step's own (bfloat16) forward to the sampler's log-probs
  np.testing.assert_allclose(cross["logp_gap/mean"], _gaps(_rollout(F32), MIXED).mean(), rtol=1e-3)


def test_correction_changes_the_weights_when_the_gap_exceeds_the_bound():
  """Masked importance sampling (``token_mask``) with a band of +-1e-3 nats on log rho = logp -
  sampler_logp: wider than the float32 gap (<= 1e-4), narrower than most of the gap of a
  bfloat16 trainer on a float32 sampler's tokens. Tokens outside the band get weight 0."""
  delta = 1e-3
  kw = dict(
    mismatch="token_mask", mismatch_low=float(np.exp(-delta)), mismatch_high=float(np.exp(delta))
  )
  _, plain16 = _step(MIXED, F32)
  _, fixed16 = _step(MIXED, F32, **kw)
  _, plain32 = _step(F32, F32)
  _, fixed32 = _step(F32, F32, **kw)
  assert float(fixed32["mismatch/masked_frac"]) == 0.0
  np.testing.assert_allclose(fixed32["loss"], plain32["loss"], atol=1e-6)
  assert 0.05 < float(fixed16["mismatch/masked_frac"]) < 1.0
  assert abs(float(fixed16["loss"]) - float(plain16["loss"])) > 1e-5
  # the same weights from the library function, on the step's own bfloat16 log-probs
  batch, _, _ = _batch(_rollout(F32))
  logp, _ = step_lib.completion_logprobs(
    _params(), batch.tokens, batch.positions, num_completion=T, model_config=MIXED,
    temperature=1.0, chunk_size=8,
  )  # fmt: skip
  w = losses.mismatch_weights(
    logp, batch.sampler_logp, batch.completion_mask, mode="token_mask",
    low=kw["mismatch_low"], high=kw["mismatch_high"],
  )  # fmt: skip
  m = np.asarray(batch.completion_mask)
  np.testing.assert_allclose(
    fixed16["mismatch/masked_frac"], (np.asarray(w)[m] == 0).mean(), atol=1e-6
  )


@pytest.mark.parametrize(
  "override,field",
  [
    (dict(model=dict(compute_dtype="float16")), "model.compute_dtype"),
    (dict(objective=dict(kwargs=dict(mismatch="tis"))), "objective.kwargs.mismatch"),
    (dict(objective=dict(kwargs=dict(mismatch_high=-1.0))), "objective.kwargs.mismatch_high"),
    (
      dict(objective=dict(kwargs=dict(mismatch_low=3.0, mismatch_high=2.0))),
      "objective.kwargs.mismatch_low",
    ),
  ],
)
def test_config_validation_names_the_field(tmp_path, override, field):
  c = config_lib.tiny_config(tmp_path, **override)
  with pytest.raises(config_lib.ConfigError, match=f"^config.{field}: "):
    config_lib.validate(c)


def test_config_accepts_mixed_precision_and_corrections(tmp_path):
  c = config_lib.tiny_config(
    tmp_path, model=dict(compute_dtype="bfloat16"),
    objective=dict(kwargs=dict(mismatch="token_truncate", mismatch_high=2.0)),
  )  # fmt: skip
  config_lib.validate(c)


@pytest.mark.slow  # a trainer with reward workers and one compiled RL step: ~25 s of CPU
def test_trainer_in_mixed_precision_applies_the_bf16_default_correction(tmp_path):
  """One RL step of the trainer with model.compute_dtype='bfloat16': the gap is logged, the
  default correction (config.BF16_MISMATCH: TIS, C = 2) is applied, the master params stay
  float32; an explicit objective.kwargs.mismatch wins over the default."""
  from rlvr_jax.train import loop

  assert config_lib.mismatch_defaults(config_lib.tiny_config(tmp_path)) == {}
  explicit = config_lib.tiny_config(
    tmp_path, model=dict(compute_dtype="bfloat16"), objective=dict(kwargs=dict(mismatch="none"))
  )
  trainer = loop.Trainer(explicit, log=lambda s: None)
  try:  # the step's static configuration holds the objective's keywords
    assert dict(trainer.plain_train_step.keywords["cfg"].objective_kwargs)["mismatch"] == "none"
  finally:
    trainer.close()
  c = config_lib.tiny_config(tmp_path, model=dict(compute_dtype="bfloat16"))
  trainer = loop.Trainer(c, log=lambda s: None)
  try:
    assert trainer.restore_or_start() == 0
    m = trainer.rl_step(0)
    assert trainer.model_config.mixed_precision
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(trainer.state.params))
    step_config = trainer.plain_train_step.keywords["cfg"]  # (a closed trainer holds no step)
  finally:
    trainer.close()
  assert step_config.objective_kwargs is not None
  kwargs = dict(step_config.objective_kwargs)
  assert kwargs["mismatch"] == config_lib.BF16_MISMATCH["mismatch"]
  assert kwargs["mismatch_high"] == config_lib.BF16_MISMATCH["mismatch_high"]
  assert 0 <= m["logp_gap/mean"] < 1e-3
  assert abs(m["mismatch/weight_mean"] - 1.0) < 1e-3  # the weights of a near-zero gap
  assert m["mismatch/masked_frac"] == 0.0  # a truncation, not a mask


def test_linear_backward_accumulates_in_float32():
  """``layers.linear`` on bfloat16 operands: value and both gradients equal float64 math on the
  same bfloat16 values up to one bfloat16 rounding of each result (the plain autodiff of a
  bfloat16-result einsum would round inside its backward dots differently)."""
  from rlvr_jax.model import layers

  k1, k2, k3 = jax.random.split(jax.random.key(3), 3)
  x = jax.random.normal(k1, (2, 5, 96)).astype(jnp.bfloat16)
  w = (0.1 * jax.random.normal(k2, (96, 3, 8))).astype(jnp.bfloat16)
  g = jax.random.normal(k3, (2, 5, 3, 8)).astype(jnp.bfloat16)
  y, vjp = jax.vjp(lambda a, b: layers.linear("bsd,dnh->bsnh", a, b), x, w)
  dx, dw = vjp(g)
  assert y.dtype == dx.dtype == dw.dtype == jnp.bfloat16
  x64, w64, g64 = (np.asarray(v, np.float64) for v in (x, w, g))
  want = (
    np.einsum("bsd,dnh->bsnh", x64, w64),
    np.einsum("bsnh,dnh->bsd", g64, w64),
    np.einsum("bsd,bsnh->dnh", x64, g64),
  )
  for got, ref in zip((y, dx, dw), want, strict=True):
    np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=2**-8, atol=1e-6)


def _dots(hlo: str) -> list[tuple[str, str, str, str]]:
  """(lhs dtype, rhs dtype, result dtype, result shape "d0,d1,...") of every dot in compiled HLO
  text."""
  dtypes = dict(re.findall(r"%([\w.\-]+) = (\w+)\[", hlo))
  dots = re.findall(r"= (\w+)\[([\d,]*)\]\S* dot\(%([\w.\-]+), %([\w.\-]+)\)", hlo)
  return [(dtypes[a], dtypes[b], out, shape) for out, shape, a, b in dots]


def test_decode_loop_reads_the_unembedding_in_bfloat16():
  """With tied embeddings the [D, V] unembedding is the transposed embedding; ``generate`` makes
  it once per call in the compute dtype (``model.with_unembed``), so every decode step's logits
  product is bfloat16 x bfloat16 (XLA:CPU ran the transposed form as a float32 product over a
  float32 copy of the embedding). float32 params are left as they are."""
  from rlvr_jax.sampling import sampler

  config = MIXED.replace(tie_word_embeddings=True)
  params = model.init_params(config, jax.random.key(0))
  assert "lm_head" not in params
  assert model.with_unembed(params, F32.replace(tie_word_embeddings=True)) is params
  cast = model.with_unembed(model.compute_params(params, config), config)
  np.testing.assert_array_equal(cast["unembed"], params["embed"].T.astype(jnp.bfloat16))
  hidden = jax.random.normal(jax.random.key(1), (3, config.hidden_size)).astype(jnp.bfloat16)
  np.testing.assert_allclose(
    model.logits_from_hidden(cast, hidden, config),
    np.asarray(hidden, np.float32) @ np.asarray(cast["unembed"], np.float32),
    rtol=1e-5, atol=1e-5,
  )  # fmt: skip
  prompts = jnp.ones((P, S), jnp.int32)
  hlo = sampler.generate_jit.lower(
    params, prompts, jnp.ones((P, S), bool), jnp.arange(P), jax.random.key(0),
    jnp.zeros((1,), jnp.int32), config=config, strategy=sampling.Temperature(1.0),
    num_samples=G, max_new_tokens=T, pad_id=0, phases=(S + T,),
  ).compile().as_text()  # fmt: skip
  logits_dots = [
    (a, b)
    for a, b, out, shape in _dots(hlo)
    if (out, shape) == ("f32", f"{P * G},{config.vocab_size}")
  ]
  assert logits_dots, "no decode logits product found"
  assert set(logits_dots) == {("bf16", "bf16")}


def test_mixed_train_step_runs_every_matmul_on_bfloat16_operands():
  """The speed contract of mixed precision: in the compiled train step every dot is bfloat16 x
  bfloat16 with a float32 result: the 7 weight matmuls of a layer (forward and both backward
  products; the layers are one scan body), attention's 2 (and their 4 backward products), the
  logits and both backward products of the log-prob sweep. XLA:CPU turns a dot with a bfloat16
  result into a float32 dot (about 4x slower here than its bfloat16 kernel), and so it does with
  a dot of a float32 cotangent or of a transposed bfloat16 operand (``layers.lowp_einsum``,
  ``logprobs.tiles.backward_tile``)."""
  opt = OPTIMIZERS["sgd"]
  step = step_lib.make_train_step(model_config=MIXED, optimizer=opt, objective="grpo")
  batch, num_tokens, num_seqs = _batch(_rollout(MIXED))
  state = init_state(_params(), opt, jax.random.key(1))
  args = (state, batch, num_tokens, num_seqs, jax.random.key(2))
  hlo = step.func.lower(*args, **step.keywords).compile().as_text()
  operand_types = [(a, b, out) for a, b, out, _ in _dots(hlo)]
  assert len(operand_types) >= 7 * 3 + 6 + 3, operand_types
  assert set(operand_types) == {("bf16", "bf16", "f32")}, operand_types
