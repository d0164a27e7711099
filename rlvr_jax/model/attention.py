"""Causal self-attention of the no-cache forward (training, scoring, prefill), by implementation.

Every implementation computes the same function of (q, k, v, segment_ids):

  o[b, s, n] = sum_t softmax_t(q[b, s, n] . k[b, t, n // G] / sqrt(H) | allowed(b, s, t)) v[b, t]
  allowed(b, s, t) = t <= s  and  seg[b, t] == seg[b, s]  and  seg[b, t] > 0

with G = N / K query heads per key/value head (grouped-query attention, arXiv 2305.13245).
``segment_ids`` [B, S] int32 number the sequences of a row (1, 2, ...: a row of the packed update
layout holds several, ``rlvr_jax.train.packing``); 0 marks padding, never attended. An unpacked
row is one segment: ``segment_ids = positions >= 0`` (left padding is segment 0). Outputs at
padding queries are finite garbage (zero or an average, by implementation): no real token reads
them, and their cotangents are zero.

Implementations (``ModelConfig.attention``):

  * ``xla``: the einsum reference, ``layers.attention`` on the dense [B, S, S] mask; its float32
    scores are [B, N, S, S] per layer: time and memory grow with S^2.
  * ``blockwise``: online softmax over tiles with a hand-written backward (FlashAttention,
    arXiv 2205.14135), O(S) memory, skips tiles above the diagonal; plain XLA, runs everywhere
    (``rlvr_jax.model.blockwise_attention``).
  * ``cudnn``: cuDNN's fused flash attention through ``jax._src.cudnn.fused_attention_stablehlo``
    with the ragged (packed) layout: each segment is a sequence given by its offset and length
    (Hopper or newer, bfloat16 / float16 inputs).
  * ``pallas_gpu``: Pallas' Triton flash attention (``jax.experimental.pallas.ops.gpu.attention``)
    with segment ids; key/value heads are repeated G times (the kernel has no grouped heads).
  * ``splash``: Pallas' TPU splash attention with a causal mask and segment ids, one grouped
    (MQA) kernel per key/value head.
  * ``ring``: context parallelism over the mesh axis ``"context"``
    (``rlvr_jax.model.context_parallel``).
  * ``auto``: ``auto_implementation``: cuDNN on Hopper GPUs (Pallas GPU on older ones; 16-bit
    inputs), splash on TPU; elsewhere the einsum up to ``BLOCKWISE_MIN_LEN`` tokens per row and
    blockwise beyond.

The kernels that leave padding outputs undefined (cuDNN writes only inside segments) are wrapped
so that padding queries give 0 and padding positions get zero cotangents.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from rlvr_jax.model import layers as L

IMPLEMENTATIONS = ("xla", "blockwise", "cudnn", "pallas_gpu", "splash", "ring")

# ``auto`` on CPU: the einsum below this many tokens per row (what the CPU suite and the default
# runs have always used), blockwise from it on (the [B, N, S, S] float32 scores of one layer are
# 64 MiB per head and row at S = 4096).
BLOCKWISE_MIN_LEN = 4096


def segment_ids_from_positions(positions: jax.Array) -> jax.Array:
  """One segment per row: 1 on real tokens (position >= 0), 0 on padding. [B, S] int32."""
  return (positions >= 0).astype(jnp.int32)


def dense_mask(segment_ids: jax.Array) -> jax.Array:
  """[B, S, S] bool: ``allowed(b, s, t)`` of the module docstring."""
  S = segment_ids.shape[1]
  causal = jnp.tril(jnp.ones((S, S), bool))
  same = segment_ids[:, :, None] == segment_ids[:, None, :]
  return causal[None] & same & (segment_ids[:, None, :] > 0)


def _gpu_capability() -> tuple[int, ...]:
  """The first GPU's CUDA compute capability, (0,) when it has none (ROCm)."""
  capability = getattr(jax.devices()[0], "compute_capability", None)
  return tuple(int(x) for x in str(capability).split(".")) if capability else (0,)


@functools.cache
def cudnn_ragged_available() -> bool:
  """Whether this jax has cuDNN attention with the ragged layout (``q_offsets``): the function
  is not public API, so ``auto`` checks its signature before choosing it."""
  import inspect

  try:
    from jax._src.cudnn import fused_attention_stablehlo as cudnn
  except ImportError:
    return False
  fn = getattr(cudnn, "dot_product_attention", None)
  return fn is not None and "q_offsets" in inspect.signature(fn).parameters


def auto_implementation(
  q: jax.Array, *, platform: str | None = None, gpu_capability: tuple[int, ...] | None = None
) -> str:
  """The implementation ``auto`` stands for, from the platform and the shapes of ``q`` [B, S, N,
  H]: on GPU with 16-bit inputs, ``cudnn`` on Hopper or newer (its ragged layout needs compute
  capability 9.0) for a head dim cuDNN takes (a multiple of 8, at most 256) when this jax has it
  (``cudnn_ragged_available``), else ``pallas_gpu``; ``splash`` on TPU; otherwise ``xla`` below
  ``BLOCKWISE_MIN_LEN`` tokens and ``blockwise`` from it on."""
  platform = platform or jax.default_backend()
  H = q.shape[-1]
  if platform in ("gpu", "cuda") and q.dtype in (jnp.bfloat16, jnp.float16):
    capability = _gpu_capability() if gpu_capability is None else gpu_capability
    if H % 8 == 0 and H <= 256 and capability >= (9, 0) and cudnn_ragged_available():
      return "cudnn"
    if capability >= (8, 0) and H >= 16:
      return "pallas_gpu"
  if platform == "tpu":
    return "splash"
  return "xla" if q.shape[1] < BLOCKWISE_MIN_LEN else "blockwise"


def self_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  segment_ids: jax.Array,
  *,
  num_kv_heads: int,
  implementation: str = "auto",
  max_segments: int = 1,
) -> jax.Array:
  """Causal grouped-query self-attention within segments (the module docstring).

  Args:
    q: [B, S, N, H] queries; k, v: [B, S, K, H] keys / values (K = ``num_kv_heads``).
    segment_ids: [B, S] int32, segments numbered 1, 2, ... in order along the row, 0 on padding.
    implementation: one of ``IMPLEMENTATIONS`` or ``"auto"``.
    max_segments: the most segments a row holds (static; the cuDNN ragged layout's width).
  Returns:
    [B, S, N, H] in the dtype of ``q``.
  """
  B, S, N, H = q.shape
  K = num_kv_heads
  if k.shape != (B, S, K, H) or v.shape != k.shape or N % K:
    raise ValueError(
      f"self_attention: q {q.shape}, k {k.shape}, v {v.shape} with num_kv_heads={K} do not match"
    )
  if segment_ids.shape != (B, S):
    raise ValueError(f"self_attention: segment_ids {segment_ids.shape}, expected {(B, S)}")
  impl = auto_implementation(q) if implementation == "auto" else implementation
  if impl not in _IMPLS:
    raise ValueError(f"attention implementation {implementation!r} not in {IMPLEMENTATIONS}")
  segment_ids = segment_ids.astype(jnp.int32)
  return _IMPLS[impl](q, k, v, segment_ids, num_kv_heads=K, max_segments=max_segments)


def _xla(q, k, v, segment_ids, *, num_kv_heads, max_segments):
  del max_segments
  return L.attention(q, k, v, dense_mask(segment_ids), num_kv_heads=num_kv_heads)


def _blockwise(q, k, v, segment_ids, *, num_kv_heads, max_segments):
  del max_segments
  from rlvr_jax.model import blockwise_attention

  return blockwise_attention.blockwise_attention(q, k, v, segment_ids, num_kv_heads=num_kv_heads)


def _ring(q, k, v, segment_ids, *, num_kv_heads, max_segments):
  del max_segments
  from rlvr_jax.model import context_parallel

  return context_parallel.ring_self_attention(q, k, v, segment_ids, num_kv_heads=num_kv_heads)


# ------------------------------------------------------------------------------------------------
# Kernels that leave padding undefined: zero it on the way in (cotangents) and out (values).


@jax.custom_vjp
def _zero_cotangent_where_padding(x: jax.Array, real: jax.Array) -> jax.Array:
  """Identity on x [B, S, ...]; its cotangent is zeroed where ``real`` [B, S] is False (a kernel
  may write anything into the gradients of positions outside every segment)."""
  return x


def _zero_cotangent_fwd(x, real):
  return x, real


def _zero_cotangent_bwd(real, g):
  keep = real.reshape(real.shape + (1,) * (g.ndim - real.ndim))
  return jnp.where(keep, g, jnp.zeros((), g.dtype)), None


_zero_cotangent_where_padding.defvjp(_zero_cotangent_fwd, _zero_cotangent_bwd)


def _padding_safe(kernel):
  """``kernel`` with padding inputs' cotangents and padding outputs zeroed."""

  @functools.wraps(kernel)
  def run(q, k, v, segment_ids, **kw):
    real = segment_ids > 0
    q, k, v = (_zero_cotangent_where_padding(x, real) for x in (q, k, v))
    out = kernel(q, k, v, segment_ids, **kw)
    return jnp.where(real[:, :, None, None], out, jnp.zeros((), out.dtype))

  return run


def ragged_offsets(segment_ids: jax.Array, max_segments: int) -> tuple[jax.Array, jax.Array]:
  """cuDNN's ragged layout of [B, S] segment ids: (offsets [B, M + 1], lengths [B, M]) int32,
  M = ``max_segments``: segment j + 1 starts at ``offsets[:, j]`` and has ``lengths[:, j]``
  tokens; absent segments (and the last offset) are -1."""
  ids = jnp.arange(1, max_segments + 1, dtype=jnp.int32)
  member = segment_ids[:, :, None] == ids[None, None, :]  # [B, S, M]
  lengths = member.sum(axis=1, dtype=jnp.int32)
  starts = jnp.argmax(member, axis=1).astype(jnp.int32)  # first index of each segment
  present = lengths > 0
  lengths = jnp.where(present, lengths, -1)
  starts = jnp.where(present, starts, -1)
  return jnp.pad(starts, ((0, 0), (0, 1)), constant_values=-1), lengths


@_padding_safe
def _cudnn(q, k, v, segment_ids, *, num_kv_heads, max_segments):
  from jax._src.cudnn import fused_attention_stablehlo as cudnn

  # The ragged layout takes key / value offsets in elements of N heads (jax 0.10.2 scales them
  # by the query's N * H), so grouped heads are repeated to N.
  G = q.shape[2] // num_kv_heads
  k, v = jnp.repeat(k, G, axis=2), jnp.repeat(v, G, axis=2)
  # At least 2 segments: with one, jax passes neither offsets nor lengths to cuDNN, and a
  # left-padded row would attend its padding.
  offsets, lengths = ragged_offsets(segment_ids, max(max_segments, 2))
  return cudnn.dot_product_attention(
    q, k, v, None, None, lengths, lengths, offsets, offsets,
    scale=1.0 / math.sqrt(q.shape[-1]), mask_type=cudnn.MaskType.CAUSAL,
  )  # fmt: skip


def _pallas_gpu(q, k, v, segment_ids, *, num_kv_heads, max_segments, interpret=False):
  """Pallas' Triton kernel; its segment mask is plain equality (padding attends padding, finite),
  and its blocks must divide S, so S is padded to a multiple of the block (segment 0)."""
  from jax.experimental.pallas.ops.gpu import attention as pallas_attention

  del max_segments
  B, S, N, H = q.shape
  G = N // num_kv_heads
  k, v = jnp.repeat(k, G, axis=2), jnp.repeat(v, G, axis=2)
  block = min(128, _next_power_of_2(S))
  pad = -S % block
  if pad:
    q, k, v = (jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) for x in (q, k, v))
    segment_ids = jnp.pad(segment_ids, ((0, 0), (0, pad)))
  sizes = pallas_attention.BlockSizes(
    block_q=block, block_k=block, block_q_dkv=block, block_kv_dkv=block, block_q_dq=block,
    block_kv_dq=block,
  )  # fmt: skip
  out = pallas_attention.mha(
    q, k, v, segment_ids, sm_scale=1.0 / math.sqrt(H), causal=True, block_sizes=sizes,
    interpret=interpret,
  )  # fmt: skip
  return out[:, :S]


def _next_power_of_2(n: int) -> int:
  return 1 if n <= 1 else 2 ** math.ceil(math.log2(n))


def _splash(q, k, v, segment_ids, *, num_kv_heads, max_segments, interpret=False):
  """Pallas' TPU splash attention: one MQA kernel (G query heads on one key/value head) vmapped
  over rows and key/value heads; q is pre-scaled by 1/sqrt(H) (the kernel does not scale).
  Sequence lengths must be multiples of the kernel's blocks (128 by default on TPU)."""
  from jax.experimental.pallas.ops.tpu import splash_attention as splash

  del max_segments
  B, S, N, H = q.shape
  K = num_kv_heads
  G = N // K
  pad = -S % 128  # the kernel's blocks are multiples of 128 tokens
  if pad:
    out = _splash(
      *(jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) for x in (q, k, v)),
      jnp.pad(segment_ids, ((0, 0), (0, pad))), num_kv_heads=K, max_segments=None,
      interpret=interpret,
    )  # fmt: skip
    return out[:, :S]
  block = max(b for b in (512, 256, 128) if S % b == 0)
  sizes = splash.BlockSizes(
    block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
    block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block,
  )  # fmt: skip
  mask = splash.MultiHeadMask([splash.CausalMask((S, S))] * G)
  kernel = splash.make_splash_mqa_single_device(mask, block_sizes=sizes, interpret=interpret)
  qg = (q * jnp.asarray(1.0 / math.sqrt(H), q.dtype)).reshape(B, S, K, G, H)
  qg = qg.transpose(0, 2, 3, 1, 4)  # [B, K, G, S, H]
  kt, vt = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, K, S, H]

  def one(qh, kh, vh, seg):
    return kernel(qh, kh, vh, segment_ids=splash.SegmentIds(q=seg, kv=seg))

  per_head = jax.vmap(one, in_axes=(0, 0, 0, None))  # over K
  out = jax.vmap(per_head, in_axes=(0, 0, 0, 0))(qg, kt, vt, segment_ids)  # [B, K, G, S, H]
  return out.transpose(0, 3, 1, 2, 4).reshape(B, S, N, H).astype(q.dtype)


_IMPLS = {
  "xla": _xla,
  "blockwise": _blockwise,
  "cudnn": _cudnn,
  "pallas_gpu": _pallas_gpu,
  "splash": _splash,
  "ring": _ring,
}


def _decode_splits(S: int) -> int | None:
  """The most key splits (of 16, 8, 4, 2, 1) Pallas' decode kernel can cut S keys into: S / k
  >= 16 tokens each, and a whole number of its 128-key blocks when longer than one block; None
  when there is none (the einsum is used)."""
  for k in (16, 8, 4, 2, 1):
    split = S // k
    if S % k == 0 and split >= 16 and (split <= 128 or split % 128 == 0):
      return k
  return None


def _decode_part(q, k, v, start, end, *, interpret):
  """Pallas' Triton decode attention of one query per row over keys [start, end) of k / v
  ([N, K, S, H]): the unnormalised output [N, N_h, H] float32, its softmax sum l and max m
  ([N, N_h]); an empty range gives o = l = 0."""
  from jax.experimental.pallas.ops.gpu import decode_attention

  o, (sums, maxes) = decode_attention.gqa(
    q, k.swapaxes(1, 2), v.swapaxes(1, 2), start_idx=start, kv_seq_len=end,
    k_splits=_decode_splits(k.shape[2]), return_residuals=True, normalize_output=False,
    interpret=interpret,
  )  # fmt: skip
  return o.astype(jnp.float32), sums, maxes


def slot_decode_attention(
  q, kp, vp, mask_p, kc, vc, mask_c, *, num_kv_heads: int, implementation: str = "auto",
  interpret: bool | None = None,
):  # fmt: skip
  """``layers.prompt_and_slot_attention`` (one query per slot over its prompt's keys and its own
  completion's), by implementation (``ModelConfig.decode_attention``).

  ``pallas_gpu`` runs Pallas' decode kernel once per part over the part's filled range only
  (the prompt is left-padded: keys [S_p - sum(mask_p), S_p); the completion fills columns from
  0: [0, sum(mask_c))), so it reads the filled keys instead of the whole buffers; the two parts'
  outputs are merged by their softmax statistics: with M = max(m_p, m_c),
  o = (o_p e^(m_p - M) + o_c e^(m_c - M)) / (l_p e^(m_p - M) + l_c e^(m_c - M)).
  Buffers the kernel cannot split (fewer than 16 keys, or not a whole number of blocks) fall
  back to the einsum. ``interpret``: run the kernel in Pallas' interpreter (default: on CPU,
  where there is no Triton; this is how the tests run it).
  """
  Sp, Tc = kp.shape[2], kc.shape[2]
  use = implementation if implementation != "auto" else "xla"
  if use == "xla" or _decode_splits(Sp) is None or _decode_splits(Tc) is None:
    return L.prompt_and_slot_attention(q, kp, vp, mask_p, kc, vc, mask_c, num_kv_heads=num_kv_heads)
  if use != "pallas_gpu":
    raise ValueError(f"unknown decode attention {implementation!r}")
  n_p = jnp.sum(mask_p, axis=1, dtype=jnp.int32)
  n_c = jnp.sum(mask_c, axis=1, dtype=jnp.int32)
  if interpret is None:
    interpret = jax.default_backend() == "cpu"
  part = functools.partial(_decode_part, q, interpret=interpret)
  o_p, l_p, m_p = part(kp, vp, Sp - n_p, jnp.full_like(n_p, Sp))
  o_c, l_c, m_c = part(kc, vc, jnp.zeros_like(n_c), n_c)
  M = jnp.maximum(m_p, m_c)
  a_p, a_c = jnp.exp(m_p - M), jnp.exp(m_c - M)
  denom = l_p * a_p + l_c * a_c
  out = (o_p * a_p[..., None] + o_c * a_c[..., None]) / jnp.maximum(denom, 1e-30)[..., None]
  return out.astype(q.dtype)
