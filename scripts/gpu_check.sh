#!/usr/bin/env bash
# The one device script (issue 14 items 4-6): GPU correctness checks, then GPU timings.
#
# Runs on a bare checkout with the machine's own python3 (torch, transformers, pytest; no sglang,
# no `make install`). Everything goes to $OUT (default ./gpu-out) as soon as it exists, so a
# timeout still returns data:
#   gpu-check.log, gpu-check.xml   pytest of tests/gpu (`make gpu-check`), at most 180 s
#   gpu-model.log, gpu-model-*.json  `python -m eval.gpu_model`, at most 170 s
#   env.txt                        python, torch, transformers, GPU
# Total at most about 6 minutes. Exit status: that of the checks, else of the timings.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

{
  "$PYTHON" -c 'import sys, torch; print(sys.version); print("torch", torch.__version__,
    "cuda", torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA")'
  "$PYTHON" -c 'import transformers; print("transformers", transformers.__version__)'
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
} >"$OUT/env.txt" 2>&1

timeout -k 5 180 "$PYTHON" -m pytest -c tests/gpu/pytest.ini --confcutdir=tests/gpu tests/gpu -m gpu \
  --durations=0 --junitxml="$OUT/gpu-check.xml" >"$OUT/gpu-check.log" 2>&1
checks=$?
echo "gpu-check exit $checks"

PYTHONPATH="$PWD:$PWD/kernels${PYTHONPATH:+:$PYTHONPATH}" timeout -k 5 170 \
  "$PYTHON" -m eval.gpu_model --out "$OUT" "$@" >"$OUT/gpu-model.log" 2>&1
timings=$?
echo "gpu-model exit $timings"
tail -n 25 "$OUT/gpu-check.log"
tail -n 5 "$OUT/gpu-model.log"
[ "$checks" -ne 0 ] && exit "$checks"
exit "$timings"
