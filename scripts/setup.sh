#!/usr/bin/env bash
# Create .venv (when missing), install the CPU torch pin first when torch is absent, then the
# package with its test, Flower and HE (TenSEAL) extras. Safe to run again: it only adds what
# is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
    # Any other torch request pulls a multi-GB CUDA build; this pin is a local CPU build.
    .venv/bin/pip install --quiet "torch==2.13.0"
fi
.venv/bin/pip install --quiet -e ".[test,flower,he]"
