"""Every command block of README.md and docs/*.md is run, or says why not, so docs cannot drift.

Each ```bash block carries a marker on the line above it:

  <!-- docs-test: fast [--config.x=y ...] [expect="text"] -->   run in the fast suite
  <!-- docs-test: slow [--config.x=y ...] [expect="text"] -->   run in the slow suite
  <!-- docs-test: not-run: <reason> -->                          never run (multi-host, GPUs, ...)

A run executes the block's commands in order, in a scratch directory that links the repository's
``experiments/``, ``docs/`` and ``tools/`` (so ``runs/...`` lands there), with ``.venv/bin/python``
as this interpreter and ``bash tools/setup.sh &&`` dropped (``tests/test_setup_script.py`` covers
it). Every ``rlvr_jax.main`` command gets ``QUICK`` (a few steps on a few problems) and then the
marker's own overrides appended (the last value of a flag wins). The blocks of one document share
the scratch directory, so a later block can read what an earlier one wrote, and a persistent XLA
compilation cache in it (so a later command loads the programs an earlier one compiled).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
QUICK = (
  "--config.warm_start.num_steps=0 --config.warm_start.clean_steps=0 --config.rl.num_steps=2 "
  "--config.rl.prompts_per_step=4 --config.sampling.num_samples=4 --config.data.num_eval=4 "
  "--config.eval.every=0 --config.eval.num_samples=2 --config.checkpoint.every=0 "
  "--config.logging.plot=False --config.logging.tensorboard=False --config.logging.progress=False"
)
_MARKER = re.compile(r"<!-- docs-test: (fast|slow|not-run)(.*?)-->")
_SHELL = ("bash", "sh", "shell", "console")


def blocks(path: Path):
  """(first line number, language, body, marker match or None) of every fenced block."""
  lines = path.read_text(encoding="utf-8").splitlines()
  out, i = [], 0
  while i < len(lines):
    m = re.match(r"^```(\w*)\s*$", lines[i])
    if not m:
      i += 1
      continue
    end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
    prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
    out.append((i + 1, m.group(1), "\n".join(lines[i + 1 : end]), _MARKER.search(prev)))
    i = end + 1
  return out


def _shell_blocks(mode: str):
  for path in DOCS:
    for line, lang, body, marker in blocks(path):
      if lang in _SHELL and marker and marker.group(1) == mode:
        yield path, line, body, marker.group(2)


def test_every_command_block_is_run_or_says_why_not():
  problems = []
  for path in DOCS:
    for line, lang, body, marker in blocks(path):
      where = f"{path.relative_to(ROOT)}:{line}"
      if lang in _SHELL:
        if marker is None:
          problems.append(f"{where}: no <!-- docs-test: fast|slow|not-run: reason --> above it")
        elif marker.group(1) == "not-run" and len(marker.group(2).strip(" :")) < 5:
          problems.append(f"{where}: not-run needs a reason")
      elif not lang and re.search(r"(^|\s)(\.venv/bin/python|python -m|bash tools/)", body):
        problems.append(f"{where}: a command in an unlabeled block: make it ```bash")
  assert not problems, "\n".join(problems)
  assert len(list(_shell_blocks("fast"))) >= 5  # the README's newcomer path is in the fast suite


def script(body: str, extra: str) -> str:
  """The block as a bash script to run here (module docstring)."""
  out, heredoc = [], None
  for raw in body.replace("\\\n", " ").splitlines():
    if heredoc is not None:  # a here-document's lines stay as they are
      out.append(raw)
      heredoc = None if raw.strip() == heredoc else heredoc
      continue
    line = raw.strip()
    if not line or line.startswith("#"):
      continue
    m = re.search(r"<<-?'?(\w+)'?\s*$", line)
    heredoc = m.group(1) if m else None
    line = line.replace("bash tools/setup.sh && ", "")
    line = re.sub(r"(^|[\s=;&|(])(\.venv/bin/)?python(?=\s)", rf"\1{sys.executable}", line)
    if "rlvr_jax.main" in line and "--help" not in line:
      line = " ".join(re.split(r"\s+#\s", line)[0].split()) + f" {QUICK} {extra}"
    out.append(line)
  return "\n".join(out)


def _sandbox(tmp_path: Path) -> Path:
  for name in ("experiments", "docs", "tools"):
    (tmp_path / name).symlink_to(ROOT / name)
  return tmp_path


def _run_doc(path: Path, mode: str, tmp_path: Path):
  cwd = _sandbox(tmp_path)
  env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "JAX_PLATFORMS": "cpu"}
  env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
  # The document's commands run one after another and compile many of the same programs: a
  # persistent XLA cache of this test's own (no other process writes it) saves about 30% of a
  # document's time (docs/results.md's slow commands, session 16: 200 s -> 140 s).
  env.setdefault("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax_cache"))
  env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
  for doc, line, body, rest in _shell_blocks(mode):
    if doc != path:
      continue
    expect = re.search(r'expect="([^"]*)"', rest)
    extra = re.sub(r'expect="[^"]*"', "", rest).strip()
    text = script(body, extra)
    out = subprocess.run(
      ["bash", "-euo", "pipefail", "-c", text],
      cwd=cwd, env=env, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    where = f"{path.relative_to(ROOT)}:{line}"
    assert out.returncode == 0, f"{where} failed:\n{text}\n{out.stdout[-3000:]}{out.stderr[-3000:]}"
    if expect:
      assert expect.group(1) in out.stdout, f"{where}: {expect.group(1)!r} not in\n{out.stdout}"


def _docs_with(mode: str):
  return sorted({p for p, *_ in _shell_blocks(mode)})


@pytest.mark.parametrize("path", _docs_with("fast"), ids=lambda p: p.name)
def test_fast_documented_commands_run(path, tmp_path):
  _run_doc(path, "fast", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("path", _docs_with("slow"), ids=lambda p: p.name)
def test_slow_documented_commands_run(path, tmp_path):
  _run_doc(path, "slow", tmp_path)


def test_script_rewrites_a_block_as_documented():
  body = (
    "# a comment\nbash tools/setup.sh && .venv/bin/python -m rlvr_jax.main \\\n"
    "  --config=default --mesh=1,-1,1   # FSDP\ncat > /tmp/x.py <<'PY'\n# kept\nPY\n"
    "python /tmp/x.py"
  )
  lines = script(body, "--config.seed=3").splitlines()
  assert lines[0] == (
    f"{sys.executable} -m rlvr_jax.main --config=default --mesh=1,-1,1 {QUICK} --config.seed=3"
  )
  assert lines[1:] == ["cat > /tmp/x.py <<'PY'", "# kept", "PY", f"{sys.executable} /tmp/x.py"]
