#!/usr/bin/env bash
# The one device script: GPU correctness checks, then GPU timings, in one short run (at most
# about 4.5 minutes on one H100 or H200, so that a rerun fits in the same lease).
#
# Runs on a bare checkout with the machine's own python3 (torch, transformers, pytest; no sglang,
# no `make install`, no package index). It installs, when given, the msgspec, pyzmq and psutil
# wheels that `scripts/gpu_wheels.sh` downloaded beforehand (folder $SSD_GPU_WHEELS, default
# ./gpu-wheels: carry it with the run) into a private folder on PYTHONPATH, so that the checks
# that start the speculator as its own process run. Everything goes to $OUT (default ./gpu-out)
# as soon as it exists, so a timeout still returns data:
#   env.txt, topo.txt, nccl.txt, pip-list.txt   python/torch/GPU, `nvidia-smi topo -m`,
#                                               `torch.cuda.nccl.version()`, `pip list`
#   gpu-check.log, gpu-check.xml                pytest of tests/gpu (`make gpu-check`), <= 140 s
#   gpu-model.log, gpu-model-*.json             `python -m eval.gpu_model` on a small grid, <= 110 s
#   checks.txt                                  the lines printed below
# It prints one line per check: `check NAME: passed|failed|skipped (reason)`. Exit status: 1
# when any check failed, else 0.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
PYTHON="${PYTHON:-python3}"
WHEELS="${SSD_GPU_WHEELS:-$PWD/gpu-wheels}"
CHECK_TIMEOUT_S="${SSD_GPU_CHECK_TIMEOUT_S:-140}"
MODEL_TIMEOUT_S="${SSD_GPU_MODEL_TIMEOUT_S:-110}"
GPU_TESTS="${SSD_GPU_TESTS:-tests/gpu}"  # what pytest runs (the CPU test of this script: one file)
# The timing grid: a quarter of eval.gpu_model's default (batches 1/4/16/32, budgets 4-32,
# depths 2/4/6), enough to place the speculator's round against the verify.
MODEL_GRID=(--batches 1 8 32 --budgets 8 32 --depths 2 4 --reps 2 --reps-verify 5)
mkdir -p "$OUT"
: >"$OUT/checks.txt"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
failed=0

report() {  # report NAME passed|failed|skipped [REASON]
  local line="check $1: $2${3:+ ($3)}"
  echo "$line" | tee -a "$OUT/checks.txt"
  [ "$2" = failed ] && failed=1
  return 0
}

cuda=$("$PYTHON" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)

{
  "$PYTHON" -c 'import sys, torch; print(sys.version); print("torch", torch.__version__,
    "cuda", torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA")'
  "$PYTHON" -c 'import transformers; print("transformers", transformers.__version__)'
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
} >"$OUT/env.txt" 2>&1
report env passed "$(head -n 1 "$OUT/env.txt" | cut -c1-40)"

if command -v nvidia-smi >/dev/null 2>&1; then
  if nvidia-smi topo -m >"$OUT/topo.txt" 2>&1; then report topo passed; else
    report topo failed "nvidia-smi topo -m: $(tail -n 1 "$OUT/topo.txt")"; fi
else
  report topo skipped "no nvidia-smi"
fi

if [ "$cuda" = 1 ]; then
  if "$PYTHON" -c 'import torch; print("nccl", torch.cuda.nccl.version())' >"$OUT/nccl.txt" 2>&1; then
    report nccl passed "$(cat "$OUT/nccl.txt")"
  else
    report nccl failed "$(tail -n 1 "$OUT/nccl.txt")"
  fi
else
  report nccl skipped "no CUDA device"
fi

if "$PYTHON" -m pip list >"$OUT/pip-list.txt" 2>&1; then report pip-list passed; else
  report pip-list failed "$(tail -n 1 "$OUT/pip-list.txt")"; fi

if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  SITE="$(mktemp -d)/site"
  if "$PYTHON" -m pip install --quiet --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl \
    >"$OUT/wheels.log" 2>&1; then
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    report wheels passed "$(cd "$WHEELS" && ls ./*.whl | sed 's#^\./##; s/-.*//' | tr '\n' ' ')"
  else
    report wheels failed "pip install: $(tail -n 1 "$OUT/wheels.log")"
  fi
else
  report wheels skipped "no wheels in $WHEELS (run scripts/gpu_wheels.sh where the index is reachable)"
fi

timeout -k 5 "$CHECK_TIMEOUT_S" "$PYTHON" -m pytest -c tests/gpu/pytest.ini --confcutdir=tests/gpu \
  "$GPU_TESTS" -m gpu -rs --durations=0 --junitxml="$OUT/gpu-check.xml" >"$OUT/gpu-check.log" 2>&1
code=$?
[ "$code" = 124 ] && report tests/gpu failed "timed out after $CHECK_TIMEOUT_S s"
"$PYTHON" scripts/junit_lines.py "$OUT/gpu-check.xml" | tee -a "$OUT/checks.txt"
[ "${PIPESTATUS[0]}" -ne 0 ] && failed=1

if [ "$cuda" = 1 ]; then
  PYTHONPATH="$PWD:$PWD/kernels${PYTHONPATH:+:$PYTHONPATH}" timeout -k 5 "$MODEL_TIMEOUT_S" \
    "$PYTHON" -m eval.gpu_model --out "$OUT" "${MODEL_GRID[@]}" "$@" >"$OUT/gpu-model.log" 2>&1
  code=$?
  if [ "$code" = 0 ]; then report eval.gpu_model passed; elif [ "$code" = 124 ]; then
    report eval.gpu_model failed "timed out after $MODEL_TIMEOUT_S s (partial results in $OUT)"
  else report eval.gpu_model failed "exit $code: $(tail -n 1 "$OUT/gpu-model.log")"; fi
else
  report eval.gpu_model skipped "no CUDA device"
fi
exit "$failed"
