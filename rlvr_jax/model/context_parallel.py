"""Context (sequence) parallel causal self-attention: Ring Attention (arXiv 2310.01889).

The S tokens of each row are split into R contiguous chunks of C = S / R tokens over the mesh
axis ``context`` (R devices); device i keeps its query chunk Q_i and the key/value chunks travel
around the ring, so no device ever holds more than two key/value chunks or a [C, C] score block.
Extra letters besides the glossary of ``rlvr_jax.types``: R ring size, C = S / R chunk length,
i this device's chunk, j the ring step.

Merge by log-sum-exp. For a query q and a set A of allowed keys,
  lse_A = log sum_{t in A} exp(s_t),   o_A = sum_{t in A} exp(s_t - lse_A) v_t,   s_t = q.k_t / sqrt(H).
For disjoint sets A, B: lse = log(exp(lse_A) + exp(lse_B)) = max + log1p(exp(-|lse_A - lse_B|)) and
o = exp(lse_A - lse) o_A + exp(lse_B - lse) o_B, which is exactly softmax attention over A u B.
Each ring step computes (o, lse) of one key chunk and merges it into the running pair, in
float32. An empty set has o = 0 and lse = ``_NEG`` (a finite -1e30, never -inf): merging it
changes nothing, and a query with no allowed key at all ends with o = 0 and zero gradient.

Backward (the FlashAttention-2 recurrences, arXiv 2307.08691, over the same ring): with the saved
output O and lse, P = exp(s - lse) on allowed keys, D = rowsum(dO * O),
  dV = P^T dO,   dS = P * (dO V^T - D),   dQ = dS K / sqrt(H),   dK = dS^T Q / sqrt(H),
block by block; each device accumulates dQ for its queries while dK and dV accumulators travel
with their key/value chunk and come home after R hops.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from rlvr_jax import sharding as sharding_lib

CONTEXT_AXIS = sharding_lib.CONTEXT_AXIS
# The training layout's mesh axes of the batch (data parallelism) and of the heads (tensor
# parallelism), used when they exist and divide B / K.
BATCH_AXES = dict(sharding_lib.TRAIN_RULES)["batch"]
HEAD_AXIS = dict(sharding_lib.TRAIN_RULES)["heads"]

# A finite "minus infinity": masked scores and the lse of an empty key set. exp(_NEG - x) is an
# exact 0 for any real score x, and differences of two such values stay finite in float32.
_NEG = -1e30


@dataclasses.dataclass(frozen=True)
class _Layout:
  """Static description of how the arrays lie on the mesh (hashable: a ``custom_vjp`` nondiff arg)."""

  axis_name: str
  ring_size: int
  batch_axes: tuple[str, ...]
  head_axis: str | None
  explicit_axes: tuple[str, ...]  # mesh axes of Explicit type, resharded to before shard_map

  def spec(self, heads: bool = True) -> PartitionSpec:
    """Spec of [B, S, heads, ...] arrays (q, k, v, o, lse); [B, S] when ``heads`` is False."""
    batch = self.batch_axes or None
    if not heads:
      return PartitionSpec(batch, self.axis_name)
    return PartitionSpec(batch, self.axis_name, self.head_axis)


def ring_self_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  segment_ids: jax.Array,
  *,
  num_kv_heads: int,
  axis_name: str = CONTEXT_AXIS,
) -> jax.Array:
  """Causal, segment-masked grouped-query self-attention with S split over ``axis_name``.

  Query s attends key t iff t <= s (global token index), segment_ids[b, t] == segment_ids[b, s]
  and segment_ids[b, t] > 0 (segment 0 is padding). o_s = softmax_t(q_s.k_t / sqrt(H)) v_t over
  the allowed t; a query with no allowed key gives exactly 0 and gets zero gradient. Query head
  n uses key/value head n // (N / K) (GQA, arXiv 2305.13245). Scores, softmax and the merge run
  in float32; both matmuls take the input dtype with float32 accumulation.

  Call on global arrays (inside ``jax.jit`` or eagerly) while a mesh with an axis ``axis_name``
  is set (``jax.set_mesh``). The ring runs on the layout [B over the mesh axes among "data",
  "fsdp" that exist and divide B, S over ``axis_name``, heads over "tensor" when it exists and
  divides K, H replicated]. On Auto mesh axes ``shard_map`` moves the arrays there and the
  output's sharding is left to XLA's propagation (it comes out in that layout); on Explicit axes
  the inputs are resharded to it and the output back to the sharding of ``q`` (no-ops, as
  intended for context parallelism, when the activations already come sequence-sharded).

  Communication: R - 1 ``ppermute`` hops of the (k, v, segment_ids) chunk to the next device in
  the forward pass; R - 1 hops of (k, v, segment_ids, dK, dV) plus a last hop of (dK, dV) in the
  backward pass. Each hop's transfer is independent of that step's compute, so XLA may overlap
  them. Chunks entirely in the causal future of the local queries (ring step j > i) are skipped
  by ``lax.cond``: device i computes i + 1 of the R blocks (no zigzag load balancing, so the
  last device sets the pace).

  Memory per device (b = B / batch shards, n, kh = N, K / head shards): the gradient is a custom
  VJP that re-runs the ring, so autodiff keeps only q, k, v, segment_ids, the output and the
  float32 lse [b, C, n] of the local chunk (O(C) per head, not O(S C)); a ring step holds two
  key/value chunks (the one in use and the one arriving), the float32 output / lse accumulators
  (and dK, dV, dQ in the backward pass) and a few float32 [b, C, n, C] blocks (scores,
  probabilities; the whole [C, C] block at once, not tiled further).

  Args:
    q: [B, S, N, H] queries (after RoPE).
    k, v: [B, S, K, H] keys and values.
    segment_ids: [B, S] int, 0 on padding, equal ids on tokens of one packed sequence.
    num_kv_heads: K.
    axis_name: the mesh axis S is split over; its size R must divide S.
  Returns:
    [B, S, N, H] in the dtype of ``q``.
  """
  _check_shapes(q, k, v, segment_ids, num_kv_heads)
  layout = _layout(q.shape[0], q.shape[1], num_kv_heads, axis_name)
  if not layout.explicit_axes:
    return _ring_attention(q, k, v, segment_ids.astype(jnp.int32), layout)
  # Explicit axes: shard_map needs the inputs in its layout, and the output goes back to the
  # layout of q, so that the result has the type any other implementation would give (a scan
  # carry stays one type). Both are no-ops when q already comes sequence-sharded.
  q_spec = jax.typeof(q).sharding.spec
  q, k, v = (_reshard(x, layout.spec(), layout) for x in (q, k, v))
  segment_ids = _reshard(segment_ids, layout.spec(heads=False), layout)
  out = _ring_attention(q, k, v, segment_ids.astype(jnp.int32), layout)
  return jax.reshard(out, q_spec)


def _check_shapes(q, k, v, segment_ids, num_kv_heads):
  if q.ndim != 4:
    raise ValueError(f"ring_self_attention: q must be [B, S, N, H], got {q.shape}")
  B, S, N, H = q.shape
  K = num_kv_heads
  if K <= 0 or N % K or k.shape != (B, S, K, H) or v.shape != k.shape:
    raise ValueError(
      f"ring_self_attention: q {q.shape}, k {k.shape}, v {v.shape} with num_kv_heads={K}; "
      f"expected k, v [B, S, K, H] = {(B, S, K, H)} and N % K == 0"
    )
  if segment_ids.shape != (B, S):
    raise ValueError(f"ring_self_attention: segment_ids {segment_ids.shape}, expected {(B, S)}")


def _layout(B: int, S: int, K: int, axis_name: str) -> _Layout:
  """Reads the current mesh and decides the sharding; raises ValueError if it cannot ring."""
  mesh = jax.sharding.get_abstract_mesh()
  sizes = dict(mesh.shape) if not mesh.empty else {}
  if axis_name not in sizes:
    raise ValueError(
      f"ring_self_attention: no mesh with axis {axis_name!r} is set (current mesh axes: "
      f"{tuple(sizes)}); set one, e.g. `with jax.set_mesh(jax.make_mesh((R,), ({axis_name!r},))):`"
    )
  types = dict(zip(mesh.axis_names, mesh.axis_types, strict=True))
  if types[axis_name] == jax.sharding.AxisType.Manual:
    raise ValueError(f"ring_self_attention: axis {axis_name!r} is already manual (in a shard_map)")
  R = sizes[axis_name]
  if S % R:
    raise ValueError(
      f"ring_self_attention: sequence length S={S} is not divisible by the size {R} of mesh axis "
      f"{axis_name!r}"
    )
  batch_axes, shards = [], 1
  for name in BATCH_AXES:
    if name != axis_name and sizes.get(name, 1) > 1 and B % (shards * sizes[name]) == 0:
      batch_axes.append(name)
      shards *= sizes[name]
  head_axis = None
  if HEAD_AXIS != axis_name and sizes.get(HEAD_AXIS, 1) > 1 and K % sizes[HEAD_AXIS] == 0:
    head_axis = HEAD_AXIS
  used = (axis_name, *batch_axes, *([head_axis] if head_axis else []))
  explicit = tuple(a for a in used if types[a] == jax.sharding.AxisType.Explicit)
  return _Layout(axis_name, R, tuple(batch_axes), head_axis, explicit)


def _reshard(x: jax.Array, spec: PartitionSpec, layout: _Layout) -> jax.Array:
  """Reshards ``x`` to ``spec`` on the Explicit mesh axes (shard_map requires the inputs' explicit
  sharding to match its in_specs; Auto axes it reshards itself)."""

  def keep(entry):
    names = entry if isinstance(entry, tuple) else (entry,)
    names = tuple(a for a in names if a in layout.explicit_axes)
    return names or None

  return jax.reshard(x, PartitionSpec(*(keep(e) for e in spec)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _ring_attention(q, k, v, segment_ids, layout):
  return _ring_forward(q, k, v, segment_ids, layout)[0]


def _ring_forward(q, k, v, segment_ids, layout):
  spec, seg_spec = layout.spec(), layout.spec(heads=False)
  out, lse = jax.shard_map(
    functools.partial(_local_forward, layout=layout),
    in_specs=(spec, spec, spec, seg_spec),
    out_specs=(spec, spec),
  )(q, k, v, segment_ids)
  return out, (q, k, v, segment_ids, out, lse)


def _ring_backward(layout, residuals, d_out):
  q, k, v, segment_ids, out, lse = residuals
  spec, seg_spec = layout.spec(), layout.spec(heads=False)
  dq, dk, dv = jax.shard_map(
    functools.partial(_local_backward, layout=layout),
    in_specs=(spec, spec, spec, seg_spec, spec, spec, spec),
    out_specs=(spec, spec, spec),
  )(q, k, v, segment_ids, out, lse, d_out)
  return dq, dk, dv, None  # segment_ids: integer, no cotangent


_ring_attention.defvjp(_ring_forward, _ring_backward)


def _shift(x, layout: _Layout):
  """Sends a pytree of chunks one step around the ring (device d -> d + 1)."""
  R = layout.ring_size
  return jax.lax.ppermute(x, layout.axis_name, [(d, (d + 1) % R) for d in range(R)])


def _chunk_mask(q_seg, kv_seg, i, src, C):
  """[b, C, C] allowed (query, key) pairs of query chunk i and key chunk src (global indices)."""
  q_pos = i * C + jnp.arange(C, dtype=jnp.int32)
  k_pos = src * C + jnp.arange(C, dtype=jnp.int32)
  causal = k_pos[None, :] <= q_pos[:, None]
  same = kv_seg[:, None, :] == q_seg[:, :, None]
  return causal[None] & same & (kv_seg[:, None, :] > 0)


def _scores(qg, k, mask):
  """Scaled float32 scores [b, C, kh, g, C] (masked to ``_NEG``) and the broadcast mask."""
  scale = 1.0 / math.sqrt(qg.shape[-1])
  s = jnp.einsum("bqkgh,btkh->bqkgt", qg, k, preferred_element_type=jnp.float32) * scale
  mask = mask[:, :, None, None, :]
  return jnp.where(mask, s, _NEG), mask


def _chunk_forward(qg, k, v, mask):
  """(o, lse) of the queries over one key chunk: o [b, C, kh, g, H], lse [b, C, kh, g] float32."""
  s, mask = _scores(qg, k, mask)
  m = jnp.max(s, axis=-1, keepdims=True)  # _NEG on rows with no allowed key
  p = jnp.where(mask, jnp.exp(s - m), 0.0)
  total = jnp.sum(p, axis=-1)
  acc = jnp.einsum("bqkgt,btkh->bqkgh", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
  nonempty = total > 0
  safe_total = jnp.where(nonempty, total, 1.0)  # double where: no 0 / 0, no log(0) on empty rows
  lse = jnp.where(nonempty, m[..., 0] + jnp.log(safe_total), _NEG)
  return acc / safe_total[..., None], lse


def _merge(o_a, lse_a, o_b, lse_b):
  """Softmax attention over the union of two disjoint key sets from the parts' (o, lse)."""
  lse = jnp.maximum(lse_a, lse_b) + jnp.log1p(jnp.exp(-jnp.abs(lse_a - lse_b)))
  w_a, w_b = jnp.exp(lse_a - lse)[..., None], jnp.exp(lse_b - lse)[..., None]
  return w_a * o_a + w_b * o_b, lse


def _local_forward(q, k, v, segment_ids, *, layout: _Layout):
  """Per device: q [b, C, n, H], k, v [b, C, kh, H], segment_ids [b, C] -> (out, lse [b, C, n])."""
  b, C, n, H = q.shape
  kh = k.shape[2]
  qg = q.reshape(b, C, kh, n // kh, H)
  i = jax.lax.axis_index(layout.axis_name)

  def accumulate(j, kv, o, lse):
    # Key chunk src = (i - j) mod R is in the causal future of every local query iff j > i.
    k_j, v_j, seg_j = kv

    def compute(o, lse):
      mask = _chunk_mask(segment_ids, seg_j, i, (i - j) % layout.ring_size, C)
      return _merge(o, lse, *_chunk_forward(qg, k_j, v_j, mask))

    return jax.lax.cond(j <= i, compute, lambda o, lse: (o, lse), o, lse)

  def step(j, carry):
    kv, o, lse = carry
    o, lse = accumulate(j, kv, o, lse)
    return _shift(kv, layout), o, lse

  o = jnp.zeros_like(qg, dtype=jnp.float32)
  lse = jnp.full_like(qg[..., 0], _NEG, dtype=jnp.float32)
  R = layout.ring_size
  kv, o, lse = jax.lax.fori_loop(0, R - 1, step, ((k, v, segment_ids), o, lse))
  o, lse = accumulate(R - 1, kv, o, lse)
  return o.reshape(b, C, n, H).astype(q.dtype), lse.reshape(b, C, n)


def _chunk_backward(qg, k, v, mask, do, lse, delta):
  """(dQ, dK, dV) float32 contributions of one (query chunk, key chunk) block."""
  scale = 1.0 / math.sqrt(qg.shape[-1])
  s, mask = _scores(qg, k, mask)
  # Allowed scores are <= lse, so p <= 1; masked ones (and every key of an empty row, whose lse
  # is _NEG) get exp(_NEG) = 0.
  p = jnp.exp(jnp.where(mask, s - lse[..., None], _NEG))
  dt = qg.dtype
  dv = jnp.einsum("bqkgt,bqkgh->btkh", p.astype(dt), do, preferred_element_type=jnp.float32)
  dp = jnp.einsum("bqkgh,btkh->bqkgt", do, v, preferred_element_type=jnp.float32)
  ds = (p * (dp - delta[..., None])).astype(dt)
  dq = jnp.einsum("bqkgt,btkh->bqkgh", ds, k, preferred_element_type=jnp.float32) * scale
  dk = jnp.einsum("bqkgt,bqkgh->btkh", ds, qg, preferred_element_type=jnp.float32) * scale
  return dq, dk, dv


def _local_backward(q, k, v, segment_ids, out, lse, d_out, *, layout: _Layout):
  """Per device: the forward's inputs and (out, lse) plus d_out [b, C, n, H] -> (dq, dk, dv)."""
  b, C, n, H = q.shape
  kh = k.shape[2]
  grouped = (b, C, kh, n // kh)
  qg = q.reshape(*grouped, H)
  do = d_out.astype(q.dtype).reshape(*grouped, H)
  lse = lse.reshape(grouped)
  # D = rowsum(dO * O) = sum_t P_t dP_t, the softmax-Jacobian term of dS.
  delta = jnp.sum(do.astype(jnp.float32) * out.reshape(*grouped, H).astype(jnp.float32), axis=-1)
  i = jax.lax.axis_index(layout.axis_name)

  def accumulate(j, kv, grads):
    k_j, v_j, seg_j = kv

    def compute(dq, dk, dv):
      mask = _chunk_mask(segment_ids, seg_j, i, (i - j) % layout.ring_size, C)
      ddq, ddk, ddv = _chunk_backward(qg, k_j, v_j, mask, do, lse, delta)
      return dq + ddq, dk + ddk, dv + ddv

    return jax.lax.cond(j <= i, compute, lambda *g: g, *grads)

  def step(j, carry):
    kv, dq, dkv = carry
    dq, *dkv = accumulate(j, kv, (dq, *dkv))
    # dK, dV travel with their chunk; after R hops in all they are back on its owner.
    kv, dkv = _shift((kv, tuple(dkv)), layout)
    return kv, dq, dkv

  dq = jnp.zeros_like(qg, dtype=jnp.float32)
  dkv = (jnp.zeros_like(k, dtype=jnp.float32), jnp.zeros_like(v, dtype=jnp.float32))
  R = layout.ring_size
  kv, dq, dkv = jax.lax.fori_loop(0, R - 1, step, ((k, v, segment_ids), dq, dkv))
  dq, *dkv = accumulate(R - 1, kv, (dq, *dkv))
  dk, dv = _shift(tuple(dkv), layout)  # the last hop home
  return dq.reshape(b, C, n, H).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)
