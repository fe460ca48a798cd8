#!/usr/bin/env bash
# The one-shot GPU check: run on a lent GPU machine (at most 8 minutes), from the repository root:
#
#     bash experiments/gpu_check.sh            # writes docs/gpu_check.md and $OUT/gpu_check.json
#
# 1. the CUDA-guarded tests (pytest -m cuda) and the Triton/backend tests on the real device;
# 2. experiments/bench_gpu.py at MSLR-WEB30K size (31,531 queries, 136 features): routes, times,
#    identity against the CPU reference; XGBoost's and LightGBM's GPU trainers beside it where
#    they are installed (their rows say "not installed" otherwise);
# 3. the whole suite on the GPU machine (pytest-xdist where installed), each failure's id written
#    to $OUT/failures.txt as it happens (RANKKIT_FAILURES, conftest.py), so a cut run names them;
# 4. the figures, with the date, the device and this command, into docs/gpu_check.md (the page
#    docs/gpu.md points to), and the JSON record into $OUT (the device tool brings it back).
#
# Each step has its own time limit so that a slow step cannot eat the others' time; a step that
# fails is recorded as failed and the script goes on. Needs a CUDA build of torch in .venv or on
# PATH's python (`make venv TORCH="torch==2.11.0"` on a machine with internet; the device
# machines have torch preinstalled). The package is installed without build isolation or
# dependencies, so the step works on a machine that cannot reach an index.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
OUT=${OUT:-results/gpu_check}
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
: > "$LOG"
stamp() { date -u +%Y-%m-%dT%H:%M:%SZ; }

echo "== $(stamp) device" | tee -a "$LOG"
"$PY" - <<'EOF' 2>&1 | tee -a "$LOG"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0))
try:
    import triton
    print("triton", triton.__version__)
except ImportError:
    print("triton not installed")
EOF
"$PY" -m pip install -q --no-build-isolation --no-deps -e . >> "$LOG" 2>&1 || echo "pip install -e . failed (kernels may be missing)" | tee -a "$LOG"

echo "== $(stamp) CUDA-guarded tests" | tee -a "$LOG"
timeout 180 "$PY" -m pytest -q -p no:cacheprovider -m cuda tests 2>&1 | tail -15 | tee -a "$LOG"
TESTS_RC=${PIPESTATUS[0]}
timeout 120 "$PY" -m pytest -q -p no:cacheprovider -x tests/kernels/test_backends.py tests/kernels/triton/test_tree.py 2>&1 \
    | tail -5 | tee -a "$LOG"

echo "== $(stamp) benchmark at MSLR-WEB30K size" | tee -a "$LOG"
timeout 300 "$PY" experiments/bench_gpu.py --json "$OUT/gpu_check.json" 2>&1 | tail -40 | tee -a "$LOG"
BENCH_RC=${PIPESTATUS[0]}

echo "== $(stamp) the whole suite on this machine (failures: $OUT/failures.txt)" | tee -a "$LOG"
: > "$OUT/failures.txt"
XDIST=$("$PY" -c 'import xdist' 2>/dev/null && echo "-n 8" || echo "")
RANKKIT_FAILURES="$(cd "$OUT" && pwd)/failures.txt" timeout 240 "$PY" -m pytest -q -p no:cacheprovider $XDIST \
    -m "not slow" tests rankkit 2>&1 | tail -3 | tee -a "$LOG"
echo "$(wc -l < "$OUT/failures.txt") failures recorded" | tee -a "$LOG"

{
  echo "# GPU check"
  echo
  echo "Run $(stamp) by \`bash experiments/gpu_check.sh\` on: $("$PY" -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device")' 2>/dev/null)."
  echo "CUDA tests exit status ${TESTS_RC}; benchmark exit status ${BENCH_RC}. The log:"
  echo
  echo '```'
  cat "$LOG"
  echo '```'
} > docs/gpu_check.md
cp docs/gpu_check.md "$OUT/" 2>/dev/null || true
echo "== $(stamp) done: docs/gpu_check.md, $OUT" | tee -a "$LOG"
