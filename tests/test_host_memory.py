"""The launcher's malloc tunables (rlvr_jax/host_memory.py): when it re-executes, with what
environment, that ``python -m rlvr_jax.main`` really runs with them, and that only a CPU launch
does (``host_memory.jax_platform``: a GPU / TPU launch keeps its malloc and jax settings)."""

import os
import subprocess
import sys
import textwrap

import pytest

from rlvr_jax import host_memory as hm

_LINUX = dict(system="linux", glibc=(2, 36), mode="madvise", platform_name="cpu")


def test_adds_the_tunables_and_keeps_the_rest_of_the_environment():
  env = hm.malloc_environ({"PATH": "/bin", "X": "1"}, **_LINUX)
  assert env["GLIBC_TUNABLES"] == hm.TUNABLE == hm.tunables("keep")  # the default setting
  assert env["PATH"] == "/bin" and env["X"] == "1"
  assert env[hm._REEXECUTED] == "1"
  # the user's other tunables stay, ours are appended
  env = hm.malloc_environ({"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=4096"}, **_LINUX)
  assert env["GLIBC_TUNABLES"] == f"glibc.rtld.optional_static_tls=4096:{hm.TUNABLE}"


def test_keep_adds_no_mmap_and_no_trim_to_huge_pages():
  env = hm.malloc_environ({hm.SETTING: "keep"}, **_LINUX)
  assert env["GLIBC_TUNABLES"].split(":") == [
    "glibc.malloc.hugetlb=1",
    "glibc.malloc.mmap_max=0",
    "glibc.malloc.trim_threshold=68719476736",
  ]
  hugepages = hm.malloc_environ({hm.SETTING: "hugepages"}, **_LINUX)
  assert hugepages["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"


def test_without_madvise_mode_keep_drops_only_the_huge_page_advice():
  for mode in ("always", "never", ""):
    env = hm.malloc_environ({hm.SETTING: "keep"}, **{**_LINUX, "mode": mode})
    assert env["GLIBC_TUNABLES"].split(":") == list(hm.KEEP[1:])
    assert hm.malloc_environ({hm.SETTING: "hugepages"}, **{**_LINUX, "mode": mode}) is None


def test_a_tunable_the_user_set_keeps_their_value():
  env = hm.malloc_environ(
    {hm.SETTING: "keep", "GLIBC_TUNABLES": "glibc.malloc.mmap_max=4"}, **_LINUX
  )
  items = env["GLIBC_TUNABLES"].split(":")
  assert items[0] == "glibc.malloc.mmap_max=4"
  assert [i for i in items if i.startswith("glibc.malloc.mmap_max=")] == items[:1]
  assert items[1:] == [t for t in hm.KEEP if not t.startswith("glibc.malloc.mmap_max=")]


@pytest.mark.parametrize(
  "setting, synchronous", [("", True), ("keep", True), ("hugepages", False), ("0", False)]
)
def test_configure_jax_runs_computations_on_the_calling_thread_under_keep(
  monkeypatch, setting, synchronous
):
  import jax

  updates = []
  monkeypatch.setattr(jax.config, "update", lambda name, value: updates.append((name, value)))
  environ = {hm.SETTING: setting} if setting else {}
  assert hm.configure_jax(environ, platform_name="cpu") is synchronous
  assert updates == ([("jax_cpu_enable_async_dispatch", False)] if synchronous else [])
  with pytest.raises(ValueError, match="RLVR_JAX_MALLOC='fast'"):
    hm.configure_jax({hm.SETTING: "fast"})
  # Not on a GPU or TPU, whatever the setting (named by the environment, or detected).
  updates.clear()
  for platform in ("gpu", "tpu"):
    assert hm.configure_jax(environ, platform_name=platform) is False
  assert hm.configure_jax({**environ, "JAX_PLATFORMS": "tpu"}) is False
  assert hm.configure_jax({**environ, "JAX_PLATFORMS": "cuda,cpu"}) is False
  assert updates == []


def test_an_unknown_setting_names_the_variable():
  with pytest.raises(ValueError, match="RLVR_JAX_MALLOC='fast'.*hugepages, keep"):
    hm.malloc_environ({hm.SETTING: "fast"}, **_LINUX)


@pytest.mark.parametrize(
  "environ, overrides",
  [
    ({hm.SETTING: "0"}, {}),  # opted out
    ({hm._REEXECUTED: "1"}, {}),  # already re-executed: never a loop
    ({hm.SETTING: "hugepages", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, {}),  # user's choice
    ({}, {"system": "darwin"}),
    ({}, {"glibc": None}),  # musl or another C library
    ({}, {"glibc": (2, 34)}),  # before the tunable existed
    ({hm.SETTING: "hugepages"}, {"mode": "always"}),  # every mapping gets huge pages already
    ({hm.SETTING: "hugepages"}, {"mode": "never"}),  # advice would be ignored
    ({hm.SETTING: "hugepages"}, {"mode": ""}),  # no THP file
  ],
)
def test_leaves_the_process_alone_when_it_would_change_nothing(environ, overrides):
  assert hm.malloc_environ(environ, **{**_LINUX, **overrides}) is None


def test_thp_mode_reads_the_bracketed_word(tmp_path):
  path = tmp_path / "enabled"
  path.write_text("always [madvise] never\n")
  assert hm.thp_mode(str(path)) == "madvise"
  path.write_text("[always] madvise never\n")
  assert hm.thp_mode(str(path)) == "always"
  assert hm.thp_mode(str(tmp_path / "missing")) == ""


def test_reexec_passes_the_interpreter_the_same_command_line(monkeypatch):
  calls = []
  monkeypatch.setattr(hm, "malloc_environ", lambda environ: {"GLIBC_TUNABLES": hm.TUNABLE})
  hm.reexec_with_malloc_tunables(execve=lambda *a: calls.append(a))
  assert calls == [(sys.executable, list(sys.orig_argv), {"GLIBC_TUNABLES": hm.TUNABLE})]
  calls.clear()
  monkeypatch.setattr(hm, "malloc_environ", lambda environ: None)
  hm.reexec_with_malloc_tunables(execve=lambda *a: calls.append(a))
  assert calls == []


_DROP = ("GLIBC_TUNABLES", hm._REEXECUTED, hm.SETTING)  # this process's own, if any


def _probe_main(tmp_path, run_env):
  """Runs ``python -m rlvr_jax.main --config=<probe> --help``: the config file is evaluated in the
  process that runs the experiment and records what it sees; returns (GLIBC_TUNABLES, setting,
  jax_cpu_enable_async_dispatch as text, re-executed marker)."""
  probe, seen = tmp_path / "probe.py", tmp_path / "seen.txt"
  probe.write_text(
    textwrap.dedent(f"""
      import os
      from jax._src import xla_bridge
      from rlvr_jax.train.config import base_config

      def get_config():
        with open({str(seen)!r}, "w") as f:
          f.write(os.environ.get("GLIBC_TUNABLES", "") + "|" + os.environ.get("{hm.SETTING}", ""))
          f.write("|" + str(xla_bridge._CPU_ENABLE_ASYNC_DISPATCH.value))
          f.write("|" + os.environ.get("{hm._REEXECUTED}", ""))
        return base_config()
    """)
  )
  out = subprocess.run(
    [sys.executable, "-m", "rlvr_jax.main", f"--config={probe}", "--help"],
    capture_output=True, text=True, env=run_env, timeout=120,
  )  # fmt: skip
  assert out.returncode == 0, out.stderr
  assert out.stdout.startswith("usage: python -m rlvr_jax.main")  # the command line survived
  return tuple(seen.read_text().split("|"))


def test_main_runs_with_the_tunable_where_it_applies(tmp_path):
  """End to end on the CPU: the tunables (where this machine takes them) and the synchronous
  dispatch reach the process that runs the experiment; ``--help`` then exits 0."""
  env = {k: v for k, v in os.environ.items() if k not in _DROP}
  for setting, asynchronous in (
    ("", "False"),
    ("keep", "False"),
    ("hugepages", "True"),
    ("0", "True"),
  ):
    run_env = {**env, "JAX_PLATFORMS": "cpu", **({hm.SETTING: setting} if setting else {})}
    # What this machine gets (nothing where the tunables do not apply), checked by hand on
    # Linux with glibc >= 2.35 and THP mode "madvise":
    expected = hm.malloc_environ(run_env)
    want = expected["GLIBC_TUNABLES"] if expected else ""
    linux = hm.malloc_environ(run_env, **_LINUX)
    if linux:
      assert linux["GLIBC_TUNABLES"] == {
        "": hm.TUNABLE, "keep": hm.tunables("keep"), "hugepages": "glibc.malloc.hugetlb=1"
      }[setting]  # fmt: skip
    tunables_seen, _, async_seen, reexecuted = _probe_main(tmp_path, run_env)
    assert tunables_seen == want and reexecuted == ("1" if expected else "")
    assert async_seen == asynchronous  # host_memory.configure_jax ran before the config


def test_main_names_an_unknown_setting_in_one_line():
  env = {k: v for k, v in os.environ.items() if k not in (hm._REEXECUTED,)}
  out = subprocess.run(
    [sys.executable, "-m", "rlvr_jax.main", "--config=default"],
    capture_output=True, text=True, env={**env, hm.SETTING: "fast"}, timeout=120,
  )  # fmt: skip
  assert out.returncode == 2
  assert (
    out.stderr.strip()
    == "error: RLVR_JAX_MALLOC='fast': expected one of hugepages, keep or 0 (off)"
  )


# ------------------------------------------------------------------ CPU only


@pytest.mark.parametrize(
  "environ, platform",
  [
    ({"JAX_PLATFORMS": "cpu"}, "cpu"),
    ({"JAX_PLATFORMS": "cuda"}, "gpu"),  # jax's alias
    ({"JAX_PLATFORMS": "rocm"}, "gpu"),
    ({"JAX_PLATFORMS": "gpu"}, "gpu"),
    ({"JAX_PLATFORMS": "tpu"}, "tpu"),
    ({"JAX_PLATFORMS": "cuda,cpu"}, "gpu"),  # the first entry has jax's highest priority
    ({"JAX_PLATFORMS": " CPU ,cuda"}, "cpu"),
    ({"JAX_PLATFORMS": "METAL"}, "metal"),  # another accelerator: not the CPU
    ({"JAX_PLATFORM_NAME": "gpu"}, "gpu"),
    ({"JAX_PLATFORMS": "cpu", "JAX_PLATFORM_NAME": "gpu"}, "cpu"),  # JAX_PLATFORMS first
    ({"JAX_PLATFORMS": "", "JAX_PLATFORM_NAME": "tpu"}, "tpu"),  # "" is unset, as for jax
    ({"PJRT_NAMES_AND_LIBRARY_PATHS": "myaccel:/opt/pjrt.so"}, "myaccel"),
  ],
)
def test_a_platform_named_by_the_environment_wins(environ, platform):
  # A machine with a visible NVIDIA GPU and its plugin: the environment still decides.
  machine = dict(plugins={"jax_plugins.xla_cuda12"}, exists=lambda p: True, google_pci=True)
  assert hm.jax_platform(environ, **machine) == platform


def _nvidia(path):
  return path == "/dev/nvidiactl"


@pytest.mark.parametrize(
  "plugins, environ, exists, google_pci, platform",
  [
    (set(), {}, _nvidia, True, "cpu"),  # a GPU but no plugin: jax computes on the CPU
    ({"jax_plugins.xla_cuda12"}, {}, _nvidia, False, "gpu"),
    ({"jax_plugins.xla_cuda13"}, {}, _nvidia, False, "gpu"),
    ({"jax_cuda12_plugin"}, {}, _nvidia, False, "gpu"),
    ({"jax_plugins.xla_cuda12"}, {}, lambda p: False, False, "cpu"),  # CUDA wheels, no GPU
    ({"jax_plugins.xla_cuda12"}, {"CUDA_VISIBLE_DEVICES": ""}, _nvidia, False, "cpu"),  # hidden
    ({"jax_plugins.xla_cuda12"}, {"CUDA_VISIBLE_DEVICES": "-1"}, _nvidia, False, "cpu"),
    ({"jax_plugins.xla_cuda12"}, {"CUDA_VISIBLE_DEVICES": "0"}, _nvidia, False, "gpu"),
    ({"jax_plugins.xla_rocm7"}, {}, lambda p: p == "/dev/kfd", False, "gpu"),
    ({"jax_plugins.xla_rocm7"}, {"HIP_VISIBLE_DEVICES": "-1"}, lambda p: True, False, "cpu"),
    ({"jax_plugins.xla_rocm7"}, {}, _nvidia, False, "cpu"),  # ROCm wheels, an NVIDIA GPU
    ({"libtpu"}, {}, lambda p: False, True, "tpu"),
    ({"libtpu"}, {}, lambda p: False, False, "cpu"),  # libtpu on a machine without a TPU
    ({"jax_plugins.xla_cuda12", "libtpu"}, {}, lambda p: False, True, "tpu"),
    ({"jax_plugins.intel_gpu"}, {}, lambda p: False, False, "intel_gpu"),  # unknown: not CPU
  ],
)
def test_detected_platform_needs_the_plugin_and_its_hardware(
  plugins, environ, exists, google_pci, platform
):
  got = hm.jax_platform(environ, plugins=plugins, exists=exists, google_pci=google_pci)
  assert got == platform


def test_installed_plugins_are_found_without_importing_them(tmp_path, monkeypatch):
  before = hm.installed_plugins({})  # this machine's: none where only jaxlib's CPU build is
  # The layout of jax's CUDA wheels: the PJRT plugin in the jax_plugins namespace package, the
  # kernels in jax_cuda12_plugin; both raise if imported, so a find that imported would fail.
  for package in ("jax_plugins/xla_cuda12", "jax_cuda12_plugin"):
    (tmp_path / package).mkdir(parents=True)
    (tmp_path / package / "__init__.py").write_text("raise RuntimeError('imported')\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  library = tmp_path / "libtpu.so"
  library.write_text("")
  found = hm.installed_plugins({"TPU_LIBRARY_PATH": str(library)})
  assert found == before | {"jax_plugins.xla_cuda12", "jax_cuda12_plugin", "libtpu"}
  assert "jax_plugins.xla_cuda12" not in sys.modules and "jax_cuda12_plugin" not in sys.modules


def test_google_pci_device_reads_the_vendor_ids(tmp_path):
  for device, vendor in (("0000:00:01.0", "0x8086"), ("0000:00:04.0", "0x1ae0")):
    (tmp_path / device).mkdir()
    (tmp_path / device / "vendor").write_text(vendor + "\n")
  assert hm.has_google_pci_device(str(tmp_path / "*" / "vendor"))
  (tmp_path / "0000:00:04.0" / "vendor").write_text("0x1af4\n")
  assert not hm.has_google_pci_device(str(tmp_path / "*" / "vendor"))
  assert not hm.has_google_pci_device(str(tmp_path / "missing" / "vendor"))


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_an_accelerator_launch_keeps_its_malloc(platform):
  assert hm.malloc_environ({}, **{**_LINUX, "platform_name": platform}) is None
  for setting in ("keep", "hugepages"):
    assert hm.malloc_environ({hm.SETTING: setting}, **{**_LINUX, "platform_name": platform}) is None
  # The environment's platform, when the caller does not name one.
  env = {"JAX_PLATFORMS": {"gpu": "cuda", "tpu": "tpu"}[platform]}
  assert hm.malloc_environ(env, system="linux", glibc=(2, 36), mode="madvise") is None
  cpu = hm.malloc_environ({"JAX_PLATFORMS": "cpu"}, system="linux", glibc=(2, 36), mode="madvise")
  assert cpu["GLIBC_TUNABLES"] == hm.TUNABLE
  # An unknown setting is still an error (the variable is wrong whatever the platform).
  with pytest.raises(ValueError, match="RLVR_JAX_MALLOC='fast'"):
    hm.malloc_environ({hm.SETTING: "fast"}, **{**_LINUX, "platform_name": platform})


def test_the_launcher_on_a_detected_accelerator_neither_reexecutes_nor_configures_jax(
  tmp_path, monkeypatch
):
  """What ``rlvr_jax.main`` calls, with no platform variable set, on a machine made to look like
  one with an NVIDIA GPU (a device file) and jax's CUDA wheels."""
  import jax

  for name in (*hm.PLATFORM_VARIABLES, *_DROP, "CUDA_VISIBLE_DEVICES"):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setattr(hm, "installed_plugins", lambda environ: {"jax_plugins.xla_cuda12"})
  device = tmp_path / "nvidiactl"
  device.touch()
  monkeypatch.setitem(hm._GPU_HARDWARE, "cuda", ((str(device),), ("CUDA_VISIBLE_DEVICES",)))
  calls, updates = [], []
  monkeypatch.setattr(jax.config, "update", lambda name, value: updates.append((name, value)))
  assert hm.jax_platform() == "gpu"
  hm.reexec_with_malloc_tunables(execve=lambda *a: calls.append(a))
  assert hm.configure_jax() is False
  assert calls == [] and updates == []
  # The same machine with JAX_PLATFORMS=cpu is a CPU launch again.
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  assert hm.configure_jax() is True and updates == [("jax_cpu_enable_async_dispatch", False)]


def test_main_on_a_gpu_neither_reexecutes_nor_changes_jax(tmp_path):
  """End to end: ``JAX_PLATFORMS=cuda`` (``--help`` initialises no backend, so this runs on a
  machine without a GPU): no tunables, no re-exec, jax's asynchronous CPU dispatch as it was."""
  env = {k: v for k, v in os.environ.items() if k not in _DROP}
  assert _probe_main(tmp_path, {**env, "JAX_PLATFORMS": "cuda"}) == ("", "", "True", "")
