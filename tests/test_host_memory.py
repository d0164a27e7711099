"""The launcher's malloc tunables (rlvr_jax/host_memory.py): when it re-executes, with what
environment, and that ``python -m rlvr_jax.main`` really runs with them."""

import os
import subprocess
import sys
import textwrap

import pytest

from rlvr_jax import host_memory as hm

_LINUX = dict(system="linux", glibc=(2, 36), mode="madvise")


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
  assert hm.configure_jax({hm.SETTING: setting} if setting else {}) is synchronous
  assert updates == ([("jax_cpu_enable_async_dispatch", False)] if synchronous else [])
  with pytest.raises(ValueError, match="RLVR_JAX_MALLOC='fast'"):
    hm.configure_jax({hm.SETTING: "fast"})


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


def test_main_runs_with_the_tunable_where_it_applies(tmp_path):
  """End to end: the config file is evaluated in the process that runs the experiment, and
  records the environment it sees; ``--help`` then exits 0 (the command line survived)."""
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
        return base_config()
    """)
  )
  drop = ("GLIBC_TUNABLES", hm._REEXECUTED, hm.SETTING)
  env = {k: v for k, v in os.environ.items() if k not in drop}
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
    out = subprocess.run(
      [sys.executable, "-m", "rlvr_jax.main", f"--config={probe}", "--help"],
      capture_output=True, text=True, env=run_env, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: python -m rlvr_jax.main")
    tunables_seen, _, async_seen = seen.read_text().split("|")
    assert tunables_seen == want
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
