"""tools/bench_revisions.py: variant parsing, and one alternated round on the tiny model."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
try:
  import bench_revisions
finally:
  sys.path.pop(0)


def test_variant_is_a_revision_and_an_optional_token_tile():
  assert bench_revisions.parse_variant("HEAD~1") == ("HEAD~1", bench_revisions.DEFAULT_CHUNK)
  assert bench_revisions.parse_variant("WORKTREE@512") == ("WORKTREE", 512)
  with pytest.raises(ValueError, match="after @ must be a token count"):
    bench_revisions.parse_variant("HEAD@big")
  with pytest.raises(ValueError, match="no revision"):
    bench_revisions.parse_variant("@32")


def test_one_round_on_the_tiny_model_prints_a_row_per_variant():
  out = subprocess.run(
    [sys.executable, os.path.join(REPO, "tools", "bench_revisions.py"), "--model", "tiny",
     "--rounds", "1", "--calls", "1", "WORKTREE@8"],
    capture_output=True, text=True, check=True, timeout=300,
  )  # fmt: skip
  rows = [line for line in out.stdout.splitlines() if line.startswith("| WORKTREE")]
  assert [r.split(" | ")[0] for r in rows] == ["| WORKTREE@8"]
  assert float(rows[0].split(" | ")[1]) > 0  # a median call time
  assert rows[0].endswith("| 1.000 |")  # the first variant against itself
