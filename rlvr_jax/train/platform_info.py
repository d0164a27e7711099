"""What a run's numbers depend on besides the code and the config: the machine and the versions.

A run is bit-identical only on the same machine with the same package versions (README "What is
reproducible"). XLA:CPU picks its kernels, vector widths and fusions by the CPU's instruction set,
so float32 sums round differently on another CPU, and the default job's 600-step supervised warm
start amplifies a one-rounding-step difference into a different warm-started model (held-out greedy
accuracy 0.463 -> 0.950 recorded in sessions 3-4 on an AMD Zen 5 machine, 0.475 -> 0.858 with the
same commits on session 6's Intel Xeon with AMX: docs/results.md). Two recorded runs can only be compared
number for number when their fingerprints agree, so ``summary.json`` carries one
(``summary["platform"]``): without it, a moved number reads as a code regression.

The fingerprint is deliberately small and stable: it changes when the machine or the numerics
stack changes, not from run to run (no load, no free memory, no host name), so a finished run
re-launched on the same machine still leaves ``summary.json`` byte-identical.
"""

from __future__ import annotations

import os
import platform

# CPU feature flags (Linux /proc/cpuinfo names) that change which kernels XLA:CPU emits or calls
# (vector width, FMA, VNNI / BF16 dot instructions, AMX tiles).
ISA_FLAGS = (
  "sse4_2",
  "avx",
  "avx2",
  "fma",
  "avx512f",
  "avx512bw",
  "avx512vl",
  "avx512_vnni",
  "avx512_bf16",
  "avx512_fp16",
  "avx_vnni",
  "amx_tile",
  "amx_bf16",
  "amx_int8",
)


def _cpu_from_proc(path: str = "/proc/cpuinfo") -> tuple[str, str]:
  """(model name with vendor / family / model numbers, the ``ISA_FLAGS`` present, space-separated)
  of the first processor in ``path``. The numbers matter: a VM may name its CPU only
  "Intel(R) Xeon(R) Processor"."""
  fields: dict[str, str] = {}
  try:
    with open(path) as f:
      for line in f:
        if not line.strip() and fields:
          break  # end of the first processor's block
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
  except OSError:
    pass
  ids = " ".join(
    f"{k} {fields[k]}" if k != "vendor_id" else fields[k]
    for k in ("vendor_id", "cpu family", "model")
    if fields.get(k)
  )
  model = fields.get("model name", "")
  if ids:
    model = f"{model} ({ids})" if model else ids
  flags = set((fields.get("flags") or fields.get("Features") or "").split())
  return model, " ".join(f for f in ISA_FLAGS if f in flags)


def fingerprint(cpuinfo_path: str = "/proc/cpuinfo") -> dict:
  """The machine and versions a run's numbers depend on: flat strings and ints, so it reads back
  from ``summary.json`` unchanged; the same on every call on one machine."""
  import jax
  import jaxlib
  import numpy

  model, isa = _cpu_from_proc(cpuinfo_path)
  devices = jax.devices()
  return {
    "jax": jax.__version__,
    "jaxlib": jaxlib.__version__,
    "numpy": numpy.__version__,
    "python": platform.python_version(),
    "backend": jax.default_backend(),
    "device_kind": devices[0].device_kind,
    "device_count": len(devices),
    "cpu": model or platform.processor() or platform.machine(),
    "cpu_isa": isa,
    "cpu_count": os.cpu_count() or 0,
    "xla_flags": os.environ.get("XLA_FLAGS", ""),
  }
