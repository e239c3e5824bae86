#!/usr/bin/env bash
# Creates .venv and installs marllm with everything it needs. Idempotent: a second run only
# re-installs when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
stamp=.venv/.marllm-installed
if [ -f "$stamp" ] && cmp -s pyproject.toml "$stamp"; then
  exit 0
fi
.venv/bin/python -m pip install --quiet --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  # torch is installed on its own, pinned, before anything that depends on it: an unpinned
  # requirement would resolve to the newest release and its multi-GB CUDA packages. Where no
  # GPU is present the CPU build of 2.13.0 is taken.
  .venv/bin/python -m pip install --quiet "torch==${MARLLM_TORCH_VERSION:-2.13.0}"
fi
if ! command -v nvidia-smi >/dev/null 2>&1 && .venv/bin/python -c "import sys, torch; sys.exit(torch.version.cuda is None)"; then
  echo "warning: no GPU here but the installed torch is a CUDA build ($(.venv/bin/python -c 'import torch; print(torch.__version__)'))" >&2
fi
.venv/bin/python -m pip install --quiet -e ".[dev]"
cp pyproject.toml "$stamp"
