"""LATR's lookahead round (``train/lookahead_round.py``, ``latr.enabled``): the window similarity
measures and the branch point rule on hand-made inputs, then one tiny trainer: the rows of a group,
their parity with the static sampler and the trainer's log-probs, pruning and fills, and a
collected GRPO batch."""

import contextlib

import jax
import numpy as np
import pytest

from rlvr_jax import sampling
from rlvr_jax.train import config as config_lib
from rlvr_jax.train import lookahead_round as latr
from rlvr_jax.train import step as step_lib
from rlvr_jax.train.loop import Trainer

REWARD = dict(name=f"{__name__}:digit_share")  # importable in the reward workers (tests/ on path)
# Loose branching (an untrained model spreads its mass over the ~17 ids) and no pruning.
LATR = dict(
  enabled=True, num_roots=2, min_prob=0.02, max_gap=1.0, max_per_token=2, window=3,
  rouge_threshold=1.0, suffix_threshold=1.0,
)  # fmt: skip
P, G, R, T = 2, 6, 2, 8


def digit_share(prompts, completions, **fields):
  """The share of digits in a completion: a reward that varies for the untrained tiny model."""
  return np.array([sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions], np.float32)


# ---------------------------------------------------------------------------- pure
def test_lcs_rouge_and_suffix_goldens():
  assert latr.lcs_length("ABCBDAB", "BDCABA") == 4  # BCBA (CLRS)
  assert latr.lcs_length([1, 2, 3], []) == 0 and latr.lcs_length([], []) == 0
  assert latr.lcs_length([5, 5, 5], [5, 5]) == 2
  assert latr.lcs_length([1, 2, 3, 4], [4, 3, 2, 1]) == 1
  # F1 = 2 LCS / (|a| + |b|): LCS([1,2,3,4], [1,3,5]) = 2 -> 4 / 7.
  assert latr.rouge_l_f1([1, 2, 3, 4], [1, 3, 5]) == pytest.approx(4 / 7)
  assert latr.rouge_l_f1([1, 2], [1, 2]) == 1.0 and latr.rouge_l_f1([], []) == 0.0
  assert latr.rouge_l_f1([1, 2], [3, 4]) == 0.0 and latr.rouge_l_f1([1], []) == 0.0
  # Suffix match: the common suffix over the longer window.
  assert latr.suffix_match([9, 1, 2, 3], [7, 2, 3]) == pytest.approx(2 / 4)
  assert latr.suffix_match([1, 2, 3], [1, 2, 4]) == 0.0
  assert latr.suffix_match([2, 3], [2, 3]) == 1.0 and latr.suffix_match([], []) == 0.0
  assert latr.suffix_match([3], [1, 2, 3]) == pytest.approx(1 / 3)
  kw = dict(rouge_threshold=0.5, suffix_threshold=0.4)
  assert latr.too_similar([1, 2, 3], [1, 2, 4], **kw)  # F1 2/3
  assert latr.too_similar([1, 5, 6, 3], [7, 8, 3], **kw) is False  # F1 2/7, suffix 1/4
  assert latr.too_similar([1, 5, 6, 3], [8, 6, 3], **kw)  # F1 4/7
  assert latr.too_similar([9, 8, 2, 3], [1, 7, 2, 3], rouge_threshold=0.9, suffix_threshold=0.4)


def test_branch_points_rule():
  """p(c) > min_prob, p_top - p(c) < max_gap, c != y_t, inside the root, at most max_per_token per
  (root, t), earliest t first (then root, then probability), at most the budget."""
  probs = np.array(
    [  # root 0: candidates (token, p) at t = 0, 1, 2
      [[(1, 0.5), (2, 0.3), (3, 0.15)], [(4, 0.9), (5, 0.05), (6, 0.05)],
       [(7, 0.4), (8, 0.35), (9, 0.2)]],
      # root 1
      [[(1, 0.4), (2, 0.4), (3, 0.2)], [(4, 0.35), (5, 0.3), (6, 0.3)], [(7, 0.6), (8, 0.3),
                                                                          (9, 0.1)]],
    ]
  )  # fmt: skip
  ids = probs[..., 0].astype(np.int32)
  logp = np.log(probs[..., 1])
  sampled = np.array([[1, 4, 8], [2, 6, 7]])
  mask = np.array([[True, True, True], [True, True, False]])  # root 1 ends after t = 1
  kw = dict(min_prob=0.1, max_gap=0.3, max_per_token=2)
  got = [(r, t, c) for r, t, c, _ in latr.branch_points(ids, logp, sampled, mask, budget=99, **kw)]
  # t=0 r0: 2 (gap .2) ok, 3 (gap .35) no. r1: 1 ok (tie), 3 (gap .2) ok.
  # t=1 r0: 5, 6 below min_prob. r1: 4, 5 (6 sampled). t=2 r0: 7 (9: gap .2, p .2) and 9; r1 ended.
  assert got == [(0, 0, 2), (1, 0, 1), (1, 0, 3), (1, 1, 4), (1, 1, 5), (0, 2, 7), (0, 2, 9)]
  one = latr.branch_points(ids, logp, sampled, mask, budget=99, **dict(kw, max_per_token=1))
  assert [(r, t, c) for r, t, c, _ in one] == [(0, 0, 2), (1, 0, 1), (1, 1, 4), (0, 2, 7)]
  three = latr.branch_points(ids, logp, sampled, mask, budget=3, **kw)
  assert [(r, t, c) for r, t, c, _ in three] == got[:3]
  # The index i points at c in the (unsorted) candidate table.
  shuffled = latr.branch_points(ids[..., ::-1], logp[..., ::-1], sampled, mask, budget=99, **kw)
  assert [(r, t, c) for r, t, c, _ in shuffled] == got
  assert all(ids[r, t, ::-1][i] == c for r, t, c, i in shuffled)
  assert latr.branch_points(ids, logp, sampled, mask, budget=0, **kw) == []
  assert latr.branch_points(ids, logp, sampled, mask, budget=9, **dict(kw, min_prob=0.95)) == []


# ---------------------------------------------------------------------------- trainer level
@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
  c = config_lib.tiny_config(
    tmp_path_factory.mktemp("latr"), rl=dict(prompts_per_step=P), latr=LATR, reward=REWARD,
    sampling=dict(num_samples=G, max_new_tokens=T, temperature=1.5),
  )  # fmt: skip
  trainer = Trainer(c, log=lambda s: None)
  trainer.restore_or_start()
  yield trainer
  trainer.close()


@contextlib.contextmanager
def _latr(trainer, **overrides):
  o = trainer.collector.c.latr
  saved = {k: o[k] for k in overrides}
  o.update(overrides)
  try:
    yield
  finally:
    o.update(saved)


@pytest.fixture(scope="module")
def round_(trainer):
  col = trainer.collector
  records = col.source.take(P)
  out = latr.lookahead(col, trainer.state.params, records, key=jax.random.key(3))
  return records, out, jax.tree.map(np.asarray, out.rollout)


def test_group_rows_roots_branches_fills(trainer, round_):
  records, out, r = round_
  col, params = trainer.collector, trainer.state.params
  assert r.tokens.shape == (P * G, T) and r.prompt_tokens.shape[0] == P * G
  kinds = out.kind.reshape(P, G)
  assert (kinds[:, :R] == latr.ROOT).all()
  assert (np.diff(kinds[:, R:], axis=1) >= 0).all()  # branches, then fills
  assert (kinds[:, R:] == latr.BRANCH).sum() == out.metrics["latr/branch_points"] > 0
  assert out.metrics["latr/pruned"] == 0
  assert out.metrics["latr/filled"] == (kinds == latr.FILL).sum()
  np.testing.assert_array_equal(r.prompt_ids, np.repeat([rec["index"] for rec in records], G))
  np.testing.assert_array_equal(r.sample_ids, np.tile(np.arange(G), P))
  for p in range(P):  # a group's rows share its prompt
    rows = slice(p * G, (p + 1) * G)
    assert (r.prompt_tokens[rows] == r.prompt_tokens[p * G]).all()
  # The roots are the first R rows of the plain round with the same key.
  _, plain = col._sample_local(params, records, key=jax.random.key(3))
  plain = jax.tree.map(np.asarray, plain)
  roots = np.flatnonzero(out.kind == latr.ROOT)
  np.testing.assert_array_equal(r.tokens[roots], plain.tokens[roots])
  np.testing.assert_array_equal(r.sampler_logp[roots], plain.sampler_logp[roots])
  last_t = {}
  for b in np.flatnonzero(out.kind == latr.BRANCH):
    root, t, c = out.root[b], out.position[b], out.token[b]
    assert out.kind[root] == latr.ROOT and root // G == b // G and r.completion_mask[root, t]
    np.testing.assert_array_equal(r.tokens[b, :t], r.tokens[root, :t])
    np.testing.assert_array_equal(r.sampler_logp[b, :t], r.sampler_logp[root, :t])
    assert r.tokens[b, t] == c != r.tokens[root, t]
    assert np.exp(r.sampler_logp[b, t]) > LATR["min_prob"]
    assert t >= last_t.get(b // G, 0)  # earliest first
    last_t[b // G] = t
    assert (
      r.completion_mask[b, : r.lengths[b]].all() and not r.completion_mask[b, r.lengths[b] :].any()
    )
  # Sampled: every row's tokens but the branches' copied prefixes and forced tokens (no pruning).
  forced = out.position[out.kind == latr.BRANCH] + 1
  assert out.metrics["latr/sampled_tokens"] == r.completion_mask.sum() - forced.sum()


def _generate(col, params, prefix, key, slot_id, max_new_tokens, budget):
  ids = np.asarray(prefix, np.int32)[None]
  return jax.tree.map(np.asarray, sampling.generate(
    params, ids, np.ones(ids.shape, bool), config=col.model_config, num_samples=1,
    strategy=col.strategy, key=key, max_new_tokens=max_new_tokens,
    stop_tokens=tuple(col.tokenizer.eos_ids), prompt_ids=np.array([slot_id], np.int32),
    pad_id=col.pad_id, max_lengths=np.array([budget]),
  ))  # fmt: skip


def test_windows_and_continuations_equal_the_static_sampler(trainer, round_):
  _, out, r = round_
  col, params = trainer.collector, trainer.state.params
  stops, W = set(col.tokenizer.eos_ids), LATR["window"]
  checked = 0
  for b in np.flatnonzero(out.kind == latr.BRANCH):
    t, n_w, n = out.position[b], out.window[b], r.lengths[b]
    prefix = np.concatenate([r.prompt_tokens[b][r.prompt_mask[b]], r.tokens[b, : t + 1]])
    if r.tokens[b, t] in stops or t + 1 >= T:
      assert n_w == 0 and n == t + 1
      continue
    w = _generate(col, params, prefix, out.window_key, out.slot_id[b], W, min(W, T - t - 1))
    assert w.lengths[0] == n_w
    window = slice(t + 1, t + 1 + n_w)
    np.testing.assert_array_equal(r.tokens[b, window], w.tokens[0, :n_w])
    np.testing.assert_allclose(r.sampler_logp[b, window], w.sampler_logp[0, :n_w], atol=1e-5)
    if w.finished[0] or t + 1 + n_w >= T:
      assert n == t + 1 + n_w
      continue
    prefix = np.concatenate([prefix, w.tokens[0, :n_w]])
    cont = _generate(col, params, prefix, out.continue_key, out.slot_id[b], T, T - t - 1 - n_w)
    rest = slice(t + 1 + n_w, n)
    assert n - (t + 1 + n_w) == cont.lengths[0]
    np.testing.assert_array_equal(r.tokens[b, rest], cont.tokens[0, : cont.lengths[0]])
    np.testing.assert_allclose(r.sampler_logp[b, rest], cont.sampler_logp[0, : cont.lengths[0]],
                               atol=1e-5)  # fmt: skip
    assert r.finished[b] == cont.finished[0]
    checked += 1
  assert checked > 0


def test_sampler_logprobs_equal_the_trainers(trainer, round_):
  """Every row's sampler log-probs (the forced tokens' included) equal the trainer's recomputed
  log-probs within 1e-5; so do the model log-probs (one full pass, tau = 1)."""
  _, out, r = round_
  col, params = trainer.collector, trainer.state.params
  tokens, positions = step_lib.sequence_inputs(r.prompt_tokens, r.prompt_mask, r.tokens)
  logp, _ = col.score_fn(params, tokens, positions, T)
  logp, mask = np.asarray(logp), r.completion_mask
  np.testing.assert_allclose(logp[mask], r.sampler_logp[mask], atol=1e-5)
  branches = np.flatnonzero(out.kind == latr.BRANCH)
  forced = logp[branches, out.position[branches]]
  np.testing.assert_allclose(forced, r.sampler_logp[branches, out.position[branches]], atol=1e-5)
  gap = sampling.logprob_parity(params, out.rollout, config=col.model_config, strategy=col.strategy)
  assert float(gap["model_logp_gap/max"]) <= 1e-5 and float(gap["sampler_logp_gap/max"]) <= 1e-5


def test_pruned_and_missing_branches_are_filled(trainer, monkeypatch):
  col, params = trainer.collector, trainer.state.params
  records = col.source.take(P)
  W = LATR["window"]
  # rouge_threshold 0: a branch is pruned iff its window shares a token with its root's (stop
  # tokens left out: two windows that both end are not alike for that).
  with _latr(trainer, rouge_threshold=0.0):
    out = latr.lookahead(col, params, records, key=jax.random.key(5))
  m, r = out.metrics, jax.tree.map(np.asarray, out.rollout)
  assert m["latr/branch_points"] == len(out.branches) == P * (G - R)
  content = lambda seq: [v for v in seq if v not in col.tokenizer.eos_ids]  # noqa: E731
  for root, t, _, window, pruned in out.branches:
    sibling = r.tokens[root, t + 1 : min(t + 1 + W, r.lengths[root])].tolist()
    assert pruned == (latr.lcs_length(content(window), content(sibling)) > 0)
  assert 0 < m["latr/pruned"] == sum(b[-1] for b in out.branches)
  assert m["latr/filled"] == (out.kind == latr.FILL).sum() == m["latr/pruned"]
  survivors = [(root, t, c) for root, t, c, _, pruned in out.branches if not pruned]
  rows = np.flatnonzero(out.kind == latr.BRANCH)
  assert survivors == list(zip(out.root[rows], out.position[rows], out.token[rows], strict=True))
  # Every branch pruned: every slot is filled with an ordinary sample from the prompt.
  with monkeypatch.context() as mp:
    mp.setattr(latr, "too_similar", lambda *a, **k: True)
    out = latr.lookahead(col, params, records, key=jax.random.key(5))
  m, r = out.metrics, jax.tree.map(np.asarray, out.rollout)
  assert m["latr/pruned"] == m["latr/branch_points"] == m["latr/filled"] == P * (G - R)
  assert (out.kind.reshape(P, G)[:, R:] == latr.FILL).all()
  fills = np.flatnonzero(out.kind == latr.FILL)
  assert (out.slot_id[fills] >= 0).all() and (r.lengths[fills] >= 1).all()
  b = fills[0]  # drawn in the continuation call (its key, its slot's prompt id)
  fill = _generate(col, params, r.prompt_tokens[b][r.prompt_mask[b]], out.continue_key,
                   out.slot_id[b], T, T)  # fmt: skip
  np.testing.assert_array_equal(r.tokens[b], fill.tokens[0])
  np.testing.assert_allclose(r.sampler_logp[b], fill.sampler_logp[0], atol=1e-5)
  windows = sum(len(w) for _, _, _, w, _ in out.branches)  # pruned windows count
  assert m["latr/sampled_tokens"] == r.completion_mask.sum() + windows
  # No branch point (min_prob above every probability): every slot is a fill, nothing pruned.
  with _latr(trainer, min_prob=0.99):
    out = latr.lookahead(col, params, records, key=jax.random.key(5))
  assert out.metrics["latr/branch_points"] == out.metrics["latr/pruned"] == 0
  assert out.metrics["latr/filled"] == P * (G - R)
  assert (out.kind.reshape(P, G)[:, R:] == latr.FILL).all()


def test_collect_with_latr_gives_a_grpo_batch(trainer):
  assert trainer.c.rl.advantage == "grpo"
  batch, _ = trainer.collector.collect(trainer.state.params, key=jax.random.key(4))
  assert batch.tokens.shape == batch.completion_mask.shape == batch.sampler_logp.shape == (P * G, T)
  assert batch.rewards.shape == (P, G) and batch.advantages.shape == (P * G,)
  assert np.isfinite(batch.advantages).all()
  m = batch.metrics
  assert m["latr/branch_points"] > 0
  assert (
    m["rollout/sampled_tokens"]
    == m["latr/sampled_tokens"]
    >= batch.lengths.sum() - (m["latr/branch_points"] * T)
  )


def test_config_validation(tmp_path):
  ok = dict(reward=REWARD, sampling=dict(num_samples=4))
  for bad, field in [
    (dict(num_roots=4), "latr.num_roots"), (dict(min_prob=1.0), "latr.min_prob"),
    (dict(max_gap=0.0), "latr.max_gap"), (dict(max_per_token=0), "latr.max_per_token"),
    (dict(window=0), "latr.window"), (dict(rouge_threshold=1.5), "latr.rouge_threshold"),
    (dict(suffix_threshold=-0.1), "latr.suffix_threshold"),
  ]:  # fmt: skip
    with pytest.raises(config_lib.ConfigError, match=field):
      config_lib.validate(config_lib.tiny_config(tmp_path, latr=bad, **ok))
  with pytest.raises(config_lib.ConfigError, match="latr.enabled"):
    config_lib.validate(
      config_lib.tiny_config(tmp_path, latr=dict(enabled=True), rl=dict(advantage="remax"), **ok)
    )
  config_lib.validate(config_lib.tiny_config(tmp_path, latr=dict(enabled=True), **ok))
