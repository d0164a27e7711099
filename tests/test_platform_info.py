"""summary.json names the machine and versions its numbers came from (train/platform_info.py).

Session 6 traced a 'regression' of the default job (0.950 -> 0.858 held-out greedy accuracy) to a
change of machine, not of code: the same commit gives different numbers on another CPU. These
tests check that a run records what it would take to see that at a glance.
"""

import json

import jax
import jaxlib
import numpy

from rlvr_jax.train import platform_info

_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC 9B45 128-Core Processor
flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512bw avx512vl avx512_bf16 avx512_vnni

processor\t: 1
model name\t: Some Other Name
flags\t\t: fpu sse4_2 amx_tile
"""


def test_cpu_model_and_isa_come_from_the_first_processor(tmp_path):
  path = tmp_path / "cpuinfo"
  path.write_text(_CPUINFO)
  fp = platform_info.fingerprint(str(path))
  assert fp["cpu"] == "AMD EPYC 9B45 128-Core Processor (AuthenticAMD cpu family 26 model 2)"
  # only the listed ISA flags, in ISA_FLAGS order; nothing from processor 1 (amx_tile)
  assert fp["cpu_isa"] == "sse4_2 avx avx2 fma avx512f avx512bw avx512vl avx512_vnni avx512_bf16"


def test_two_machines_with_different_isa_have_different_fingerprints(tmp_path):
  a, b = tmp_path / "a", tmp_path / "b"
  a.write_text(_CPUINFO)
  b.write_text(_CPUINFO.replace("avx512_bf16 ", "avx512_bf16 amx_tile ", 1))
  assert platform_info.fingerprint(str(a)) != platform_info.fingerprint(str(b))


def test_fingerprint_names_the_versions_and_is_stable_json(tmp_path):
  fp = platform_info.fingerprint(str(tmp_path / "missing"))  # no cpuinfo: still a fingerprint
  assert (fp["jax"], fp["jaxlib"], fp["numpy"]) == (
    jax.__version__,
    jaxlib.__version__,
    numpy.__version__,
  )
  assert fp["backend"] == jax.default_backend() and fp["device_count"] == len(jax.devices())
  assert fp["cpu"] and fp["cpu_isa"] == ""
  assert json.loads(json.dumps(fp)) == fp
  assert platform_info.fingerprint(str(tmp_path / "missing")) == fp  # nothing run-dependent
