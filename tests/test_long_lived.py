"""A process that builds many train steps stays flat: its memory mappings (which the kernel limits;
XLA:CPU maps each executable in pieces) and RSS stop growing once the first configurations are
compiled, because a step gives back the programs it compiled when it is dropped
(rlvr_jax.compilation).

The measurement runs in a fresh process (tools/bench_lifecycle.py, whose curves over 120
configurations and 100 runs are in docs/benchmarks.md), so what other tests compiled does not
count. Many runs through ``rlvr_jax.api.run`` in one process: tests/test_notebook.py (the
notebook's grid of 24 runs, its kernel's size after each)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "tools"))
import harness  # noqa: E402

TOOL = "tools/bench_lifecycle.py"
pytestmark = [
  pytest.mark.slow,
  pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="counts /proc/self/maps"),
]


def _growth(curve, start_item):
  """Mappings and RSS (MB) added from the point ``start_item`` to the end of the curve."""
  start = next(p for p in curve if p["item"] == start_item)
  return curve[-1]["maps"] - start["maps"], curve[-1]["rss_mb"] - start["rss_mb"]


def test_many_step_configurations_stay_flat():
  """20 train-step configurations, none sharing a program, each run once and dropped: after the
  first 10, the count of mappings is flat (a step that kept its programs added ~400 each: the
  process died after ~70-160 configurations at the kernel's limit of 65,530)."""
  result = harness.run_child(harness.Child(f"{TOOL}:many_steps", {"count": 20}), timeout=1500)
  maps, rss = _growth(result["curve"], 10)
  assert maps < 300, result["curve"]  # 10 more configurations kept would be ~4,000
  assert rss < 150, result["curve"]
