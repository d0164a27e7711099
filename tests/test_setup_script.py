"""tools/setup.sh installs once; a re-run with nothing changed does nothing and says so."""

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_FAKE = """#!/usr/bin/env bash
if [ "$1" = "-VV" ]; then echo "Python 3.11.9 (fake)"; exit 0; fi
echo "$(basename "$0") $*" >> "$(dirname "$0")/../calls.log"
"""


def _checkout(tmp_path) -> Path:
  """A copy of the script and pyproject.toml with a fake .venv whose pip only logs its calls."""
  (tmp_path / "tools").mkdir()
  shutil.copy(ROOT / "tools" / "setup.sh", tmp_path / "tools" / "setup.sh")
  shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
  bin_dir = tmp_path / ".venv" / "bin"
  bin_dir.mkdir(parents=True)
  for name in ("python", "pip"):
    (bin_dir / name).write_text(_FAKE)
    os.chmod(bin_dir / name, 0o755)
  return tmp_path


def _setup(root: Path):
  out = subprocess.run(
    ["bash", str(root / "tools" / "setup.sh")], capture_output=True, text=True, timeout=60
  )
  assert out.returncode == 0, out.stderr
  log = root / ".venv" / "calls.log"
  calls = log.read_text().splitlines() if log.exists() else []
  log.unlink(missing_ok=True)
  return out.stdout, calls


def test_setup_installs_once_and_reinstalls_when_pyproject_changes(tmp_path):
  root = _checkout(tmp_path)
  out, calls = _setup(root)
  assert "pip install -q -e .[test,bench]" in calls and "ready" in out
  out, calls = _setup(root)
  assert calls == [] and "nothing to do" in out and len(out.splitlines()) == 1
  with open(root / "pyproject.toml", "a") as f:
    f.write("\n# a new dependency\n")
  _, calls = _setup(root)
  assert "pip install -q -e .[test,bench]" in calls
  (root / ".venv" / ".rlvr_jax_setup_stamp").unlink()  # an interrupted install left no stamp
  _, calls = _setup(root)
  assert "pip install -q -e .[test,bench]" in calls
