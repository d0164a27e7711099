"""LATR's lookahead tree rollouts as the sampler of a round (``config.latr``; Xing et al.,
"Lookahead Tree-Based Rollouts", arXiv 2510.24302).

With ``latr.enabled`` ``Collector._round`` samples each group's G rows as a shallow tree instead of
G independent samples; rewards and advantages stay those of the configured estimator and
objective (group-relative ones, as in the paper). With R = ``latr.num_roots`` (0: G // 2) roots and B_p = G - R branch slots per
prompt, T = ``sampling.max_new_tokens`` and W = min(``latr.window``, T):

  1. roots: R rows per prompt sampled as usual (``Collector._generate`` with the round's key:
     they are rows 0..R-1 of the plain round);
  2. candidates (``top_candidates``): one jitted no-grad pass over the roots gives, at every
     completion position t, the k = ``max_per_token`` + 1 most likely tokens of the sampling
     distribution

       p_t(v) = exp(z_t,v) / sum_{u : z_t,u >= thr_t} exp(z_t,u)   for z_t,v >= thr_t, else 0,
       z_t = logits_t / tau,

     thr_t the root's ``sampler_threshold`` (the strategy's truncation; none for plain temperature
     sampling), from the final hidden states and the unembedding, C = ``rl.logprob_chunk`` tokens
     at a time ([C, V] logits per tile, never [B, T, V]);
  3. branch points (``branch_points``): (root r, position t, token c) with t inside the root,
     c != y_t (the root's sampled token), p_t(c) > ``min_prob`` and max_v p_t(v) - p_t(c) <
     ``max_gap``, at most ``max_per_token`` per (r, t) (most likely first), taken earliest
     position first (then root, then probability) until the prompt's B_p slots are filled;
  4. lookahead: a branch is prompt + y_{<t} + c; one ``_generate`` call over every slot samples
     its window w_b, the next min(W, T - t - 1) tokens (none when c is a stop token);
  5. pruning (``too_similar``): a branch whose window is close to its sibling's, the root's own
     tokens after t, w_r = y_{t+1 : t+1+W} (cut at the root's end), is pruned:

       ROUGE-L F1(w_b, w_r) = 2 LCS(w_b, w_r) / (|w_b| + |w_r|) > ``rouge_threshold``   or
       suffix(w_b, w_r) = LCSuf(w_b, w_r) / max(|w_b|, |w_r|) > ``suffix_threshold``,

     LCS the length of the longest common subsequence of the two token windows, LCSuf the length
     of their longest common suffix (both measures 0 when both windows are empty). Stop tokens
     are left out of both windows: two windows that both end (on short answers, most do) are not
     alike for that;
  6. continuation: a second ``_generate`` call over every slot continues each surviving branch
     (prompt + y_{<t} + c + w_b) to its end, with the row's remaining budget T - t - 1 - |w_b|
     (none when c or the window ended with a stop token, or T is reached);
  7. fills: a slot with no branch point (the prompt's roots offered fewer than B_p) or whose branch
     was pruned gets an ordinary sample from the prompt, drawn in the continuation call with the
     full budget T.

Each prompt's G rows are contiguous (group ordered, as ``_sample_local``'s): its R roots, its
surviving branches in branch point order, then its fills (``Lookahead.kind``).

Log-probs: a branch row's ``sampler_logp`` is the root's on the prefix y_{<t}, log p_t(c) at t,
then the sampler's own on the window and the continuation. The token c was CHOSEN by the tree,
not sampled: log p_t(c) is its probability under the policy's sampling distribution (what the
trainer recomputes for it, and what pi_theta / pi_old ratios need), not the probability with
which the tree picked it. ``model_logp`` at t is log softmax(logits_t)_c (tau = 1) and
``sampler_threshold`` at t the root's thr_t (the same prefix, so the same distribution).

Static shapes: both calls always have P * B_p rows, one per slot, each slot a prompt of its own
(one sample); a slot with nothing to sample in a call (no branch point, or a window call row for
a branch that has no room; a continuation of a branch that already ended) runs a 1-token dummy
whose token is dropped. The prompt widths vary with the prefixes and are bucketed
(``sampling.DEFAULT_BUCKETS``), as SPO's forks are. Keys: roots the round's key, windows
fold_in(key, 1), continuations and fills fold_in(key, 2); slot j of the prompt with data index i
has prompt id i * B_p + j in both calls, so no sample depends on the batch it is in.

Metrics of a round (the collector sums them over a step's rounds): ``latr/branch_points`` (the
branches run ahead), ``latr/pruned``, ``latr/filled`` (slots given an ordinary sample) and
``latr/sampled_tokens``: every token kept from the round's calls (the roots, every window, pruned
ones included, the continuations and the fills; not the dropped dummy tokens), which ``_round``
adds to ``rollout/sampled_tokens`` in place of the rows' length sum.

Against the paper: one level of branching (branches of the roots, not of branches), the branch
points read from the finished roots in one pass instead of while they are decoded, and a fixed
budget of G rows per prompt (fills). One process only; no greedy row (estimators reading
``greedy_rewards``); single-turn rounds only.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from rlvr_jax import sampling
from rlvr_jax.train import step as step_lib
from rlvr_jax.types import Rollout

NEG = float(jnp.finfo(jnp.float32).min)
ROOT, BRANCH, FILL = 0, 1, 2  # Lookahead.kind


# ---------------------------------------------------------------------------- window similarity
def lcs_length(a, b) -> int:
  """Length of the longest common subsequence of the sequences ``a`` and ``b`` (O(|a| |b|)).

  L[i][j] = L[i-1][j-1] + 1 if a_i = b_j else max(L[i-1][j], L[i][j-1]); one row kept."""
  a, b = list(a), list(b)
  prev = [0] * (len(b) + 1)
  for x in a:
    cur = [0]
    for j, y in enumerate(b):
      cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
    prev = cur
  return prev[-1]


def rouge_l_f1(a, b) -> float:
  """ROUGE-L F1 of two token sequences: with P = LCS / |a|, R = LCS / |b|, F1 = 2 P R / (P + R)
  = 2 LCS / (|a| + |b|) (symmetric); 0 when both are empty."""
  n = len(a) + len(b)
  return 2.0 * lcs_length(a, b) / n if n else 0.0


def suffix_match(a, b) -> float:
  """The longest common suffix of ``a`` and ``b`` over the longer one's length:
  max{n : a[-n:] = b[-n:]} / max(|a|, |b|), in [0, 1]; 0 when both are empty."""
  a, b = list(a), list(b)
  longest = max(len(a), len(b))
  n = 0
  while n < min(len(a), len(b)) and a[len(a) - 1 - n] == b[len(b) - 1 - n]:
    n += 1
  return n / longest if longest else 0.0


def too_similar(window, sibling, *, rouge_threshold: float, suffix_threshold: float) -> bool:
  """Whether a branch's lookahead ``window`` is pruned against its ``sibling``'s (the root's
  tokens after the branch point): ROUGE-L F1 > rouge_threshold or suffix match >
  suffix_threshold."""
  return (
    rouge_l_f1(window, sibling) > rouge_threshold
    or suffix_match(window, sibling) > suffix_threshold
  )


# ---------------------------------------------------------------------------- branch points
def branch_points(
  top_ids, top_logp, sampled, mask, *, budget: int, min_prob: float, max_gap: float,
  max_per_token: int,
) -> list[tuple[int, int, int, int]]:  # fmt: skip
  """The branch points of one prompt's roots (module docstring, step 3).

  Args:
    top_ids: [R, T, k] the candidate tokens at each position of each root; top_logp: [R, T, k]
      their log-probs log p_t(c) under the sampling distribution (any order).
    sampled: [R, T] the roots' tokens y_t; mask: [R, T] True inside each root.
    budget: the most branch points returned (B_p = G - R).
    min_prob, max_gap, max_per_token: p_t(c) > min_prob, max_v p_t(v) - p_t(c) < max_gap (the
      maximum over the k candidates: the top token's probability), at most max_per_token per (r, t).
  Returns:
    [(r, t, c, i)] (i: c's index in ``top_ids[r, t]``), earliest t first, then r, then the more
    likely c; at most ``budget``.
  """
  top_ids, top_logp = np.asarray(top_ids), np.asarray(top_logp, np.float64)
  order = np.argsort(-top_logp, axis=-1, kind="stable")  # most likely first
  ids = np.take_along_axis(top_ids, order, -1)
  p = np.exp(np.take_along_axis(top_logp, order, -1))
  ok = (
    (ids != np.asarray(sampled)[..., None])
    & (p > min_prob)
    & (p.max(-1, keepdims=True) - p < max_gap)
    & np.asarray(mask, bool)[..., None]
  )
  ok &= np.cumsum(ok, axis=-1) <= max_per_token
  # (t, r, rank) in lexicographic order: earliest position, then root, then probability.
  found = np.argwhere(ok.transpose(1, 0, 2))[: max(budget, 0)]
  return [(int(r), int(t), int(ids[r, t, j]), int(order[r, t, j])) for t, r, j in found]


# ---------------------------------------------------------------------------- the no-grad pass
@functools.partial(
  jax.jit,
  static_argnames=("num_completion", "model_config", "k", "temperature", "chunk_size",
                   "prompt_group"),
)  # fmt: skip
def top_candidates(
  params, tokens, positions, threshold, *, num_completion: int, model_config, k: int,
  temperature: float, chunk_size: int, prompt_group: int = 1,
):  # fmt: skip
  """The k most likely tokens of the sampling distribution at every completion position.

  Args:
    tokens, positions: [B, S] prompt ++ completion (``step.sequence_inputs``); the last
      ``num_completion`` = T tokens are the completions.
    threshold: [B, T] the sampler's truncation of z = logits / tau (``Rollout.sampler_threshold``;
      NEG: none).
    prompt_group: as in ``step.completion_hidden`` (rows in blocks sharing their prompt).
  Returns:
    (ids [B, T, k] int32, logp [B, T, k] = log p_t(ids) under the truncated softmax(z),
    model_logp [B, T, k] = log softmax(logits_t)(ids)), most likely first. The logits exist one
    tile of ``chunk_size`` tokens at a time ([C, V] float32).
  """
  h, unembed, _ = step_lib.completion_hidden(
    params, tokens, positions, num_completion=num_completion, model_config=model_config,
    prompt_group=prompt_group,
  )  # fmt: skip
  B, T, D = h.shape
  n = B * T
  c = max(1, min(chunk_size, n))
  tiles = -(-n // c)
  pad = tiles * c - n
  h = jnp.pad(h.reshape(n, D), ((0, pad), (0, 0))).reshape(tiles, c, D)
  thr = jnp.pad(jnp.asarray(threshold, jnp.float32).reshape(n), (0, pad)).reshape(tiles, c)
  w = jax.lax.stop_gradient(unembed)

  def one_tile(args):
    h_c, thr_c = args
    logits = jnp.einsum("cd,dv->cv", h_c, w.astype(h_c.dtype), preferred_element_type=jnp.float32)
    z = logits / temperature
    z = jnp.where(z >= thr_c[:, None], z, NEG)  # the strategy's truncation
    values, ids = jax.lax.top_k(z, k)
    logp = values - jax.nn.logsumexp(z, axis=-1, keepdims=True)
    model = jnp.take_along_axis(logits, ids, -1) - jax.nn.logsumexp(logits, -1, keepdims=True)
    return ids, logp, model

  out = jax.lax.map(one_tile, (jax.lax.stop_gradient(h), thr))
  return tuple(a.reshape(tiles * c, k)[:n].reshape(B, T, k) for a in out)


# ---------------------------------------------------------------------------- the round
@dataclasses.dataclass
class Lookahead:
  """One LATR round (``lookahead``): the round's prompt texts, the rollout of its P * G rows
  (device arrays, group ordered), its metrics, and per row (host arrays [B]): ``kind`` (ROOT,
  BRANCH or FILL), ``root`` (a branch's root row in this rollout, else -1), ``position`` (its t),
  ``token`` (its c), ``window`` (its |w_b|), ``slot_id`` (the prompt id of a branch's or fill's
  slot in the window and continuation calls, -1 for roots); the keys of the two calls; and every
  branch run ahead, pruned or not, as ``branches``: (its root's row, t, c, its window's tokens,
  whether it was pruned)."""

  texts: list
  rollout: Rollout
  metrics: dict
  kind: np.ndarray
  root: np.ndarray
  position: np.ndarray
  token: np.ndarray
  window: np.ndarray
  slot_id: np.ndarray
  window_key: jax.Array
  continue_key: jax.Array
  branches: list


def sample_lookahead(collector, params, records, *, key):
  """``Collector._round``'s sampler when ``latr.enabled``: (this process's prompt texts, the
  rollout of every row, metrics); see the module docstring."""
  out = lookahead(collector, params, records, key=key)
  return out.texts, out.rollout, out.metrics


def num_roots(config) -> int:
  """R: ``latr.num_roots``, or G // 2 when it is 0."""
  return int(config.latr.num_roots) or config.sampling.num_samples // 2


def lookahead(collector, params, records, *, key) -> Lookahead:
  """The LATR round of ``records`` (module docstring); ``params`` in the sampling layout."""
  c, o, s = collector.c, collector.c.latr, collector.c.sampling
  if collector.layout.process_count > 1:
    raise NotImplementedError("latr.enabled (LATR) runs on one process; this run has several")
  if "greedy_rewards" in collector.estimator.reads:
    raise ValueError("latr.enabled (LATR) samples no greedy row: the estimator reads one")
  G, R, T = s.num_samples, num_roots(c), s.max_new_tokens
  Bp, W = G - R, min(int(o.window), T)
  pad, stops = collector.pad_id, set(collector.tokenizer.eos_ids)
  texts, ids, mask = collector.prompts(records)
  prompt_ids = np.asarray([r["index"] for r in records], np.int32)
  ids, mask, prompt_ids = collector.layout.gather_prompts(ids, mask, prompt_ids, pad_id=pad)
  P = ids.shape[0]
  roots = jax.device_get(collector._generate(params, ids, mask, prompt_ids, key, None, R))
  truncates = roots.sampler_threshold is not None
  thr = roots.sampler_threshold if truncates else np.full(roots.tokens.shape, NEG, np.float32)
  tokens, positions = step_lib.sequence_inputs(roots.prompt_tokens, roots.prompt_mask, roots.tokens)
  group = R if c.rl.share_prompts and R > 1 else 1
  top_ids, top_logp, top_model = jax.device_get(top_candidates(
    params, tokens, positions, jnp.asarray(thr), num_completion=T,
    model_config=collector.model_config, k=int(o.max_per_token) + 1,
    temperature=float(s.temperature), chunk_size=c.rl.logprob_chunk, prompt_group=group,
  ))  # fmt: skip
  # Slots: (prompt, j) -> (root row in `roots`, t, c, log p_t(c), model log-prob) or None.
  slots = []
  for p in range(P):
    rows = slice(p * R, (p + 1) * R)
    found = branch_points(
      top_ids[rows], top_logp[rows], roots.tokens[rows], roots.completion_mask[rows],
      budget=Bp, min_prob=o.min_prob, max_gap=o.max_gap, max_per_token=int(o.max_per_token),
    )  # fmt: skip
    for r, t, tok, i in found:
      b = p * R + r
      slots.append((b, t, tok, float(top_logp[b, t, i]), float(top_model[b, t, i])))
    slots += [None] * (Bp - len(found))
  slot_ids = np.asarray([prompt_ids[n // Bp] * Bp + n % Bp for n in range(P * Bp)], np.int32)
  prompt_seq = [roots.prompt_tokens[p * R][roots.prompt_mask[p * R]] for p in range(P)]
  prefix = lambda n, b, t, tok: np.concatenate([prompt_seq[n // Bp], roots.tokens[b, :t], [tok]])

  # The lookahead call: every branch's window (a 1-token dummy for the other slots).
  seqs, budget_w = [], np.zeros(P * Bp, np.int32)
  for n, slot in enumerate(slots):
    if slot is None:
      seqs.append(prompt_seq[n // Bp])
      continue
    b, t, tok = slot[:3]
    seqs.append(prefix(n, b, t, tok))
    budget_w[n] = 0 if tok in stops else min(W, T - t - 1)
  window_key = jax.random.fold_in(key, 1)
  w = _call(collector, params, seqs, slot_ids, window_key, W, np.maximum(budget_w, 1))
  n_w = np.minimum(w.lengths, budget_w)
  win_done = (budget_w > 0) & w.finished

  # Pruning, then the continuation call: survivors to their end, fills from the prompt.
  seqs, budget_c = [], np.zeros(P * Bp, np.int32)
  alive = np.zeros(P * Bp, bool)
  branches = []
  for n, slot in enumerate(slots):
    if slot is not None:
      b, t, tok = slot[:3]
      end = min(t + 1 + W, int(roots.lengths[b]))
      window = w.tokens[n, : n_w[n]]
      prune = too_similar(
        [v for v in window.tolist() if v not in stops],
        [v for v in roots.tokens[b, t + 1 : end].tolist() if v not in stops],
        rouge_threshold=o.rouge_threshold, suffix_threshold=o.suffix_threshold,
      )  # fmt: skip
      branches.append(((n // Bp) * G + b % R, t, tok, tuple(window.tolist()), prune))
      if not prune:
        alive[n] = True
        ended = tok in stops or win_done[n]
        budget_c[n] = 0 if ended else T - t - 1 - n_w[n]
        seqs.append(np.concatenate([prefix(n, b, t, tok), window]))
        continue
    seqs.append(prompt_seq[n // Bp])  # a fill
    budget_c[n] = T
  continue_key = jax.random.fold_in(key, 2)
  cont = _call(collector, params, seqs, slot_ids, continue_key, T, np.maximum(budget_c, 1))
  n_c = np.minimum(cont.lengths, budget_c)

  # Assembly: per prompt, its roots, its surviving branches, its fills.
  B = P * G
  out = dict(
    tokens=np.full((B, T), pad, np.int32), sampler_logp=np.zeros((B, T), np.float32),
    model_logp=np.zeros((B, T), np.float32), threshold=np.zeros((B, T), np.float32),
    mask=np.zeros((B, T), bool),
  )  # fmt: skip
  finished = np.zeros(B, bool)
  info = {k: np.full(B, -1, np.int32) for k in ("root", "position", "token", "window", "slot_id")}
  kind = np.full(B, FILL, np.int8)
  src = dict(
    tokens="tokens", sampler_logp="sampler_logp", model_logp="model_logp",
    threshold="sampler_threshold", mask="completion_mask",
  )  # fmt: skip

  def put(row, start, rollout, i, count):
    for name, field in src.items():
      if name == "threshold" and not truncates:
        continue
      out[name][row, start : start + count] = getattr(rollout, field)[i, :count]

  for p in range(P):
    for r in range(R):
      put(p * G + r, 0, roots, p * R + r, T)
      finished[p * G + r] = roots.finished[p * R + r]
      kind[p * G + r] = ROOT
    order = [n for n in range(p * Bp, (p + 1) * Bp) if alive[n]]
    order += [n for n in range(p * Bp, (p + 1) * Bp) if not alive[n]]
    for j, n in enumerate(order):
      row = p * G + R + j
      info["slot_id"][row] = slot_ids[n]
      if not alive[n]:
        put(row, 0, cont, n, int(n_c[n]))
        finished[row] = cont.finished[n]
        continue
      b, t, tok, logp, model_logp = slots[n]
      put(row, 0, roots, b, t)
      out["tokens"][row, t], out["sampler_logp"][row, t] = tok, logp
      out["model_logp"][row, t], out["mask"][row, t] = model_logp, True
      if truncates:
        out["threshold"][row, t] = roots.sampler_threshold[b, t]
      put(row, t + 1, w, n, int(n_w[n]))
      put(row, t + 1 + n_w[n], cont, n, int(n_c[n]))
      finished[row] = tok in stops or win_done[n] or (budget_c[n] > 0 and cont.finished[n])
      kind[row] = BRANCH
      root_row = p * G + (b - p * R)
      info["root"][row], info["position"][row], info["token"][row] = root_row, t, tok
      info["window"][row] = n_w[n]
  mask_out = out["mask"]
  rollout = Rollout(
    prompt_tokens=np.repeat(roots.prompt_tokens[::R], G, axis=0),
    prompt_mask=np.repeat(roots.prompt_mask[::R], G, axis=0),
    tokens=out["tokens"],
    sampler_logp=out["sampler_logp"],
    model_logp=out["model_logp"],
    completion_mask=mask_out,
    lengths=mask_out.sum(1, dtype=np.int32),
    finished=finished,
    truncated=~finished,
    prompt_ids=np.repeat(prompt_ids, G).astype(np.int32),
    sample_ids=np.tile(np.arange(G, dtype=np.int32), P),
    sampler_threshold=out["threshold"] if truncates else None,
  )
  sampled = roots.completion_mask.sum() + n_w.sum() + n_c.sum()
  metrics = {
    "latr/branch_points": float(len(branches)),
    "latr/pruned": float(sum(b[-1] for b in branches)),
    "latr/filled": float(P * Bp - alive.sum()),
    "latr/sampled_tokens": float(sampled),
  }
  return Lookahead(
    texts=texts, rollout=jax.tree.map(jnp.asarray, rollout), metrics=metrics, kind=kind,
    window_key=window_key, continue_key=continue_key, branches=branches, **info,
  )  # fmt: skip


def _call(collector, params, seqs, slot_ids, key, max_new_tokens: int, budgets) -> Rollout:
  """One sample of each sequence of ``seqs`` (a prompt of its own, id ``slot_ids``) with the
  configured engine and strategy, at most ``budgets`` [n] tokens each; host arrays."""
  ids, mask = sampling.continuous.left_pad_sequences(seqs, pad_id=collector.pad_id)
  return jax.device_get(collector._generate(
    params, ids, mask, slot_ids, key, None, 1, max_new_tokens=max_new_tokens,
    max_lengths=budgets, buckets=sampling.DEFAULT_BUCKETS,
  ))  # fmt: skip
