#!/usr/bin/env bash
# Creates .venv and installs marllm with everything it needs (its dev, ray and games extras too), at the versions of
# requirements.lock (the versions the tests passed on; `make lock` refreshes it). Idempotent: a second run
# re-installs only when pyproject.toml, the lock or constraints.in changed.
#
# PyTorch: the lock's version, installed before anything that depends on it. Where nvidia-smi finds no GPU the CPU
# build is wanted: on this kind of machine pip finds it in a local wheel directory; elsewhere set
# MARLLM_TORCH_INDEX=https://download.pytorch.org/whl/cpu, or pip takes PyPI's CUDA build (several GB). Where a GPU
# is present, PyPI's build of that version (CUDA) is taken.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
LOCK=requirements.lock
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
stamp=.venv/.marllm-installed
inputs() { cat pyproject.toml "$LOCK" constraints.in; }
if [ -f "$stamp" ] && inputs | cmp -s - "$stamp"; then
  exit 0
fi
# Installed without byte-compiling, then compiled on every core at the end (pip compiles one file at a time, a third of
# a fresh install); the .pyc files matter where PYTHONDONTWRITEBYTECODE is set, as nothing imported later writes one.
pip_install() { .venv/bin/python -m pip install --quiet --no-compile --constraint "$LOCK" "$@"; }
.venv/bin/python -m pip install --quiet --upgrade pip
locked_torch=$(sed -n 's/^torch==\([^ ]*\).*/\1/p' "$LOCK")
[ -n "$locked_torch" ] || { echo "setup: $LOCK pins no torch version" >&2; exit 1; }
installed_torch=$(.venv/bin/python -c "import torch; print(torch.__version__.split('+')[0])" 2>/dev/null || true)
if [ "$installed_torch" != "$locked_torch" ]; then
  torch_index=()
  [ -n "${MARLLM_TORCH_INDEX:-}" ] && torch_index=(--index-url "$MARLLM_TORCH_INDEX")
  pip_install "${torch_index[@]}" "torch==$locked_torch"
fi
pip_install -e ".[dev,ray,games]"  # the extras the lock is compiled with
# A file that does not compile (a package's Python 2 test data, which pip skips too) stays source: hence || true.
site_packages=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
.venv/bin/python -m compileall -q -j 0 "$site_packages" > /dev/null || true
if ! command -v nvidia-smi >/dev/null 2>&1 && .venv/bin/python -c "import sys, torch; sys.exit(torch.version.cuda is None)"; then
  echo "warning: no GPU here but the installed torch is a CUDA build ($(.venv/bin/python -c 'import torch; print(torch.__version__)'))" >&2
fi
inputs > "$stamp"
