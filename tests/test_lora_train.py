"""LoRA in the trainer (``config.lora``, train/lora_training.py): the step trains adapters only
(its gradient is the full-weight gradient projected on them; the per-layer merge of the remat
path equals the whole-tree merge), a run changes the adapters and never the base, checkpoints hold
no base weight, exact resume, the reference policy is the base (KL equal to a separate copy's),
the int8 base, a (2, 2, 2) mesh equals one device, the PEFT / merged exports, config errors."""

import dataclasses
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_mesh_training import _batch as mesh_batch

from rlvr_jax import model
from rlvr_jax import sharding as S
from rlvr_jax.metrics import read_jsonl
from rlvr_jax.model import lora, peft_export
from rlvr_jax.train import build, lora_training, sharded
from rlvr_jax.train import config as config_lib
from rlvr_jax.train import step as step_lib
from rlvr_jax.train.loop import Trainer
from rlvr_jax.train.state import init_state

LCFG = lora.LoraConfig(rank=4, alpha=8.0)
CFG = model.ModelConfig.tiny(
  vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
  head_dim=8,
)  # fmt: skip


def _quiet(_):
  pass


def _equal_trees(a, b) -> bool:
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(la) == len(lb) and all(
    x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y))
    for x, y in zip(la, lb, strict=True)
  )


def _host(tree):
  return jax.tree.map(np.asarray, tree)


# ------------------------------------------------------------------------------------------------
# The step


def _batch(seed, cfg=CFG):
  return mesh_batch(seed, cfg)


def _optimizer():
  return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2, eps=1e-4))


def _base_and_adapters(cfg=CFG, b_std=0.0):
  base = model.init_params(cfg, jax.random.key(0))
  adapters = lora.init_lora(base, LCFG, jax.random.key(1))
  if b_std:  # a nonzero B, so that A gets a gradient too
    rng = np.random.default_rng(3)
    adapters = jax.tree_util.tree_map_with_path(
      lambda p, x: jnp.asarray(b_std * rng.standard_normal(x.shape), x.dtype)
      if p[-1].key == "b" else x,
      adapters,
    )  # fmt: skip
  return base, adapters


def _step_cfg(cfg=CFG, lcfg=LCFG, **kwargs):
  return step_lib.make_train_step(
    model_config=cfg, optimizer=_optimizer(), objective="dapo", lora=lcfg, **kwargs
  ).keywords["cfg"]


def test_lora_step_gradient_is_the_full_gradient_projected_on_the_adapters():
  """At init (B = 0) the LoRA loss is the full model's loss on the base, dL/dB = (alpha / r)
  A^T dL/dW and dL/dA = 0, with two micro-batches accumulated."""
  base, adapters = _base_and_adapters()
  tb, nt, ns = _batch(0)
  tb = jax.tree.map(jnp.asarray, tb)
  full_cfg = dataclasses.replace(_step_cfg(num_microbatches=2), lora=None)
  lora_cfg = _step_cfg(num_microbatches=2)
  run = jax.jit(step_lib.accumulate_gradients, static_argnums=0)
  loss_w, _, g_w = run(full_cfg, base, tb, nt, ns, {})
  loss_ab, _, g_ab = run(lora_cfg, adapters, tb, nt, ns, {}, base)
  np.testing.assert_allclose(loss_ab, loss_w, rtol=1e-6)
  for name, ab in adapters["layers"].items():
    a = np.asarray(ab["a"]).reshape(CFG.num_layers, -1, LCFG.rank)  # [L, in, r]
    gw = np.asarray(g_w["layers"][name]).reshape(CFG.num_layers, a.shape[1], -1)
    expected = LCFG.scale * np.einsum("lir,lio->lro", a, gw)
    got = np.asarray(g_ab["layers"][name]["b"]).reshape(expected.shape)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6 * np.abs(expected).max())
    assert not np.any(np.asarray(g_ab["layers"][name]["a"])), name
  assert set(g_ab["layers"]) == set(LCFG.weights)  # gradients for the adapters only


def _run_steps(cfg, base, adapters, num_steps=2, mesh=None, lcfg=LCFG):
  opt = _optimizer()
  step = step_lib.make_train_step(model_config=cfg, optimizer=opt, objective="dapo", lora=lcfg)
  # (A copy: the step donates the state, and the caller's adapters may share its buffers.)
  state = init_state(jax.tree.map(jnp.copy, adapters), opt, jax.random.key(1))
  if mesh is not None:
    sh = sharded.state_shardings(state, mesh=mesh, model_config=cfg, optimizer=opt, lora=lcfg)
    state = sharded.place(state, sh)
    base = sharded.place(base, sharded.base_shardings(base, cfg, mesh))
    step = sharded.sharded_train_step(step, sh, mesh)
  metrics = []
  for i in range(num_steps):
    tb, nt, ns = _batch(i, cfg)
    tb = jax.tree.map(jnp.asarray, tb) if mesh is None else sharded.shard_rows(tb, mesh)
    state, m = step(state, tb, nt, ns, jax.random.key(10 + i), base=base)
    metrics.append({k: float(v) for k, v in m.items()})
  return state, metrics, base


def test_lora_steps_train_the_adapters_and_leave_the_base():
  """Two updates: the adapters and their optimiser state move, the base (not donated, still
  readable) is unchanged; the per-layer merge of the remat path (``lora.attach`` and the
  decoder's hook) gives the whole-tree merge's updates."""
  base, adapters = _base_and_adapters(b_std=0.05)
  before = _host(base)
  state, metrics, base_after = _run_steps(CFG, base, adapters)
  assert _equal_trees(before, base_after) and _equal_trees(before, base)
  assert all(m["grad_norm"] > 0 and m["update_norm"] > 0 for m in metrics)
  moved = jax.tree.map(lambda x, y: float(jnp.abs(x - y).max()), state.params, adapters)
  assert min(jax.tree.leaves(moved)) > 0
  shapes = {x.shape for x in jax.tree.leaves(state.opt_state) if x.ndim}
  assert shapes == {x.shape for x in jax.tree.leaves(adapters)}  # moments of the adapters only
  np.testing.assert_allclose(metrics[0]["param_norm"], optax.global_norm(adapters), rtol=1e-6)

  remat = CFG.replace(remat=True)
  state_r, metrics_r, _ = _run_steps(remat, base, adapters)
  for x, y in zip(jax.tree.leaves(state_r.params), jax.tree.leaves(state.params), strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)
  for m, mr in zip(metrics, metrics_r, strict=True):
    np.testing.assert_allclose(mr["loss"], m["loss"], rtol=1e-5)


def test_lora_steps_on_2x2x2_mesh_match_one_device():
  cfg = CFG.replace(num_layers=1)
  base, adapters = _base_and_adapters(cfg, b_std=0.05)
  ref_state, ref_metrics, _ = _run_steps(cfg, base, adapters)
  mesh = S.make_mesh(2, 2, 2)
  state, metrics, placed_base = _run_steps(cfg, base, adapters, mesh=mesh)
  assert any(not x.is_fully_replicated for x in jax.tree.leaves(state.params))
  assert any(not x.is_fully_replicated for x in jax.tree.leaves(placed_base))
  shardings = lora.lora_shardings(cfg, LCFG, mesh)
  for x, sh in zip(jax.tree.leaves(state.params), jax.tree.leaves(shardings), strict=True):
    assert x.sharding == sh
  for a, b in zip(jax.tree.leaves(ref_state.params), jax.tree.leaves(state.params), strict=True):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)
  for ra, rb in zip(ref_metrics, metrics, strict=True):
    for k in ("loss", "grad_norm", "update_norm", "param_norm"):
      np.testing.assert_allclose(rb[k], ra[k], rtol=1e-4, err_msg=k)


# ------------------------------------------------------------------------------------------------
# The trainer


def _config(workdir, **overrides):
  """The tiny run with LoRA r=4 (an entropy bonus keeps the gradient nonzero when every reward of
  the random model is 0), synchronous checkpoints."""
  blocks = dict(
    lora=dict(rank=4),
    objective=dict(kwargs=dict(entropy_coef=0.05)),
    optim=dict(learning_rate=3e-2),
    checkpoint=dict(async_save=False),
  )
  for key, value in overrides.items():
    blocks[key] = {**blocks.get(key, {}), **value}
  return config_lib.tiny_config(workdir, **blocks)


def _run(config):
  trainer = Trainer(config, log=_quiet)
  try:
    summary = trainer.run()
    return _host(trainer.state.params), _host(trainer.base), trainer.state, summary
  finally:
    trainer.close()


def _comparable(records):
  drop = ("time", "reward/time_s", "reward/items_per_s", "eval/time_s")
  return [{k: v for k, v in r.items() if not k.startswith(drop)} for r in records]


def test_lora_run_resumes_exactly_and_checkpoints_only_the_adapters(tmp_path):
  """4 steps (two updates per rollout batch, a KL penalty to the base) == 2 steps, a new
  process-like Trainer, 2 more; the base is the one built from the config, untouched; the
  checkpoint holds the adapters, their moments and counters, never a base weight."""
  n = 4
  over = dict(
    rl=dict(num_steps=n, num_minibatches=2, use_reference=True),
    objective=dict(kwargs=dict(kl_coef=0.1)),
    checkpoint=dict(every=1, keep=2),
  )
  full_ad, full_base, full_state, _ = _run(_config(tmp_path / "full", **over))
  c = _config(tmp_path / "resumed", **over)
  c.max_steps_this_run = n // 2
  half_ad, _, _, _ = _run(c)
  c.max_steps_this_run = 0
  resumed_ad, resumed_base, _, _ = _run(c)
  assert _equal_trees(full_ad, resumed_ad)
  assert not _equal_trees(full_ad, half_ad)
  full = _comparable(read_jsonl(str(tmp_path / "full" / "metrics.jsonl")))
  resumed = _comparable(read_jsonl(str(tmp_path / "resumed" / "metrics.jsonl")))
  assert full == resumed and [r["step"] for r in full] == [0, 1, 2, 3, 4, 4]
  assert all(r["update_norm"] > 0 for r in full if "update_norm" in r)
  assert any(r.get("kl/k3", 0.0) > 0 for r in full)  # the policy left the reference (the base)

  # The base: as built from the config, never updated; no reference copy in the state.
  built = build.build_tokenizer_and_model(c)[1]
  assert _equal_trees(full_base, built) and _equal_trees(resumed_base, built)
  assert "ref_params" not in full_state.extra
  # B started at 0 and moved; A moved too.
  init = lora_training.init_adapters(built, lora_training.lora_config(c), c.seed)
  for name, ab in full_ad["layers"].items():
    assert not np.any(np.asarray(init["layers"][name]["b"])) and np.any(ab["b"])
    assert not np.array_equal(ab["a"], np.asarray(init["layers"][name]["a"]))

  with open(tmp_path / "full" / "checkpoints" / str(n) / "state" / "_METADATA") as f:
    keys = list(json.load(f)["tree_metadata"])
  params_keys = [k for k in keys if k.startswith("('params'")]
  assert len(params_keys) == 2 * len(LCFG.weights)
  assert all(k.endswith(("'a')", "'b')")) for k in keys if "'layers'" in k), keys
  assert not any(w in k for k in keys for w in ("embed", "norm", "lm_head")), keys


def test_reference_is_the_base_and_kl_equals_a_separate_copy(tmp_path):
  """``rl.use_reference`` with LoRA: the reference is the base object itself (no copy in the
  state), and a run whose reference is a separate copy of the base (what full fine-tuning keeps in
  ``state.extra['ref_params']``) gives the same KL terms, losses and adapters, bit for bit."""
  over = dict(rl=dict(use_reference=True), objective=dict(kwargs=dict(kl_coef=0.5)))

  def steps(workdir, separate_copy):
    trainer = Trainer(_config(workdir, **over), log=_quiet)
    try:
      assert "ref_params" not in trainer.state.extra
      assert trainer.reference_params() is trainer.base
      if separate_copy:
        copy = jax.tree.map(jnp.copy, trainer.base)
        trainer.reference_params = lambda: copy
      trainer.restore_or_start()
      metrics = [trainer.rl_step(s) for s in range(2)]
      return _comparable(metrics), _host(trainer.state.params)
    finally:
      trainer.close()

  metrics, adapters = steps(tmp_path / "alias", False)
  copy_metrics, copy_adapters = steps(tmp_path / "copy", True)
  assert metrics == copy_metrics and _equal_trees(adapters, copy_adapters)
  assert metrics[0]["kl/k3"] == 0.0  # B = 0: the first rollout's policy is the reference
  assert metrics[1]["kl/k3"] > 0 and metrics[1]["loss/kl"] > 0


def test_int8_base_run(tmp_path):
  """``lora.int8_base``: the base's projections are int8 (+ float32 scales), the run trains the
  adapters, and the reference is the dequantized base (not the int8 tree)."""
  c = _config(
    tmp_path, lora=dict(int8_base=True, targets="q,v,down"), rl=dict(use_reference=True),
    objective=dict(kwargs=dict(kl_coef=0.1)),
  )  # fmt: skip
  trainer = Trainer(c, log=_quiet)
  try:
    layers = trainer.base["layers"]
    assert lora.is_quantized(layers["wq"]) and layers["wq"]["qint8"].dtype == jnp.int8
    assert set(trainer.state.params["layers"]) == {"wq", "wv", "w_down"}
    ref = trainer.reference_params()
    assert not lora_training.is_quantized_tree(ref) and ref["layers"]["wq"].dtype == jnp.float32
    trainer.restore_or_start()
    m = [trainer.rl_step(s) for s in range(2)]
    assert all(x["update_norm"] > 0 for x in m) and m[1]["kl/k3"] > 0
    assert m[0]["logp_gap/max"] < 1e-4  # sampler (merged, dequantized) vs trainer
  finally:
    trainer.close()


def test_adapter_and_merged_exports(tmp_path):
  """The PEFT folder holds the run's adapters; ``export_merged`` writes the base + (alpha / r)
  A @ B as a Hugging Face folder that loads back to the merged tree."""
  c = _config(tmp_path / "run", rl=dict(num_steps=1))
  trainer = Trainer(c, log=_quiet)
  try:
    trainer.restore_or_start()
    trainer.rl_step(0)
    path = trainer.export_adapter()
    adapters, base = _host(trainer.state.params), _host(trainer.base)
  finally:
    trainer.close()
  assert path == os.path.join(c.workdir, lora_training.ADAPTER_DIR)
  loaded, lcfg = peft_export.load_peft_adapter(path, build.build_tokenizer_and_model(c)[2])
  assert lcfg == lora_training.lora_config(c) and _equal_trees(loaded, adapters)

  out = lora_training.export_merged(c, str(tmp_path / "merged"))
  params, _ = model.load_hf(out, dtype="float32")
  expected = lora.merge(base, adapters, lcfg, "float32")
  for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(expected), strict=True):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


def test_lora_run_compiles_once_and_close_gives_everything_back(tmp_path):
  """No XLA compilation after the first RL step of a LoRA run (the merge for the sampler, the
  step with its base argument), and ``close`` drops every device buffer, the base included."""
  from jax._src import dispatch

  events = []

  def listener(name, secs, **kw):
    if name == dispatch.BACKEND_COMPILE_EVENT:
      events.append(name)

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    live = len(jax.live_arrays())
    trainer = Trainer(_config(tmp_path, rl=dict(num_steps=3, num_minibatches=2)), log=_quiet)
    try:
      trainer.restore_or_start()
      trainer.rl_step(0)
      after_first = len(events)
      trainer.rl_step(1)
      trainer.rl_step(2)
      assert len(events) == after_first, "steps 2 and 3 compiled again"
    finally:
      trainer.close()
    assert trainer.base is None and trainer.merge_fn is None
    assert len(jax.live_arrays()) <= live
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)


@pytest.mark.slow
def test_lora_rl_steps_on_mesh_match_one_device(tmp_path):
  """The whole RL step with LoRA through ``MeshTrainer`` on a (2, 2, 2) mesh: adapters, loss and
  sampler / trainer log-prob agreement as on one device; the base placed by the training rules."""

  def config(workdir):
    return config_lib.tiny_mesh_config(workdir, lora=dict(rank=4), rl=dict(num_steps=2))

  def steps(trainer):
    trainer.restore_or_start()
    return [trainer.rl_step(s) for s in range(2)], _host(trainer.state.params)

  one = Trainer(config(tmp_path / "one"), log=_quiet)
  try:
    ref_metrics, ref_ad = steps(one)
  finally:
    one.close()
  tr = sharded.MeshTrainer(config(tmp_path / "mesh"), mesh=S.make_mesh(2, 2, 2), log=_quiet)
  try:
    assert any(not x.is_fully_replicated for x in jax.tree.leaves(tr.base))
    metrics, ad = steps(tr)
  finally:
    tr.close()
  for a, b in zip(jax.tree.leaves(ref_ad), jax.tree.leaves(ad), strict=True):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
  for ra, rb in zip(ref_metrics, metrics, strict=True):
    for k in ("reward/mean", "loss", "grad_norm"):
      np.testing.assert_allclose(rb[k], ra[k], rtol=1e-3, atol=1e-5, err_msg=k)
    assert rb["logp_gap/max"] < 1e-4


# ------------------------------------------------------------------------------------------------
# Config


@pytest.mark.parametrize(
  "overrides,field",
  [
    (dict(lora=dict(rank=-1)), "lora.rank"),
    (dict(lora=dict(rank=4, alpha=-1.0)), "lora.alpha"),
    (dict(lora=dict(rank=4, targets="q,x")), "lora.targets"),
    (dict(lora=dict(rank=4, targets="q,q")), "lora.targets"),
    (dict(lora=dict(rank=4, targets="")), "lora.targets"),
    (dict(lora=dict(int8_base=True)), "lora.int8_base"),
    (dict(lora=dict(rank=4), warm_start=dict(num_steps=2)), "warm_start.num_steps"),
    (
      dict(lora=dict(rank=4), implicit_prm=dict(enabled=True), rl=dict(advantage="prime")),
      "implicit_prm.enabled",
    ),
  ],
)
def test_validation_names_the_field(tmp_path, overrides, field):
  c = config_lib.tiny_config(tmp_path, **overrides)
  with pytest.raises(config_lib.ConfigError, match=re.escape(f"config.{field}:")):
    config_lib.validate(c)


def test_lora_config_from_the_block(tmp_path):
  assert lora_training.lora_config(config_lib.tiny_config(tmp_path)) is None  # off by default
  c = config_lib.tiny_config(tmp_path, lora=dict(rank=8, targets=" v, q ,down"))
  config_lib.validate(c)
  lcfg = lora_training.lora_config(c)
  assert (lcfg.rank, lcfg.alpha, lcfg.targets) == (8, 16.0, ("v", "q", "down"))
  c.lora.alpha = 4.0
  assert lora_training.lora_config(c).scale == 0.5
