"""LoRA adapters on the params pytree (rlvr_jax.model.lora), the int8 base, and PEFT export:
shapes and shardings, adapters off = the base bit for bit, gradients through the adapters only
(against the projected full-weight gradient and a finite difference), the reference policy for
free, the int8 error bound, parity with transformers + peft, and the compiled memory of a LoRA
update against full fine-tuning at tiny shapes."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlvr_jax import model
from rlvr_jax.model import lora, peft_export

LCFG = lora.LoraConfig(rank=4, alpha=8.0)


def _config(**overrides):
  return model.ModelConfig.tiny(**overrides)


def _random_params(cfg, seed=0):
  """O(1)-scale random weights (HF's std 0.02 gives near-uniform logits), random norms and
  biases; drawn with numpy (no random-bits kernel to compile)."""
  rng = np.random.default_rng(seed)

  def one(path, x):
    name = str(path[-1].key)
    noise = rng.standard_normal(x.shape, np.float32)
    if name.endswith("norm"):
      value = 1 + 0.1 * noise
    else:
      value = (0.3 if name.startswith("b") else 0.15) * noise
    return jnp.asarray(value, x.dtype)

  return jax.tree_util.tree_map_with_path(one, model.abstract_params(cfg))


def _random_adapters(params, lcfg=LCFG, seed=1, b_std=0.1):
  """init_lora's A and a NONZERO random B (B = 0 would make every check trivial)."""
  ad = lora.init_lora(params, lcfg, jax.random.key(seed))
  rng = np.random.default_rng(seed + 7)
  return {
    "layers": {
      n: {"a": ab["a"], "b": jnp.asarray(b_std * rng.standard_normal(ab["b"].shape), jnp.float32)}
      for n, ab in ad["layers"].items()
    }
  }


_merge = jax.jit(lora.merge, static_argnums=(2, 3))
_quantize = jax.jit(lora.quantize_int8)


def _tokens(cfg, rows=2, length=12, seed=0):
  rng = np.random.default_rng(seed)
  tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (rows, length)), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), tokens.shape)
  return tokens, positions


def _logp(params, cfg, tokens, positions):
  """Per-token log-probs [B, S-1] of the next tokens."""
  logits, _ = model.forward(params, tokens, positions, config=cfg, return_logits=True)
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
  return jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]


def _nll(params, cfg, tokens, positions):
  return -jnp.mean(_logp(params, cfg, tokens, positions))


def _equal_trees(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(la) == len(lb) and all(
    x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y))
    for x, y in zip(la, lb, strict=True)
  )


# ------------------------------------------------------------------------------------------------
# Shapes, config, shardings


def test_adapter_shapes_axes_and_init():
  cfg = _config()
  L, D, F, N, K, H, r = 2, 64, 128, 4, 2, 16, LCFG.rank
  ad = lora.init_lora(model.abstract_params(cfg), LCFG, jax.random.key(0))
  shapes = jax.tree.map(lambda x: x.shape, ad)["layers"]
  assert shapes == {
    "wq": {"a": (L, D, r), "b": (L, r, N, H)},
    "wk": {"a": (L, D, r), "b": (L, r, K, H)},
    "wv": {"a": (L, D, r), "b": (L, r, K, H)},
    "wo": {"a": (L, N, H, r), "b": (L, r, D)},
    "w_gate": {"a": (L, D, r), "b": (L, r, F)},
    "w_up": {"a": (L, D, r), "b": (L, r, F)},
    "w_down": {"a": (L, F, r), "b": (L, r, D)},
  }
  for name, ab in ad["layers"].items():
    fan_in = D if name not in ("wo", "w_down") else (N * H if name == "wo" else F)
    assert not np.any(np.asarray(ab["b"])) and ab["a"].dtype == jnp.float32
    assert 0 < float(jnp.max(jnp.abs(ab["a"]))) <= 1 / np.sqrt(fan_in)
  axes = lora.lora_logical_axes(cfg, LCFG)
  jax.tree.map(lambda x, a: len(a) == x.ndim or pytest.fail(f"{a} vs {x.shape}"), ad, axes,
               is_leaf=lambda t: isinstance(t, tuple))  # fmt: skip
  assert axes["layers"]["wo"] == {
    "a": ("layers", "heads", "head_dim", None),
    "b": ("layers", None, "embed"),
  }
  # Sharded like the weights' input / output dims on a (fsdp=4, tensor=2) mesh.
  from rlvr_jax import sharding

  mesh = sharding.make_mesh(data=1, fsdp=4, tensor=2)
  shardings = lora.lora_shardings(cfg, LCFG, mesh)
  placed = jax.device_put(ad, shardings)
  assert placed["layers"]["wq"]["a"].sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", None)
  assert placed["layers"]["wq"]["b"].sharding.spec == jax.sharding.PartitionSpec(
    None, None, "tensor", None
  )
  assert lora.count_lora_params(ad) == sum(x.size for x in jax.tree.leaves(ad))


def test_config_validation_and_target_subset():
  with pytest.raises(ValueError, match="targets"):
    lora.LoraConfig(targets=("q", "bogus"))
  with pytest.raises(ValueError, match="rank"):
    lora.LoraConfig(rank=0)
  lcfg = lora.LoraConfig(rank=2, alpha=4.0, targets=["v", "q"])
  assert lcfg.weights == ("wq", "wv") and lcfg.scale == 2.0 and hash(lcfg)
  cfg = _config()
  params = _random_params(cfg)
  ad = _random_adapters(params, lcfg)
  merged = lora.merge(params, ad, lcfg)
  for name in ("wk", "wo", "w_gate", "w_up", "w_down"):
    assert merged["layers"][name] is params["layers"][name]
  assert not np.array_equal(merged["layers"]["wq"], params["layers"]["wq"])
  with pytest.raises(ValueError, match="targets"):
    lora.merge(params, ad, LCFG)
  with pytest.raises(ValueError, match="dropout"):
    lora.merge(params, ad, lora.LoraConfig(rank=2, alpha=4.0, targets=("q", "v"), dropout=0.1))


# ------------------------------------------------------------------------------------------------
# Merge


def test_merge_is_base_plus_scaled_product():
  """Each merged weight is W + (alpha / r) A @ B, checked per layer in float64 numpy."""
  cfg = _config()
  params = _random_params(cfg)
  ad = _random_adapters(params)
  merged = lora.merge(params, ad, LCFG)
  s = LCFG.alpha / LCFG.rank
  for name, ab in ad["layers"].items():
    w = np.asarray(params["layers"][name], np.float64)
    a, b = np.asarray(ab["a"], np.float64), np.asarray(ab["b"], np.float64)
    for i in range(cfg.num_layers):
      ai = a[i].reshape(-1, LCFG.rank)
      bi = b[i].reshape(LCFG.rank, -1)
      want = w[i] + s * (ai @ bi).reshape(w[i].shape)
      np.testing.assert_allclose(merged["layers"][name][i], want, rtol=1e-5, atol=1e-6)
  # Everything else untouched.
  for name in ("embed", "final_norm", "lm_head"):
    assert merged[name] is params[name]


def test_adapters_off_is_exactly_the_base():
  for dtype in ("float32", "bfloat16"):
    cfg = _config(dtype=dtype)
    params = _random_params(cfg)
    ad = _random_adapters(params)
    assert _equal_trees(_merge(params, None, LCFG), params)
    assert _equal_trees(_merge(params, lora.zero_adapters(ad), LCFG), params)
    fresh = lora.init_lora(params, LCFG, jax.random.key(3))  # B = 0 at init
    assert _equal_trees(_merge(params, fresh, LCFG), params)


def test_merge_in_compute_dtype():
  """dtype=bfloat16 merges float32 masters into bfloat16 weights: A @ B from bfloat16 A and B
  (float32 accumulation, rounded to bfloat16), added to W in float32 and rounded once: the error
  is within a few bfloat16 ulps (2^-6 relative: four roundings of 2^-9) of |W| + s sum |A||B|
  (not of the result, which may cancel)."""
  cfg = _config()
  params = _random_params(cfg)
  ad = _random_adapters(params)
  m32 = _merge(params, ad, LCFG)
  m16 = _merge(params, ad, LCFG, "bfloat16")
  for name in LCFG.weights:
    assert m16["layers"][name].dtype == jnp.bfloat16
    w, want = np.asarray(params["layers"][name]), np.asarray(m32["layers"][name])
    a, b = ad["layers"][name]["a"], ad["layers"][name]["b"]
    # |W| + s * sum_r |A_r| |B_r|: the size the bfloat16 roundings of W, A and B are relative to.
    size = np.abs(w) + np.asarray(lora.lora_delta(jnp.abs(a), jnp.abs(b), a.ndim - 2, LCFG.scale,
                                                  "float32"))  # fmt: skip
    err = np.abs(np.asarray(m16["layers"][name], np.float32) - want)
    assert np.all(err <= 2**-6 * size + 1e-7), (name, float((err / size).max()))
  assert m16["layers"]["attn_norm"].dtype == jnp.float32  # norms keep the master dtype


def test_merge_layer_matches_merge():
  """The per-layer merge (for a decoder that merges inside its scan) equals slicing ``merge``,
  for a float and an int8 base."""
  cfg = _config()
  params = _random_params(cfg)
  ad = _random_adapters(params)
  for base in (params, _quantize(params)):
    merged = _merge(base, ad, LCFG, "float32")
    for i in range(cfg.num_layers):
      layer = jax.tree.map(lambda x, i=i: x[i], base["layers"])
      layer_ad = jax.tree.map(lambda x, i=i: x[i], ad["layers"])
      got = lora.merge_layer(layer, layer_ad, LCFG, dtype="float32")
      want = jax.tree.map(lambda x, i=i: x[i], merged["layers"])
      for name in want:
        # (The batched and per-layer rank-r products may round differently: a few ulps.)
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7, err_msg=name)


# ------------------------------------------------------------------------------------------------
# Gradients through the adapters only


def test_gradients_only_through_adapters():
  cfg = _config()
  params = _random_params(cfg)
  ad = _random_adapters(params)
  tokens, positions = _tokens(cfg)
  loss_fn = lambda p: _nll(p, cfg, tokens, positions)
  # Both the base and the adapters as arguments: the base must still receive no gradient.
  value_and_grads = jax.jit(
    jax.value_and_grad(lambda base, a: lora.adapter_loss(loss_fn, base, LCFG)(a), argnums=(0, 1))
  )
  _, (base_grads, grads) = value_and_grads(params, ad)
  assert all(not np.any(np.asarray(g)) for g in jax.tree.leaves(base_grads))
  assert jax.tree.structure(grads) == jax.tree.structure(ad)
  for name, g in grads["layers"].items():
    assert float(jnp.abs(g["a"]).max()) > 0 and float(jnp.abs(g["b"]).max()) > 0, name

  # Independent check 1: the gradient G of the merged model w.r.t. each merged weight W' (the
  # gradient w.r.t. W of the ungated merge), projected through A and B in float64 numpy:
  # dA = s G B^T, dB = s A^T G (G reshaped to [L, in, out]).
  full = jax.jit(jax.grad(lambda base: loss_fn(lora.merge(base, ad, LCFG))))(params)["layers"]
  s = LCFG.scale
  for name, ab in ad["layers"].items():
    a, b = np.asarray(ab["a"], np.float64), np.asarray(ab["b"], np.float64)
    L, r = a.shape[0], LCFG.rank
    a2, b2 = a.reshape(L, -1, r), b.reshape(L, r, -1)
    g = np.asarray(full[name], np.float64).reshape(L, a2.shape[1], b2.shape[2])
    want_a = s * g @ b2.transpose(0, 2, 1)
    want_b = s * a2.transpose(0, 2, 1) @ g
    scale_a, scale_b = np.abs(want_a).max(), np.abs(want_b).max()
    np.testing.assert_allclose(
      grads["layers"][name]["a"].reshape(want_a.shape), want_a, atol=1e-4 * scale_a, err_msg=name
    )
    np.testing.assert_allclose(
      grads["layers"][name]["b"].reshape(want_b.shape), want_b, atol=1e-4 * scale_b, err_msg=name
    )

  # Independent check 2: a central finite difference along a random direction of the adapters.
  leaves, treedef = jax.tree.flatten(ad)
  keys = jax.random.split(jax.random.key(5), len(leaves))
  direction = jax.tree.unflatten(
    treedef, [jax.random.normal(k, x.shape) for k, x in zip(keys, leaves, strict=True)]
  )
  eps = 1e-2
  shifted = lambda sign: jax.tree.map(lambda x, v: x + sign * eps * v, ad, direction)
  loss_at = lambda a: value_and_grads(params, a)[0]
  fd = (loss_at(shifted(1.0)) - loss_at(shifted(-1.0))) / (2 * eps)
  pairs = zip(jax.tree.leaves(grads), jax.tree.leaves(direction), strict=True)
  analytic = sum(jnp.vdot(g, v) for g, v in pairs)
  np.testing.assert_allclose(fd, analytic, rtol=2e-2)

  # At init (B = 0) only B receives a gradient: dA = s G B^T = 0.
  fresh = lora.init_lora(params, LCFG, jax.random.key(9))
  g0 = value_and_grads(params, fresh)[1][1]["layers"]
  assert all(not np.any(np.asarray(g["a"])) and np.any(np.asarray(g["b"])) for g in g0.values())


# ------------------------------------------------------------------------------------------------
# The reference policy for free


def test_reference_logprobs_are_the_base_with_adapters_off():
  """Train the adapters (AdamW state for the adapters only); the merged model's log-probs move,
  and with the adapters off (None, or B zeroed) they equal the base's, computed from a separate
  copy of the base, exactly. The base itself is never changed."""
  cfg = _config()
  params = _random_params(cfg)
  reference_copy = jax.tree.map(lambda x: jnp.array(np.array(x)), params)
  tokens, positions = _tokens(cfg)
  loss = lora.adapter_loss(lambda p: _nll(p, cfg, tokens, positions), params, LCFG)
  ad = lora.init_lora(params, LCFG, jax.random.key(1))
  opt = optax.adamw(1e-2)
  opt_state = opt.init(ad)
  assert sum(x.size for x in jax.tree.leaves(opt_state)) <= 2 * lora.count_lora_params(ad) + 1

  @jax.jit
  def update(ad, opt_state):
    value, grads = jax.value_and_grad(loss)(ad)
    updates, opt_state = opt.update(grads, opt_state, ad)
    return optax.apply_updates(ad, updates), opt_state, value

  first = None
  for _ in range(3):
    ad, opt_state, value = update(ad, opt_state)
    first = value if first is None else first
  assert float(loss(ad)) < float(first)
  logp = jax.jit(_logp, static_argnums=1)
  on = logp(_merge(params, ad, LCFG), cfg, tokens, positions)
  off = logp(_merge(params, None, LCFG), cfg, tokens, positions)
  zeroed = logp(_merge(params, lora.zero_adapters(ad), LCFG), cfg, tokens, positions)
  ref = logp(reference_copy, cfg, tokens, positions)
  np.testing.assert_array_equal(off, ref)
  np.testing.assert_array_equal(zeroed, ref)
  assert float(jnp.abs(on - ref).max()) > 1e-3
  assert _equal_trees(params, reference_copy)


# ------------------------------------------------------------------------------------------------
# int8 weight-only base


def test_int8_quantization_per_channel():
  cfg = _config()
  params = _random_params(cfg)
  q = _quantize(params)
  wq = q["layers"]["wq"]
  assert wq["qint8"].dtype == jnp.int8 and wq["qint8"].shape == params["layers"]["wq"].shape
  assert wq["scale"].shape == (2, 4, 16)  # [L, N, H]: per output channel
  assert q["layers"]["wo"]["scale"].shape == (2, 64)  # [L, D]
  assert q["lm_head"]["scale"].shape == (cfg.vocab_size,)
  np.testing.assert_array_equal(q["embed"], params["embed"])
  np.testing.assert_array_equal(q["layers"]["attn_norm"], params["layers"]["attn_norm"])
  deq = _merge(q, None, LCFG)
  for name in lora.QUANTIZABLE:
    w = params[name] if name == "lm_head" else params["layers"][name]
    d = deq[name] if name == "lm_head" else deq["layers"][name]
    qw = q[name] if name == "lm_head" else q["layers"][name]
    assert int(jnp.abs(qw["qint8"].astype(jnp.int32)).max()) == 127
    # Round to nearest: |W - deq| <= scale / 2 in every output channel.
    n_in = 2 if name == "wo" else 1
    lead = 0 if name == "lm_head" else 1
    scale = jnp.expand_dims(qw["scale"], tuple(range(lead, lead + n_in)))
    assert bool(jnp.all(jnp.abs(w - d) <= scale / 2 * (1 + 1e-6))), name
  axes = lora.quantized_logical_axes(cfg)
  assert axes["layers"]["w_down"] == {
    "qint8": ("layers", "mlp", "embed"),
    "scale": ("layers", "embed"),
  }


def test_int8_base_logprob_error_bound():
  """The int8 base's log-probs against the float32 base's on the tiny config with O(1) random
  weights (std 0.15, logits of std 1.2; 4 x 31 tokens): measured max |d logp| 0.106 nats, mean
  0.027 (max |d logit| 0.26); bfloat16 weights for comparison: max 0.044, mean 0.009. Bound: max
  < 0.2, mean < 0.05. With adapters the int8 base merges like the float one (same bound)."""
  cfg = _config()
  params = _random_params(cfg)
  tokens, positions = _tokens(cfg, rows=4, length=32)
  logp = jax.jit(_logp, static_argnums=1)
  ref = logp(params, cfg, tokens, positions)
  deq = _merge(_quantize(params), None, LCFG)
  err = jnp.abs(logp(deq, cfg, tokens, positions) - ref)
  bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), params)
  err16 = jnp.abs(logp(bf16, cfg, tokens, positions) - ref)
  msg = f"int8 max {float(err.max()):.4f} mean {float(err.mean()):.5f}; bf16 max {float(err16.max()):.4f}"
  assert float(err.max()) < 0.2 and float(err.mean()) < 0.05, msg
  ad = _random_adapters(params)
  merged_q = _merge(_quantize(params), ad, LCFG)
  merged_f = _merge(params, ad, LCFG)
  err_ad = jnp.abs(logp(merged_q, cfg, tokens, positions) - logp(merged_f, cfg, tokens, positions))
  assert float(err_ad.max()) < 0.2 and float(err_ad.mean()) < 0.05, float(err_ad.max())
  # bfloat16 compute on the int8 base, merged straight into the compute dtype (int8 and bfloat16
  # errors together; measured max 0.107).
  cfg16 = cfg.replace(compute_dtype="bfloat16")
  m16 = _merge(_quantize(params), ad, LCFG, "bfloat16")
  assert m16["layers"]["wq"].dtype == jnp.bfloat16 and m16["lm_head"].dtype == jnp.bfloat16
  assert (
    float(
      jnp.abs(logp(m16, cfg16, tokens, positions) - logp(merged_f, cfg, tokens, positions)).max()
    )
    < 0.25
  )


# ------------------------------------------------------------------------------------------------
# PEFT export: parity with transformers + peft


FAMILIES = {
  "llama": dict(family="llama"),
  "qwen2": dict(family="qwen2", attention_bias=True, tie_word_embeddings=True),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_peft_adapter_matches_transformers(family, tmp_path):
  """Our adapter folder, attached by ``peft.PeftModel.from_pretrained`` to our exported base in
  transformers, gives our merged forward's logits (float32, nonzero random B); PEFT's own save
  reads back into our adapters; the merged HF export gives the same logits without peft."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  peft = pytest.importorskip("peft")
  cfg = _config(vocab_size=96, hidden_size=32, intermediate_size=48, num_heads=4, num_kv_heads=2,
                head_dim=8, **FAMILIES[family])  # fmt: skip
  params = _random_params(cfg, seed=3)
  ad = _random_adapters(params, seed=4)
  tokens, positions = _tokens(cfg, rows=2, length=10)
  ours, _ = model.forward(_merge(params, ad, LCFG), tokens, positions, config=cfg,
                          return_logits=True)  # fmt: skip
  base_ours, _ = model.forward(params, tokens, positions, config=cfg, return_logits=True)

  from rlvr_jax.model.export import export_hf

  base_dir = export_hf(params, cfg, tmp_path / "base")
  adapter_dir = peft_export.export_peft_adapter(
    ad, cfg, LCFG, tmp_path / "adapter", base_model_name_or_path=str(base_dir)
  )
  hf = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
  with torch.no_grad():
    hf_base = hf(torch.tensor(np.asarray(tokens), dtype=torch.long)).logits.numpy()
  peft_model = peft.PeftModel.from_pretrained(hf, adapter_dir).eval()
  with torch.no_grad():
    theirs = peft_model(torch.tensor(np.asarray(tokens), dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(hf_base, base_ours, atol=1e-4)
  assert np.abs(theirs - hf_base).max() > 0.1  # the adapter matters
  np.testing.assert_allclose(theirs, ours, atol=1e-4)

  # PEFT's own save of the loaded adapter reads back into ours, equal.
  peft_model.save_pretrained(tmp_path / "resaved")
  back, lcfg = peft_export.load_peft_adapter(tmp_path / "resaved", cfg)
  assert (lcfg.rank, lcfg.alpha, lcfg.targets) == (LCFG.rank, LCFG.alpha, LCFG.targets)
  for name in ad["layers"]:
    for part in ("a", "b"):
      np.testing.assert_array_equal(back["layers"][name][part], ad["layers"][name][part])

  # The merged model as a plain HF folder: the same logits without peft.
  merged_dir = peft_export.export_merged_hf(params, ad, cfg, LCFG, tmp_path / "merged")
  hf_merged = transformers.AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
  with torch.no_grad():
    merged_logits = hf_merged(torch.tensor(np.asarray(tokens), dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(merged_logits, ours, atol=1e-4)


def test_peft_adapter_config(tmp_path):
  import json

  lcfg = lora.LoraConfig(rank=8, alpha=16.0, targets=("q", "v", "down"))
  cfg = _config()
  ad = lora.init_lora(model.abstract_params(cfg), lcfg, jax.random.key(0))
  path = peft_export.export_peft_adapter(ad, cfg, lcfg, tmp_path, base_model_name_or_path="m/x")
  with open(os.path.join(path, "adapter_config.json")) as f:
    c = json.load(f)
  assert c["peft_type"] == "LORA" and c["task_type"] == "CAUSAL_LM"
  assert (c["r"], c["lora_alpha"], c["base_model_name_or_path"]) == (8, 16.0, "m/x")
  assert c["target_modules"] == ["q_proj", "v_proj", "down_proj"]
  from safetensors.numpy import load_file

  t = load_file(os.path.join(path, "adapter_model.safetensors"))
  assert len(t) == 2 * 3 * cfg.num_layers
  assert t["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"].shape == (8, 64)
  assert t["base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"].shape == (64, 8)
  assert t["base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"].shape == (8, 128)
  back, lcfg2 = peft_export.load_peft_adapter(path, cfg)
  assert lcfg2 == lcfg and _equal_trees(back, ad)


# ------------------------------------------------------------------------------------------------
# Memory: a LoRA update compiles to less than full fine-tuning


def test_lora_update_memory_below_full_finetuning():
  tools = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")
  sys.path.insert(0, tools)
  try:
    import lora_memory
    import update_memory
  finally:
    sys.path.remove(tools)
  full = _config(vocab_size=512, hidden_size=128, intermediate_size=256, compute_dtype="bfloat16",
                 attention="xla")  # fmt: skip
  full_mem = update_memory.full_update_memory(full, 2, 32)
  lora_mem = lora_memory.lora_update_memory(full.replace(dtype="bfloat16"), LCFG, 2, 32)
  assert lora_mem["peak_bytes"] < full_mem["peak_bytes"], (lora_mem, full_mem)
  # The state LoRA keeps (base + adapters + moments) is far below full fine-tuning's.
  assert lora_mem["argument_bytes"] < 0.5 * full_mem["argument_bytes"]


# ------------------------------------------------------------------------------------------------
# The proposed decoder hook: merging inside the layer scan


def test_attached_adapters_merged_in_the_layer_scan(monkeypatch):
  """``attach`` + ``merge_attached`` at the top of each scanned layer (the decoder change this
  module proposes, emulated by wrapping ``decoder._differentiable``) give the loss and adapter
  gradients of the whole-tree ``merge`` (an int8 base: dequantization and LoRA both in the hook;
  with remat, the accelerator setting; a float base's per-layer merge: ``merge_layer`` above)."""
  from rlvr_jax.model import decoder

  original = decoder._differentiable
  monkeypatch.setattr(
    decoder,
    "_differentiable",
    lambda layer, config: original(
      lambda x, lp: layer(x, lora.merge_attached(lp, config.activation_dtype)), config
    ),
  )
  cfg = _config(remat=True)
  params = _random_params(cfg)
  ad = _random_adapters(params)
  tokens, positions = _tokens(cfg)
  base = _quantize(params)
  nll = lambda p: _nll(p, cfg, tokens, positions)
  attached = lora.attach(base, ad, LCFG)
  assert set(attached["layers"]["lora"]) == set(LCFG.weights)
  assert not lora.is_quantized(attached["lm_head"])  # dequantized by attach
  v1, g1 = jax.jit(jax.value_and_grad(lora.adapter_loss(nll, base, LCFG)))(ad)
  v2, g2 = jax.jit(jax.value_and_grad(lora.adapter_loss(nll, base, LCFG, attached=True)))(ad)
  np.testing.assert_allclose(v2, v1, rtol=1e-6)
  for x, y in zip(jax.tree.leaves(g2), jax.tree.leaves(g1), strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6 * float(jnp.abs(y).max()))
  # Nothing attached and a float base: the layer dicts pass through untouched.
  layer = jax.tree.map(lambda x: x[0], params["layers"])
  assert lora.merge_attached(layer) is layer
