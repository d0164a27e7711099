"""Packed update layout: the sequences of a micro-batch laid end to end in rows, without padding.

The step batch's rows are [B, S] = left-padded prompt ++ completion padded to T, so a batch of
long-tailed completions spends most of the update on padding. ``pack_batch`` (host side, numpy)
lays each micro-batch's sequences (real prompt tokens and the completion up to its last loss
token) into ``r`` rows of ``W`` tokens by first-fit decreasing, numbered by segment ids; the
decoder runs on [r, W] (attention never crosses a segment, positions restart per sequence,
``rlvr_jax.model.attention``), and the hidden states that predict each completion token are
gathered back to the [b, T] layout the objective reads. Everything after that gather (log-probs,
objective, metrics, auxiliary losses) is the padded path's code on the padded path's arrays:
loss, gradients and metrics equal it up to float rounding (tests/test_packing.py).

Shapes stay few: in the ``rows`` layout ``r`` is the largest row count any micro-batch needs,
rounded up to a multiple of ``max(row_multiple, ceil(b / buckets))``, so at most ``buckets``
packed shapes are compiled for a given batch shape; in the ``ragged`` layout the width comes
from a grid of widths 9% apart (``ragged_width``); ``max_segments`` (static, used by the cuDNN kernel) is rounded up to a
power of two.

Completion tokens after the last loss token (padding after the stop token) are not packed: they
cannot influence a loss token (attention is causal) and their loss mask is 0; their gather
indices point at token 0 (finite garbage, masked).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax.train.state import TrainBatch
from rlvr_jax.types import pytree_dataclass


@pytree_dataclass
class PackedLayout:
  """The packed rows of a step batch of M micro-batches (each of b = B / M original rows).

  Attributes:
    tokens: [M * r, W] int32 token ids; micro-batch m owns rows [m r, (m + 1) r).
    positions: [M * r, W] int32 positions within each sequence; -1 on padding.
    segment_ids: [M * r, W] int32: the k-th sequence of a row is segment k (1, 2, ...), 0 padding.
    predict_index: [B, T] int32: flat index in its micro-batch's r * W tokens of the hidden state
      that predicts completion token t of row b (the token before it); 0 where unpacked.
    token_index: [B, T] int32: flat index of completion token t of row b itself; 0 where unpacked.
    max_segments: static: an upper bound on the segments of one row (a power of two).
  """

  _static_fields = ("max_segments",)

  tokens: jax.Array
  positions: jax.Array
  segment_ids: jax.Array
  predict_index: jax.Array
  token_index: jax.Array
  max_segments: int = 1


def sequence_lengths(positions, completion_mask) -> tuple[np.ndarray, np.ndarray]:
  """(prompt lengths [B], kept completion lengths [B]) of rows in the step layout: real prompt
  tokens (position >= 0 in the first S - T columns) and completion tokens up to the last one of
  the loss mask."""
  positions, cmask = np.asarray(positions), np.asarray(completion_mask, bool)
  T = cmask.shape[1]
  prompt_len = (positions[:, :-T] >= 0).sum(axis=1)
  last = T - np.argmax(cmask[:, ::-1], axis=1)  # one past the last True
  kept = np.where(cmask.any(axis=1), last, 0)
  return prompt_len.astype(np.int64), kept.astype(np.int64)


def first_fit_decreasing(lengths, width: int) -> list[list[int]]:
  """Bins (lists of item indices) of total length <= ``width``, first fit in decreasing order of
  length (ties by index, so the result is deterministic)."""
  order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
  bins, free = [], []
  for i in order:
    n = lengths[i]
    if n > width:
      raise ValueError(f"a sequence of {n} tokens does not fit packed rows of {width}")
    for j, f in enumerate(free):
      if n <= f:
        bins[j].append(i)
        free[j] -= n
        break
    else:
      bins.append([i])
      free.append(width - n)
  return bins


def padding_fraction(lengths, rows: int, width: int) -> float:
  """1 - real tokens / (rows * width)."""
  return 1.0 - float(np.sum(lengths)) / float(rows * width)


LAYOUTS = ("rows", "ragged")


def ragged_width(n: int) -> int:
  """The smallest width of the ragged layout's grid that holds ``n`` tokens: 2^(k/8) rounded up
  to a multiple of 8 (consecutive widths 9% apart, so at most 9% padding from the rounding and
  a handful of compiled shapes over a run)."""
  k = math.ceil(8 * math.log2(max(n, 1)))
  while True:
    w = -(-math.ceil(2 ** (k / 8)) // 8) * 8
    if w >= n:
      return w
    k += 1


def plan(
  lengths, *, num_microbatches: int, width: int, row_multiple: int = 1, buckets: int = 8,
  layout: str = "rows",
) -> tuple[list[list[list[int]]], int, int]:  # fmt: skip
  """(per micro-batch: bins of row indices local to it, rows per micro-batch r, row width W).

  ``rows``: bins of ``width`` tokens; r is the most any micro-batch needs, rounded up to a
  multiple of ``max(row_multiple, ceil(b / buckets))``. ``ragged``: r = ``row_multiple`` rows
  per micro-batch (one per data-parallel device), as wide as the grid of ``ragged_width`` needs
  for first fit to place every sequence."""
  if layout not in LAYOUTS:
    raise ValueError(f"packing layout {layout!r} not in {LAYOUTS}")
  lengths = np.asarray(lengths)
  b = len(lengths) // num_microbatches
  per_mb = [lengths[m * b : (m + 1) * b] for m in range(num_microbatches)]
  if layout == "rows":
    plans = [first_fit_decreasing(x, width) for x in per_mb]
    step = max(int(row_multiple), math.ceil(b / max(int(buckets), 1)))
    r = max(len(p) for p in plans)
    return plans, -(-r // step) * step, width
  r = max(int(row_multiple), 1)
  need = max(max(int(x.max()), -(-int(x.sum()) // r)) for x in per_mb)
  W = ragged_width(need)
  while True:
    plans = [first_fit_decreasing(x, W) for x in per_mb]
    if max(len(p) for p in plans) <= r:
      return plans, r, W
    W = ragged_width(W + 1)


def padding_report(batch: TrainBatch, *, num_microbatches: int, row_multiple: int = 1) -> dict:
  """The padding fraction of the update's token rows in each layout: padded ([B, S]), packed
  rows of S (``rows``) and ``ragged`` (micro-batches balanced): ``update/padding_{padded,rows,
  ragged}``."""
  B, S = np.shape(batch.tokens)
  prompt_len, kept = sequence_lengths(batch.positions, batch.completion_mask)
  lengths = prompt_len + kept
  out = {"update/padding_padded": padding_fraction(lengths, B, S)}
  for layout in LAYOUTS:
    order = balanced_order(lengths, num_microbatches) if layout == "ragged" else slice(None)
    _, r, W = plan(
      lengths[order], num_microbatches=num_microbatches, width=S, row_multiple=row_multiple,
      layout=layout,
    )  # fmt: skip
    out[f"update/padding_{layout}"] = padding_fraction(lengths, r * num_microbatches, W)
  return out


def balanced_order(lengths, num_microbatches: int) -> np.ndarray:
  """A row order whose M consecutive blocks of b = B / M rows hold about equal token counts
  (longest first, each to the block with the fewest tokens that has room). Row i of the
  reordered batch is row ``order[i]``."""
  lengths = np.asarray(lengths)
  b = len(lengths) // num_microbatches
  blocks, totals = [[] for _ in range(num_microbatches)], np.zeros(num_microbatches)
  for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
    m = min((m for m in range(num_microbatches) if len(blocks[m]) < b), key=lambda m: totals[m])
    blocks[m].append(i)
    totals[m] += lengths[i]
  return np.asarray([i for block in blocks for i in sorted(block)], np.int64)


def pack_batch(
  batch: TrainBatch,
  *,
  num_microbatches: int = 1,
  width: int | None = None,
  row_multiple: int = 1,
  buckets: int = 8,
  layout: str = "rows",
  balance: bool = False,
) -> TrainBatch:
  """``batch`` with ``packed`` set: each micro-batch's sequences packed into r rows of W tokens.

  Args:
    batch: the step batch (host or device arrays; read on the host).
    num_microbatches: M, as the train step splits the batch.
    width: W of the ``rows`` layout (default: S, the batch's row width: every sequence fits).
    row_multiple: r is a multiple of it (e.g. the data-parallel size, so rows shard evenly).
    buckets: ``rows``: r is rounded up to a multiple of ceil(b / buckets), so at most
      ``buckets`` shapes.
    layout: ``rows`` (rows of W = S: attention costs about what it costs padded, for kernels that
      compute every causal tile of a row: blockwise, splash, Pallas GPU) or ``ragged`` (one row
      per data-parallel device, as wide as it needs on a 9% grid: for cuDNN's ragged kernel,
      whose attention cost is per sequence whatever the row holds).
    balance: first reorder the rows so that the micro-batches hold about equal token counts
      (``balanced_order``; every packed micro-batch is as wide as the fullest one). The loss and
      gradient are sums over micro-batches normalised by the step's global counts, so the order
      changes nothing, except for objectives with micro-batch-scope statistics
      (``scope='micro'``), whose split is then a different one.
  """
  prompt_len, kept = sequence_lengths(batch.positions, batch.completion_mask)
  if balance and num_microbatches > 1:
    order = balanced_order(prompt_len + kept, num_microbatches)
    batch = jax.tree.map(lambda x: np.asarray(x)[order], batch)
    prompt_len, kept = prompt_len[order], kept[order]
  tokens, positions = np.asarray(batch.tokens), np.asarray(batch.positions)
  B, S = tokens.shape
  T = np.shape(batch.completion_mask)[1]
  Sp = S - T
  if B % num_microbatches:
    raise ValueError(f"batch rows {B} not divisible by num_microbatches={num_microbatches}")
  b = B // num_microbatches
  lengths = prompt_len + kept
  plans, r, W = plan(
    lengths, num_microbatches=num_microbatches, width=S if width is None else int(width),
    row_multiple=row_multiple, buckets=buckets, layout=layout,
  )  # fmt: skip
  most = max(len(bin_) for p in plans for bin_ in p)
  max_segments = 1 << (most - 1).bit_length()

  out_tok = np.zeros((num_microbatches * r, W), np.int32)
  out_pos = np.full((num_microbatches * r, W), -1, np.int32)
  out_seg = np.zeros((num_microbatches * r, W), np.int32)
  predict = np.zeros((B, T), np.int32)
  at = np.zeros((B, T), np.int32)
  for m, bins in enumerate(plans):
    for j, bin_ in enumerate(bins):
      row, offset = m * r + j, 0
      for k, local in enumerate(bin_):
        i = m * b + local
        p, c = int(prompt_len[i]), int(kept[i])
        cols = np.r_[np.arange(Sp - p, Sp), np.arange(Sp, Sp + c)]  # the sequence's columns
        n = len(cols)
        out_tok[row, offset : offset + n] = tokens[i, cols]
        out_pos[row, offset : offset + n] = positions[i, cols]
        out_seg[row, offset : offset + n] = k + 1
        flat = j * W + offset  # index within the micro-batch's r * W tokens
        at[i, :c] = flat + p + np.arange(c)
        predict[i, :c] = flat + p - 1 + np.arange(c)
        offset += n
  packed = PackedLayout(
    tokens=jnp.asarray(out_tok), positions=jnp.asarray(out_pos),
    segment_ids=jnp.asarray(out_seg), predict_index=jnp.asarray(np.maximum(predict, 0)),
    token_index=jnp.asarray(at), max_segments=max_segments,
  )  # fmt: skip
  return dataclasses.replace(batch, packed=packed)


def gather_rows(flat: jax.Array, index: jax.Array) -> jax.Array:
  """``flat`` [r * W, ...] gathered at ``index`` [b, T] -> [b, T, ...]."""
  return jnp.take(flat, index, axis=0, mode="clip")
