"""The progress bar's rate (and ETA) leaves out the first, compiling step."""

import io

from rlvr_jax.metrics import ProgressBar


def test_eta_counts_only_the_steps_after_compilation():
  bar = ProgressBar(10, enabled=True, file=io.StringIO())
  clock = [100.0]
  bar._bar._time = lambda: clock[0]
  bar._bar.start_t = bar._bar.last_print_t = clock[0]
  clock[0] += 30.0  # the first step compiles for 30 s
  bar.update({"time/step": 30.0})
  assert abs(bar.rate() - 1 / 30) < 1e-9  # what a plain average would keep reporting
  bar.restart_clock()
  for _ in range(4):
    clock[0] += 0.5
    bar.update({"time/step": 0.5})
  assert abs(bar.rate() - 2.0) < 1e-9  # 4 steps in 2 s: ETA for the 5 left = 2.5 s
  d = bar._bar.format_dict
  assert (d["total"] - d["n"]) / bar.rate() == 2.5
  bar.close()


def test_disabled_bar_has_no_rate():
  bar = ProgressBar(3, enabled=False)
  bar.restart_clock()
  assert bar.rate() is None
