"""glibc ``malloc`` settings for XLA:CPU's large buffers: the launcher's one process-level setting.

XLA:CPU (jaxlib 0.10.2) allocates every large temporary and output buffer afresh on each call of
a jitted function, through glibc's ``malloc``, and frees it when the call ends. By default
``malloc`` maps blocks above 32 MB freshly with ``mmap`` and unmaps them on ``free``, so every
call touches new pages: one SmolLM2-135M RL update about 2.8 GB, one 64-token ``generate`` about
1.7 GB (measured with ``getrusage``). Two settings, glibc tunables plus, for one, a jax option:

* **Huge pages** (``RLVR_JAX_MALLOC=hugepages``), ``glibc.malloc.hugetlb=1`` (glibc 2.35+):
  ``madvise(MADV_HUGEPAGE)`` on the blocks ``malloc`` maps. Where the kernel's THP mode is
  ``madvise`` (the common default) a fresh block then faults once per 2 MiB instead of once per
  4 KiB: faults per update 514,000 -> 1,300, update 3.96-4.08 s -> 3.65-3.73 s, ``generate``
  3.60-3.75 s -> 3.41-3.50 s (interleaved processes, bfloat16 SmolLM2, docs/benchmarks.md,
  session 11). Freed blocks still go back to the kernel after every call.
* **Memory kept for reuse** (the default since session 15: unset or ``RLVR_JAX_MALLOC=keep``):
  huge pages, no ``mmap`` (``mmap_max=0``: blocks come from the ``brk`` heap) and no trimming
  (``trim_threshold`` 64 GiB), and XLA:CPU computations run on the calling thread
  (``configure_jax``: without that, XLA's client thread allocates from its own arena, which maps
  blocks above its 64 MB heaps with ``mmap`` whatever ``mmap_max`` says). A freed buffer then
  stays mapped and the next call reuses it without a fault. On a VM with free page reporting (a
  ``virtio_balloon`` guest, as on the project's machines) the host takes back freed 2 MiB blocks
  within seconds, and faulting them in again is far dearer than zeroing a page: the first update
  after a ``generate`` spent 2.3-3.0 s of system time on 1,390 huge-page faults; kept, 0.06 s and
  no fault, and the bench's RL step 8.2-8.4 s against 8.9-10.6 s (docs/benchmarks.md, session
  15). The price: the process holds its peak resident size (about 4.9 GB on that trainer,
  against 2.9 GB between steps with huge pages alone). Session 14's version of this setting
  limited ``malloc`` to one arena instead of running computations on the calling thread; that
  slowed everything that allocates from many threads, compilation above all (a 2-step tiny run
  24-26 s against 18-21 s), and it was an opt-in. This one compiles as fast as huge pages alone.

glibc reads its tunables when the process starts, so ``rlvr_jax.main`` re-executes itself once
with them added (``reexec_with_malloc_tunables``) when that changes anything: Linux, glibc >=
2.35, THP mode ``madvise``; a tunable the user already set in ``GLIBC_TUNABLES`` stands, ours with
the same name is left out. Then it calls ``configure_jax``. ``RLVR_JAX_MALLOC``: unset or
``keep`` (the default), ``hugepages``, or ``0`` (leave malloc and jax alone). Numbers do not
change (it is where memory comes from, not what is computed). A Python process started another
way (a notebook, ``rlvr_jax.api``) gets it by setting ``GLIBC_TUNABLES`` to ``tunables(setting)``
before the interpreter starts and calling ``configure_jax()`` before jax computes anything.

**CPU only.** Both halves apply only where jax will compute on the CPU (``jax_platform``): a GPU or
TPU launch is never re-executed, its ``malloc`` and its jax settings are left as they are (its
large buffers live on the device; ``mmap_max=0`` and no trimming would only pin the host memory of
its input pipeline). The platform is decided before jax starts, without importing it (the
re-exec happens first thing, and jax's own ``jax.default_backend()`` would create the backends:
the CPU client before ``jax_cpu_enable_async_dispatch`` is set, every client before
``jax.distributed.initialize``). The rule, the first that answers:

1. ``JAX_PLATFORMS`` set (non-empty): its first entry, jax's highest priority (``cpu``; ``cuda``,
   ``rocm`` -> ``gpu``; ``tpu``; another name is another accelerator);
2. ``JAX_PLATFORM_NAME`` set (the deprecated name of jax's default platform): the same;
3. ``PJRT_NAMES_AND_LIBRARY_PATHS`` set (a PJRT plugin loaded by path): its first plugin's name;
4. an accelerator jax would find and could use: its plugin is installed (found by importlib's
   finders, nothing imported: a ``jax_plugins.*`` module, where the CUDA and ROCm PJRT wheels put
   ``xla_cuda12``, ``xla_cuda13``, ``xla_rocm7``; a ``jax_cuda*_plugin`` / ``jax_rocm*_plugin``
   package; ``libtpu`` or ``TPU_LIBRARY_PATH``) AND its hardware is visible (CUDA: jax's own
   check, ``/dev/nvidia0``, ``/dev/nvidiactl`` or ``/dev/dxg``, unless ``CUDA_VISIBLE_DEVICES``
   is "" or "-1"; ROCm: ``/dev/kfd`` or ``/dev/dxg``, unless ``HIP_VISIBLE_DEVICES`` /
   ``ROCR_VISIBLE_DEVICES`` hides them; TPU: a Google PCI device, vendor 0x1ae0). A
   ``jax_plugins`` module of any other name counts as an accelerator;
5. else ``cpu``.

Where it errs it errs towards "not CPU" (a CPU run without the tunables: slower XLA:CPU steps,
the same numbers), never towards changing a GPU process's ``malloc``. A CUDA wheel installed on a
machine without a GPU gives ``cpu``, as jax then falls back to the CPU. ``JAX_PLATFORMS=cpu``
makes any machine a CPU launch.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import pkgutil
import platform
import sys
from collections.abc import Callable, Iterable, Mapping

# Each setting's name=value pairs, in the order they are appended to GLIBC_TUNABLES.
HUGEPAGES = ("glibc.malloc.hugetlb=1",)
KEEP = (
  *HUGEPAGES,
  "glibc.malloc.mmap_max=0",
  "glibc.malloc.trim_threshold=68719476736",
)
SETTINGS = {"hugepages": HUGEPAGES, "keep": KEEP}
# Settings whose process runs XLA:CPU computations on the calling thread (``configure_jax``).
SYNCHRONOUS = frozenset({"keep"})
DEFAULT = "keep"
TUNABLE = ":".join(SETTINGS[DEFAULT])  # the default setting, as GLIBC_TUNABLES takes it
SETTING = "RLVR_JAX_MALLOC"  # unset / "keep" / "hugepages" / "0" (leave malloc as it is)
_REEXECUTED = "RLVR_JAX_MALLOC_REEXEC"  # set in the re-executed process: never loop
THP_MODE_PATH = "/sys/kernel/mm/transparent_hugepage/enabled"
DETECT = "detect"  # an argument's default: read it from this machine (glibc, THP mode, platform)


# jax_platform's rule (module docstring): the variables that name jax's platform, in order.
PLATFORM_VARIABLES = ("JAX_PLATFORMS", "JAX_PLATFORM_NAME", "PJRT_NAMES_AND_LIBRARY_PATHS")
_ALIASES = {"cuda": "gpu", "rocm": "gpu", "oneapi": "gpu"}  # jax's own platform aliases
# The kernel packages of jax's CUDA / ROCm wheels (their PJRT plugins are jax_plugins.xla_*).
PLUGIN_PACKAGES = (
  "jax_cuda12_plugin",
  "jax_cuda13_plugin",
  "jax_rocm60_plugin",
  "jax_rocm7_plugin",
)
# Per GPU kind: the device files that show its hardware (CUDA: jax's own hardware_utils check)
# and the variables whose value "" or "-1" hides every device.
_GPU_HARDWARE = {
  "cuda": (("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg"), ("CUDA_VISIBLE_DEVICES",)),
  "rocm": (("/dev/kfd", "/dev/dxg"), ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")),
}
_GOOGLE_PCI_VENDOR = "0x1ae0"


def named_platform(environ: Mapping[str, str] = os.environ) -> str:
  """The platform the environment names (steps 1-3 of the rule: ``JAX_PLATFORMS``'s first entry,
  ``JAX_PLATFORM_NAME``, ``PJRT_NAMES_AND_LIBRARY_PATHS``'s first plugin), jax's aliases
  resolved ("cuda" -> "gpu"); "" where none is set."""
  for name in PLATFORM_VARIABLES:
    first = environ.get(name, "").split(",")[0]
    if name == "PJRT_NAMES_AND_LIBRARY_PATHS":  # "name:path,name:path"
      first = first.split(":")[0]
    first = first.strip().lower()
    if first:
      return _ALIASES.get(first, first)
  return ""


def jax_platform(
  environ: Mapping[str, str] = os.environ,
  *,
  plugins: Iterable[str] | str = DETECT,
  exists: Callable[[str], bool] = os.path.exists,
  google_pci: bool | str = DETECT,
) -> str:
  """The platform jax will compute on: "cpu", "gpu", "tpu" or another accelerator's name, decided
  without importing jax (the module docstring's rule). ``plugins`` (default
  ``installed_plugins()``), ``exists`` (a path check) and ``google_pci`` (default
  ``has_google_pci_device()``) describe this machine; tests replace them."""
  if named := named_platform(environ):
    return named
  plugins = installed_plugins(environ) if plugins == DETECT else plugins
  for plugin in sorted(plugins):
    kind = next((k for k in _GPU_HARDWARE if k in plugin), None)
    if kind is not None:
      devices, variables = _GPU_HARDWARE[kind]
      hidden = any(environ.get(v) in ("", "-1") for v in variables)
      if not hidden and any(exists(d) for d in devices):
        return "gpu"
    elif "tpu" in plugin:
      if has_google_pci_device() if google_pci == DETECT else google_pci:
        return "tpu"
    else:  # a PJRT plugin of another accelerator: never the CPU's settings
      return plugin.rsplit(".", 1)[-1]
  return "cpu"


def installed_plugins(environ: Mapping[str, str] = os.environ) -> frozenset[str]:
  """jax's accelerator plugins on this interpreter's path, found by importlib's finders without
  importing anything: the ``jax_plugins.*`` modules (the namespace package jax scans), the
  ``PLUGIN_PACKAGES``, and "libtpu" (the module, or ``TPU_LIBRARY_PATH`` naming a file)."""
  found = set()
  namespace = importlib.util.find_spec("jax_plugins")
  if namespace is not None and namespace.submodule_search_locations:
    for module in pkgutil.iter_modules(namespace.submodule_search_locations):
      found.add(f"jax_plugins.{module.name}")
  found.update(name for name in PLUGIN_PACKAGES if importlib.util.find_spec(name))
  if os.path.isfile(environ.get("TPU_LIBRARY_PATH", "")) or importlib.util.find_spec("libtpu"):
    found.add("libtpu")
  return frozenset(found)


def has_google_pci_device(pattern: str = "/sys/bus/pci/devices/*/vendor") -> bool:
  """Whether a PCI device of Google's vendor id is attached: its TPUs, but also its gVNIC network
  cards (an installed libtpu then makes a CPU VM on Google Cloud a TPU one: the safe way to err)."""
  for path in glob.glob(pattern):
    try:
      with open(path) as f:
        if f.read().strip() == _GOOGLE_PCI_VENDOR:
          return True
    except OSError:
      continue
  return False


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


def tunables(setting: str) -> str:
  """``GLIBC_TUNABLES`` text of a setting ("hugepages" or "keep")."""
  if setting not in SETTINGS:
    raise ValueError(f"{SETTING}={setting!r}: expected one of {', '.join(SETTINGS)} or 0 (off)")
  return ":".join(SETTINGS[setting])


def active_setting(environ: Mapping[str, str] = os.environ) -> str:
  """The setting ``RLVR_JAX_MALLOC`` names ("hugepages", "keep", or "0" for off; unset: the
  default); an unknown name raises ``ValueError`` naming the variable."""
  setting = environ.get(SETTING, "") or DEFAULT
  if setting != "0":
    tunables(setting)
  return setting


def configure_jax(environ: Mapping[str, str] = os.environ, *, platform_name: str = DETECT) -> bool:
  """The jax half of the active setting; call it before jax runs anything. Under "keep", XLA:CPU
  computations run on the calling thread (``jax_cpu_enable_async_dispatch=False``): their
  buffers then come from the main thread's ``malloc`` arena, the ``brk`` heap that the setting
  keeps; dispatched to XLA's client thread, the large ones came from that thread's own arena,
  which maps blocks above its 64 MB heaps with ``mmap`` whatever ``mmap_max`` says. Only where
  jax computes on the CPU (``platform_name``, default ``jax_platform(environ)``; not
  ``jax.default_backend()``, which would create the CPU client before the setting). Returns
  whether it changed jax's configuration."""
  if active_setting(environ) not in SYNCHRONOUS:
    return False
  if (jax_platform(environ) if platform_name == DETECT else platform_name) != "cpu":
    return False
  import jax

  jax.config.update("jax_cpu_enable_async_dispatch", False)
  return True


def malloc_environ(
  environ: Mapping[str, str],
  *,
  system: str = sys.platform,
  glibc: tuple[int, int] | None | str = DETECT,
  mode: str = DETECT,
  platform_name: str = DETECT,
) -> dict[str, str] | None:
  """The environment to re-execute with (``environ`` plus the tunables of the setting named by
  ``RLVR_JAX_MALLOC``, default "keep"), or None when nothing would change: set to "0",
  already re-executed, jax will not compute on the CPU (``platform_name``, default
  ``jax_platform(environ)``), not Linux, no glibc >= 2.35, or every one of our tunables already
  named in ``GLIBC_TUNABLES``. The huge-page tunable is left out where the THP mode is not
  "madvise" ("always" needs no advice, "never" ignores it): "hugepages" then changes nothing,
  "keep" keeps the rest. The user's tunables are kept, and one of ours whose name they set is
  left out (their value stands). An unknown setting raises ``ValueError`` naming the variable."""
  setting = active_setting(environ)
  if setting == "0" or environ.get(_REEXECUTED):
    return None
  if (jax_platform(environ) if platform_name == DETECT else platform_name) != "cpu":
    return None  # a GPU / TPU launch: its malloc stays as it is
  wanted = SETTINGS[setting]  # a known name: active_setting checked it
  glibc = glibc_version() if glibc == DETECT else glibc
  mode = thp_mode() if mode == DETECT else mode
  if not system.startswith("linux") or glibc is None or glibc < (2, 35):
    return None
  if mode != "madvise":
    wanted = [t for t in wanted if t not in HUGEPAGES]
  user = environ.get("GLIBC_TUNABLES", "")
  taken = {item.split("=")[0] for item in user.split(":") if item}
  ours = [t for t in wanted if t.split("=")[0] not in taken]
  if not ours:
    return None
  return {
    **environ,
    "GLIBC_TUNABLES": ":".join([*filter(None, [user]), *ours]),
    _REEXECUTED: "1",
  }


def reexec_with_malloc_tunables(execve: Callable = os.execve) -> None:
  """Re-execute this interpreter with the same command line and ``malloc_environ``, or return
  when it gives None. Call it first thing, before jax starts threads or allocates."""
  environ = malloc_environ(os.environ)
  if environ is None:
    return
  sys.stdout.flush()
  sys.stderr.flush()
  execve(sys.executable, list(sys.orig_argv), environ)
