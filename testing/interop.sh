#!/usr/bin/env bash
# The PyTorch checks of `ringflow export --format torch` (tests/interop/): PyPI's torch brings
# about 2 GB of CUDA libraries, so it lives in its own virtual environment, target/interop-python,
# installed once and reused, and these checks run apart from the main suite (.ci/run runs them
# after it). Arguments go to the test binary (a filter, say).
#
#   testing/interop.sh               # install torch if missing, then cargo test --test interop
#   testing/interop.sh iris          # only the tests whose names contain "iris"
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=target/interop-python
PY_PACKAGES=("torch==2.15.0" "safetensors==0.8.0" "onnx==1.23.2" numpy)
PY_CHECK="import torch, safetensors.torch, onnx, numpy"

echo "== Python packages (${VENV}): ${PY_PACKAGES[*]}"
if ! "$VENV/bin/python3" -c "$PY_CHECK" 2>/dev/null; then
    python3 -m venv "$VENV" || { echo "python3's venv module is missing (Debian: python3-venv)" >&2; exit 1; }
    "$VENV/bin/python3" -m pip install --quiet "${PY_PACKAGES[@]}"
    "$VENV/bin/python3" -c "$PY_CHECK"
fi

# The tests start `python3` from PATH: this environment's comes first.
export PATH="$PWD/$VENV/bin:$PATH"
echo "== cargo test --test interop"
cargo test --test interop -- "$@"
