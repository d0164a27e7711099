"""``OptimizerSpec.fused_apply`` (the trainer's AdamW, written for fewer passes over the parameter
trees) against optax's chain it stands for: same parameters, same state, same tree."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlvr_jax.train.optimizer import OptimizerSpec


def _spec(**kw):
  base = dict(
    learning_rate=1e-2, schedule="constant", warmup_steps=0, final_lr_fraction=0.1, b1=0.9,
    b2=0.99, eps=1e-8, weight_decay=0.0, grad_clip=1.0, decay_steps=None,
  )  # fmt: skip
  return OptimizerSpec(**{**base, **kw})


def _params():
  k = jax.random.split(jax.random.key(0), 3)
  return {
    "w": jax.random.normal(k[0], (3, 4)),
    "layers": {"a": jax.random.normal(k[1], (2, 5)), "b": jax.random.normal(k[2], (7,))},
  }


@pytest.mark.parametrize(
  "kw, grad_scale",
  [
    ({}, 10.0),  # ||g|| > clip: clipped every step
    ({}, 0.01),  # below the clip
    ({"grad_clip": 0.0}, 10.0),  # no clipping at all
    ({"weight_decay": 0.1, "schedule": "cosine", "warmup_steps": 2, "decay_steps": 6}, 10.0),
    ({"schedule": "linear", "warmup_steps": 1, "decay_steps": 4}, 0.01),
  ],
)
def test_fused_apply_equals_the_optax_chain(kw, grad_scale):
  spec = _spec(**kw)
  params = _params()
  ref_p, ref_s = params, spec.init(params)
  fus_p, fus_s = params, spec.init(params)
  fused = jax.jit(spec.fused_apply)
  for step in range(5):
    key = jax.random.fold_in(jax.random.key(1), step)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))
    grads = tree.unflatten(
      [grad_scale * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves, strict=True)]
    )
    updates, ref_s = spec.update(grads, ref_s, ref_p)
    ref_new = optax.apply_updates(ref_p, updates)
    fus_new, fus_s, update_norm = fused(grads, fus_s, fus_p, optax.global_norm(grads))
    assert jax.tree.structure(fus_s) == jax.tree.structure(ref_s)
    for a, b in zip(
      jax.tree.leaves((fus_new, fus_s)), jax.tree.leaves((ref_new, ref_s)), strict=True
    ):
      assert a.dtype == b.dtype
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-6, atol=1e-7)
    applied = optax.global_norm(jax.tree.map(jnp.subtract, fus_new, fus_p))
    np.testing.assert_allclose(float(update_norm), float(applied), rtol=1e-6)
    np.testing.assert_allclose(float(update_norm), float(optax.global_norm(updates)), rtol=1e-3)
    ref_p, fus_p = ref_new, fus_new
  assert int(fus_s[-1][0].count) == 5 and int(fus_s[-1][2].count) == 5
