"""Code execution reward with partial credit over unit tests (METHODS.md §5.10).

Per-row field ``tests``: either a list of ``assert`` snippets (``"assert add(1, 2) == 3"``: the
program runs once in one sandbox process, which returns the values of the program-dependent parts,
``add(1, 2)``; the asserts are decided outside the sandbox, see ``code_verdict``) or a list of ``{"input": str, "output": str}`` dicts (the
program runs once per test on that stdin, its stdout compared after stripping trailing
whitespace). Optional per-row field ``test_weights`` (one non-negative weight per test).

Weighting:
  ``equal``: R_i = sum_j w_j P_ij / sum_j w_j, with w_j = 1 unless ``test_weights`` is given.
  ``verpo``: group-aware (arXiv 2601.03525, formula of METHODS.md §5.10, a placeholder there):
     rho_j = mean_i P_ij over the group's non-failed rows,
     w_j = (1 - rho_j + eps_w) / sum_j' (1 - rho_j' + eps_w),  d_i = sum_j w_j P_ij,
     R_i = 1[all tests pass] + lambda * d_i.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from rlvr_jax.rewards import protocol
from rlvr_jax.rewards.code_sandbox import SandboxLimits, check_sandbox, run_python
from rlvr_jax.rewards.math_reward import _as_text

_FENCE_RE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(completion: str) -> str:
  """The last fenced code block of the completion, or the whole completion if there is none."""
  blocks = _FENCE_RE.findall(completion)
  return blocks[-1] if blocks else completion


def _same_output(actual: str, expected: str) -> bool:
  def norm(s: str) -> list[str]:
    return [line.rstrip() for line in s.strip().splitlines()]

  return norm(actual) == norm(expected)


def run_tests(
  code: str,
  tests: list,
  *,
  limits: SandboxLimits,
  per_test_s: float,
  allow_weak_sandbox: bool = False,
) -> list[bool]:
  """One pass/fail verdict per test (see module docstring for the two test formats)."""
  if not tests:
    raise ValueError("a code problem needs at least one test")
  weak = {"allow_weak_sandbox": allow_weak_sandbox}
  if all(isinstance(t, str) for t in tests):
    result = run_python(code, tests=list(tests), per_test_s=per_test_s, limits=limits, **weak)
    return list(result.test_passed)
  if all(isinstance(t, dict) and "input" in t and "output" in t for t in tests):
    verdicts = []
    for test in tests:
      # Inside a reward worker each run is cut to what is left of the item's budget, so a slow
      # program fails its remaining tests instead of getting the whole item killed.
      result = run_python(code, stdin=str(test["input"]), limits=limits, **weak)
      verdicts.append(result.status == "ok" and _same_output(result.stdout, str(test["output"])))
    return verdicts
  raise ValueError("tests must be all assert snippets (str) or all {'input', 'output'} dicts")


def verpo_rewards(
  passed: np.ndarray, *, group_size: int, lam: float = 0.5, eps_w: float = 1e-3
) -> np.ndarray:
  """VeRPO-style rewards from a pass matrix [B, K] in {0, 1} (NaN rows = failed items).

  Returns [B] float32 (NaN for failed rows); see the module docstring for the formula.
  """
  passed = np.asarray(passed, dtype=np.float64)
  if passed.ndim != 2 or passed.shape[0] % group_size:
    raise ValueError(f"pass matrix {passed.shape} must be [B, K] with B a multiple of {group_size}")
  num_tests = passed.shape[1]
  grouped = passed.reshape(-1, group_size, num_tests)
  valid = ~np.isnan(grouped[..., :1])  # [P, G, 1]
  count = np.maximum(valid.sum(1, keepdims=True), 1)
  rho = np.where(valid, grouped, 0.0).sum(1, keepdims=True) / count  # [P, 1, K]
  weights = (1.0 - rho + eps_w) / (1.0 - rho + eps_w).sum(-1, keepdims=True)
  dense = (weights * grouped).sum(-1)
  outcome = (grouped > 0.5).all(-1)
  rewards = np.where(valid[..., 0], outcome + lam * dense, np.nan)
  return rewards.reshape(-1).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class CodeReward(protocol.ItemReward):
  """Partial-credit code reward.

  Per-item time is at most ``len(tests) * limits.timeout_s`` (stdio tests) or ``limits.timeout_s``
  (assert tests), and never more than the runtime's item ``timeout_s``: inside a reward worker
  the sandbox's limits are cut to what is left of the item's budget (tests that do not fit fail).
  ``allow_weak_sandbox``: run code even where ``sandbox_capabilities()`` reports missing
  protections (a warning is logged); by default such a host raises ``WeakSandboxError``.
  """

  limits: SandboxLimits = SandboxLimits()
  per_test_s: float = 2.0
  weighting: str = "equal"
  lam: float = 0.5
  eps_w: float = 1e-3
  allow_weak_sandbox: bool = False
  name: str = "code"

  def __post_init__(self):
    if self.weighting not in ("equal", "verpo"):
      raise ValueError(f"weighting must be 'equal' or 'verpo', got {self.weighting!r}")
    check_sandbox(self.allow_weak_sandbox)  # fail at construction, not on every item

  def warmup(self) -> None:
    """Probes the sandbox (one sandboxed process) before the worker's first item."""
    check_sandbox(self.allow_weak_sandbox)

  def score_item(self, prompt: str, completion: str, *, tests=None, **_: Any) -> dict:
    if tests is None:
      raise ValueError("CodeReward needs the example field tests= (a list of tests per row)")
    code = extract_code(_as_text(completion))
    passed = run_tests(
      code,
      list(tests),
      limits=self.limits,
      per_test_s=self.per_test_s,
      allow_weak_sandbox=self.allow_weak_sandbox,
    )
    return {"passed": [float(p) for p in passed]}

  def combine(self, scores, **fields: Any) -> protocol.RewardOutput:
    num_rows = len(scores)
    widths = {len(s["passed"]) for s in scores if s is not None}
    correct = np.array(
      [np.nan if s is None else float(all(s["passed"])) for s in scores], dtype=np.float32
    )
    pass_frac = np.array(
      [np.nan if s is None else float(np.mean(s["passed"])) for s in scores], dtype=np.float32
    )
    if self.weighting == "verpo":
      group_size = protocol.require_group_size(fields, num_rows, "CodeReward(weighting='verpo')")
      if len(widths) > 1:
        raise ValueError(f"verpo weighting needs the same number of tests per row, got {widths}")
      width = widths.pop() if widths else 1
      matrix = np.full((num_rows, width), np.nan)
      for b, s in enumerate(scores):
        if s is not None:
          matrix[b] = s["passed"]
      rewards = verpo_rewards(matrix, group_size=group_size, lam=self.lam, eps_w=self.eps_w)
    else:
      weights = fields.get("test_weights")
      rewards = np.full(num_rows, np.nan, dtype=np.float32)
      for b, s in enumerate(scores):
        if s is None:
          continue
        w = np.ones(len(s["passed"])) if weights is None else np.asarray(weights[b], np.float64)
        if w.shape != (len(s["passed"]),) or np.any(w < 0) or w.sum() <= 0:
          raise ValueError(f"row {b}: test_weights {w.tolist()} must be >= 0, one per test")
        rewards[b] = float(np.dot(w, s["passed"]) / w.sum())
    info = {"correct": correct, "pass_frac": pass_frac}
    return protocol.RewardOutput(rewards=rewards, info=info)
