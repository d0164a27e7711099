"""Toy ablation: how clip-higher, Clip-Cov and Lp-Reg change the gradient on low-probability tokens.

Purpose: make the per-token effect of three entropy-preserving tricks visible on a batch small enough
to read, with the real ``rlvr_jax.losses`` objectives (no model, no training).

Setup: 4 rows x 6 tokens. Every position has the same old-policy distribution over V = 18 tokens,
p_old = [0.5, 0.2, 0.1, 0.05, 0.03, 0.015] + 12 tail tokens of 0.00875 each (below the min-p cut
0.02 x 0.5 = 0.01, so the Lp-Reg proxy drops them and renormalises the rest by 1/0.895); every row
samples the tokens with p_old = 0.5, 0.2, 0.1, 0.03, 0.015, 0.00875. Rows 0-1 have A = +1, rows 2-3
A = -1. The current policy has moved: ratio r = 1.0 (row 0), 1.25 (row 1, between 1 + 0.2 and
1 + 0.28), 1.0 (row 2), 0.3 (row 3: the negative tokens were already pushed far down).

Printed: g = -dL/dlogp x N_tok for each token (positive: gradient descent RAISES the token's
log-prob) under

* ``ppo``       PPO-clip eps 0.2/0.2 (token mean)
* ``clip_hi``   clip-higher eps 0.2/0.28 (DAPO)
* ``clip_cov``  Clip-Cov: high-covariance tokens lose their gradient (kappa raised to 0.25 so the
  toy batch has something to clip)
* ``lp_reg``    Lp-Reg: the lowest-probability negative tokens are pulled toward the min-p proxy
  (eta raised to 0.5 for the toy batch)

Command (CPU, a few seconds):

    .venv/bin/python experiments/ablation_toy.py

Expected result: clip-higher keeps the gradient of the row-1 tokens that symmetric PPO clips
(r = 1.25 > 1.2), all of it on positive tokens; Clip-Cov removes the gradient of a random subset of
the high-covariance tokens (confident positive tokens, improbable negative tokens); Lp-Reg (whose
recipe also disables PPO clipping, eps 1.0/9.0) flips the sign on the selected improbable negative
tokens of row 3 (pi / pi~ = 0.3 x 0.895: raised towards the proxy instead of pushed further down),
while the filtered tail token (p_old = 0.00875 < 0.01) is never protected.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax import losses, regularizers

P_OLD = np.array([0.5, 0.2, 0.1, 0.05, 0.03, 0.015] + [0.105 / 12] * 12)  # V = 18
SAMPLED = np.array([0, 1, 2, 4, 5, 6])  # token ids sampled at the 6 positions of every row
ADV = np.array([1.0, 1.0, -1.0, -1.0])
RATIO = np.array([1.0, 1.25, 1.0, 0.3])


def toy_batch():
  rows, cols = len(ADV), len(SAMPLED)
  tokens = jnp.asarray(np.tile(SAMPLED, (rows, 1)))
  old_logits = jnp.log(jnp.broadcast_to(jnp.asarray(P_OLD, jnp.float32), (rows, cols, len(P_OLD))))
  old_logp = jnp.log(jnp.asarray(np.tile(P_OLD[SAMPLED], (rows, 1)), jnp.float32))
  logp = old_logp + jnp.log(jnp.asarray(RATIO, jnp.float32))[:, None]
  advantages = jnp.asarray(np.repeat(ADV[:, None], cols, 1), jnp.float32)
  proxy = regularizers.min_p_proxy_logp(old_logits, tokens, min_p=0.02)
  mask = jnp.ones((rows, cols), bool)
  return logp, old_logp, advantages, mask, proxy


def token_push(name, logp, old_logp, advantages, mask, **kw):
  """-dL/dlogp x N_tok per token and the metrics of one objective (micro-batch = step)."""
  n = float(mask.sum())

  def loss(x):
    return losses.OBJECTIVES[name](
      x, old_logp, advantages, mask, num_tokens=n, num_seqs=float(mask.shape[0]), **kw
    )

  (_, metrics), grad = jax.value_and_grad(loss, has_aux=True)(logp)
  return -np.asarray(grad) * n, losses.finalize_metrics(metrics)


def main():
  logp, old_logp, advantages, mask, proxy = toy_batch()
  rows, cols = mask.shape
  noise = jax.random.uniform(jax.random.key(0), (rows, cols))
  runs = {
    "ppo": token_push("ppo", logp, old_logp, advantages, mask, clip_low=0.2, clip_high=0.2),
    "clip_hi": token_push("ppo", logp, old_logp, advantages, mask, clip_low=0.2, clip_high=0.28),
    "clip_cov": token_push(
      "clip_cov",
      logp,
      old_logp,
      advantages,
      mask,
      scope="micro",
      noise=noise,
      clip_cov_ratio=0.25,
      cov_low=0.5,
    ),  # fmt: skip
    "lp_reg": token_push(
      "lp_reg", logp, old_logp, advantages, mask, scope="micro", proxy_logp=proxy, lp_reg_frac=0.5
    ),  # fmt: skip
  }
  header = f"{'row':>3} {'A':>3} {'r':>5} {'p_old':>6} {'proxy':>6} |" + "".join(
    f"{k:>9}" for k in runs
  )
  print("g = -dL/dlogp * N_tok  (positive: the update raises the token's probability)")
  print(header)
  print("-" * len(header))
  p_proxy = np.exp(np.asarray(proxy))
  for b in range(rows):
    for t in range(cols):
      cells = "".join(f"{runs[k][0][b, t]:9.3f}" for k in runs)
      p = P_OLD[SAMPLED[t]]
      print(f"{b:3d} {ADV[b]:+3.0f} {RATIO[b]:5.2f} {p:6.3f} {p_proxy[b, t]:6.3f} |{cells}")
  low = np.tile(P_OLD[SAMPLED] < 0.05, (rows, 1))
  print("-" * len(header))
  for sign, label in ((1.0, "A>0"), (-1.0, "A<0")):
    sel = low & (np.asarray(advantages) == sign)
    sums = "".join(f"{runs[k][0][sel].sum():9.3f}" for k in runs)
    print(f"sum of g on low-probability tokens (p_old < 0.05), {label}:".ljust(37) + f"|{sums}")
  grad_frac = "".join(f"{float(runs[k][1]['grad_frac/tokens']):9.3f}" for k in runs)
  print("fraction of tokens carrying gradient:".ljust(37) + f"|{grad_frac}")


if __name__ == "__main__":
  main()
