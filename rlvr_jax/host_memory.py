"""Huge pages for XLA:CPU's large buffers: the launcher's one process-level setting.

XLA:CPU (jaxlib 0.10.2) allocates every large temporary and output buffer afresh on each call of
a jitted function, through glibc's ``malloc``, which maps blocks above 32 MB freshly with
``mmap``. The first touch of each 4 KiB page of such a block is a page fault, and the kernel
zeroes the page. One SmolLM2-135M RL update touches about 2 GB of fresh pages that way (514,000
faults, measured with ``getrusage``), one 64-token ``generate`` call about 0.75 GB.

glibc 2.35+ has a tunable, ``glibc.malloc.hugetlb=1``, that asks for transparent huge pages
(``madvise(MADV_HUGEPAGE)``) on the blocks ``malloc`` maps. Where the kernel's THP mode is
``madvise`` (the common default), a fresh block then faults once per 2 MiB instead of once per
4 KiB. Measured on the 2-core machine (interleaved processes, bfloat16 SmolLM2, docs/benchmarks.md):
faults per update 514,000 -> 1,300, update 3.96-4.08 s -> 3.65-3.73 s; ``generate`` 3.60-3.75 s
-> 3.41-3.50 s. Other ``malloc`` settings were tried and dropped: no ``mmap`` at all with one arena
(``MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0``) removes the faults but makes the update slower (4.35 s),
and without ``MALLOC_ARENA_MAX=1`` the faults stay (XLA allocates from its worker threads, whose
arenas map large blocks regardless).

glibc reads its tunables when the process starts, so ``rlvr_jax.main`` re-executes itself once
with the tunable added (``reexec_with_hugepages``) when it would change anything: Linux, glibc >=
2.35, THP mode ``madvise``, the tunable not already set. ``RLVR_JAX_HUGEPAGES=0`` turns it off.
Numbers do not change (it is where memory comes from, not what is computed). A Python process
started another way (a notebook, ``rlvr_jax.api``) gets it by setting
``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` before the interpreter starts.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable, Mapping

TUNABLE = "glibc.malloc.hugetlb=1"
OPT_OUT = "RLVR_JAX_HUGEPAGES"  # "0": leave malloc as it is
_REEXECUTED = "RLVR_JAX_HUGEPAGES_REEXEC"  # set in the re-executed process: never loop
THP_MODE_PATH = "/sys/kernel/mm/transparent_hugepage/enabled"
DETECT = "detect"  # hugepage_environ's glibc / mode: read them from this machine


def thp_mode(path: str = THP_MODE_PATH) -> str:
  """The kernel's transparent-huge-page mode (the bracketed word of ``path``: "always",
  "madvise" or "never"), "" where the file is missing or unreadable."""
  try:
    with open(path) as f:
      text = f.read()
  except OSError:
    return ""
  start, end = text.find("["), text.find("]")
  return text[start + 1 : end] if 0 <= start < end else ""


def glibc_version() -> tuple[int, int] | None:
  """(major, minor) of the C library when it is glibc, else None."""
  lib, version = platform.libc_ver()
  if lib != "glibc":
    return None
  try:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)
  except ValueError:
    return None


def hugepage_environ(
  environ: Mapping[str, str],
  *,
  system: str = sys.platform,
  glibc: tuple[int, int] | None | str = DETECT,
  mode: str = DETECT,
) -> dict[str, str] | None:
  """The environment to re-execute with (``environ`` plus the tunable), or None when nothing
  would change: opted out, already re-executed, not Linux, no glibc >= 2.35, THP mode other than
  "madvise" ("always" needs no advice, "never" ignores it), or a ``glibc.malloc.hugetlb`` setting
  already in ``GLIBC_TUNABLES`` (the user's choice stands). Other tunables are kept."""
  if environ.get(OPT_OUT, "1") == "0" or environ.get(_REEXECUTED):
    return None
  glibc = glibc_version() if glibc == DETECT else glibc
  mode = thp_mode() if mode == DETECT else mode
  if not system.startswith("linux") or glibc is None or glibc < (2, 35) or mode != "madvise":
    return None
  tunables = environ.get("GLIBC_TUNABLES", "")
  if "glibc.malloc.hugetlb" in tunables:
    return None
  return {
    **environ,
    "GLIBC_TUNABLES": f"{tunables}:{TUNABLE}" if tunables else TUNABLE,
    _REEXECUTED: "1",
  }


def reexec_with_hugepages(execve: Callable = os.execve) -> None:
  """Re-execute this interpreter with the same command line and ``hugepage_environ``, or return
  when it gives None. Call it first thing, before jax starts threads or allocates."""
  environ = hugepage_environ(os.environ)
  if environ is None:
    return
  sys.stdout.flush()
  sys.stderr.flush()
  execve(sys.executable, list(sys.orig_argv), environ)
