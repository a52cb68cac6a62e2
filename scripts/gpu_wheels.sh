#!/usr/bin/env bash
# Download, on a machine with the package index, the wheels `scripts/gpu_check.sh` installs on
# the GPU machine (which reaches no index): msgspec, pyzmq and psutil at requirements/runtime.txt's
# pins, for CPython 3.12 on x86-64 Linux (about 1.2 MB), so that the tests that start the
# speculator as its own process run there. Output folder: $1 or ./gpu-wheels (git-ignored: name
# it in the device run's carry list).
set -eu
cd "$(dirname "$0")/.."
DEST="${1:-gpu-wheels}"
PYTHON="${PYTHON:-python3}"
PY_VERSION="${SSD_GPU_PYTHON_VERSION:-3.12}"
pins=$(grep -E '^(msgspec|pyzmq|psutil)==' requirements/runtime.txt)
mkdir -p "$DEST"
# shellcheck disable=SC2086
"$PYTHON" -m pip download --only-binary=:all: --no-deps --implementation cp \
  --python-version "$PY_VERSION" --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d "$DEST" $pins
ls -l "$DEST"
