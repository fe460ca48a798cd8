#!/usr/bin/env bash
# The one GPU check: a profile that says where the round's time goes, then the whole suite.
# Run it on a lent GPU machine from the repository root, in one call of at most 8 minutes:
#
#     bash experiments/gpu_check.sh            # results in $OUT (default results/gpu_check)
#
# PROFILE_ARGS adds arguments to the profile (a CPU smoke run: "--device cpu --queries 20 --features 4").
# Deadline-aware (../shared/design/gpu-round.md §4): every step gets min(its cap, the time
# left of BUDGET seconds, default 450), and a failing step is logged and skipped, never fatal.
#   1. device, clocks, driver, torch and triton versions; the wheels in .whl/ installed, if carried
#      (experiments/device_wheels.sh: the CLI's and tune's packages the image lacks), and the
#      package installed (no index needed);
#   2. microbenchmarks (experiments/gpu_microbench.py): copy bandwidth, scattered and
#      same-address relaxed atomics, rankkit's histogram kernel on hot and uniform codes, an
#      empty grid shaped like the padded lambda kernel's, tl.histogram;
#   3. the profile (experiments/gpu_profile.py) at MSLR-WEB30K size: memory per round, phases,
#      torch.profiler's per-kernel table and histogram levels, quantized, lambda variants, k=None;
#   4. optional, with >= 260 s left and ncu present: Nsight Compute counters of the hot kernels;
#   5. the tests in three tiers, each under `timeout -s INT` (pytest still writes its report),
#      with a per-test timeout where pytest-timeout is installed, never -x; every failure's id
#      and first message line appended to $OUT/failures.txt as it happens (RANKKIT_FAILURES);
#   6. a summary: failures grouped by message, then the tables LAST (a reply keeps the tail).
# Files in $OUT: gpu_run.json, profile.txt, trace_*.json.gz, microbench.json, ncu.txt,
# failures.txt, junit.xml, suite.log. Afterwards, on any machine:
#     python experiments/gpu_profile.py --render $OUT/gpu_run.json > docs/gpu_check.md
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
OUT=${OUT:-results/gpu_check}
BUDGET=${BUDGET:-450}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/suite.log"
: > "$LOG"
: > "$OUT/failures.txt"
START=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
cap() { local l; l=$(left); (( l < $1 )) && echo "$l" || echo "$1"; }   # min(cap, time left)
stamp() { date -u +%Y-%m-%dT%H:%M:%SZ; }
say() { echo "== $(stamp) [$(left) s left] $*"; }

say "1. device and versions"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,memory.total,power.limit \
    --format=csv 2>&1 | head -3
"$PY" - <<'EOF' 2>&1
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, f"sm_{p.major}{p.minor}", p.multi_processor_count, "SMs",
          round(p.total_memory / 2**30, 1), "GiB")
print("torch.cuda._compile_kernel:", hasattr(torch.cuda, "_compile_kernel"))
try:
    import triton
    print("triton", triton.__version__)
except ImportError:
    print("triton not installed")
EOF
if compgen -G ".whl/*.whl" > /dev/null; then  # carried wheels (experiments/device_wheels.sh): no index there
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        > "$OUT/wheels.log" 2>&1 && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} \
        || say "installing the carried wheels failed (see wheels.log)"
fi
timeout "$(cap 60)" "$PY" -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1 \
    || say "pip install -e . failed (see install.log; the C kernels may be missing)"

say "2. microbenchmarks"
timeout -s INT "$(cap 45)" "$PY" experiments/gpu_microbench.py --json "$OUT/microbench.json" > "$OUT/microbench.txt" 2>&1 \
    || say "microbenchmarks failed or cut (exit $?), see microbench.txt"
tail -3 "$OUT/microbench.txt"

say "3. profile"
PROFILE_BUDGET=$(cap 150)
timeout -s INT $(( PROFILE_BUDGET + 20 )) "$PY" experiments/gpu_profile.py --out "$OUT" --budget "$PROFILE_BUDGET" \
    ${PROFILE_ARGS:-} > "$OUT/profile.log" 2>&1 || say "profile failed or cut (exit $?), see profile.log"
grep -E "^\[" "$OUT/profile.log" | tail -12

if (( $(left) >= 260 )) && command -v ncu > /dev/null; then
    say "4. Nsight Compute (optional)"
    timeout -s INT "$(cap 60)" ncu --clock-control none -k 'regex:_histogram_kernel|_lambda_kernel|_topk_kernel' -c 8 \
        --metrics gpu__time_duration.sum,lts__t_requests_op_red.sum,lts__t_sectors_op_red.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed \
        "$PY" experiments/gpu_profile.py --queries 3200 --budget 40 > "$OUT/ncu.txt" 2>&1 || say "ncu refused or failed (exit $?)"
else
    say "4. Nsight Compute skipped (under 260 s left, or no ncu)"
fi

say "5. tests in tiers (failures: $OUT/failures.txt)"
PER_TEST=$("$PY" -c 'import pytest_timeout' 2>/dev/null && echo "--timeout=90" || echo "")
XDIST=$("$PY" -c 'import xdist' 2>/dev/null && echo "-n 14" || echo "")
COMMON="-p no:cacheprovider -q -rfE --tb=short $PER_TEST"
export RANKKIT_FAILURES="$OUT/failures.txt"
tier() {  # tier NAME SHARE-OF-WHAT-IS-LEFT ARGS...
    local name=$1 share=$2; shift 2
    local t=$(( $(left) * share / 100 - 10 ))
    if (( t < 20 )); then say "tier $name skipped: no time left" | tee -a "$LOG"; return; fi
    say "tier $name ($t s)" | tee -a "$LOG"
    timeout -s INT -k 10 "$t" "$PY" -m pytest $COMMON "$@" >> "$LOG" 2>&1
    say "tier $name exit $?" | tee -a "$LOG"
    tail -2 "$LOG"
}
tier cuda 25 -m cuda tests
tier kernels 45 $XDIST tests/kernels tests/boosting tests/lambdas
tier rest 90 $XDIST -m "not slow" tests rankkit --ignore=tests/kernels --ignore=tests/boosting \
    --ignore=tests/lambdas --junitxml="$OUT/junit.xml"

say "6. summary"
{
    grep -E "tier .* (exit|skipped)" "$LOG" | sed -E "s/ exit 124/ exit 124 (cut by its time limit)/"
    echo "tests: $(sort -u "$OUT/failures.txt" | wc -l) distinct failures"
    # Grouped by the first message line, numbers and hex addresses masked.
    sed -E 's/^[^ ]+ \([a-z]+\): //; s/0x[0-9a-f]+/0x…/g; s/[0-9]+(\.[0-9]+)?/N/g' "$OUT/failures.txt" \
        | sort | uniq -c | sort -rn | head -25
    echo "first failing ids:"
    sort -u "$OUT/failures.txt" | head -40 | cut -c1-200
} > "$OUT/tests_summary.txt"
"$PY" - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
path = os.path.join(out, "gpu_run.json")
if os.path.exists(path):
    record = json.load(open(path))
    for name, file in (("microbench", "microbench.json"),):
        if os.path.exists(os.path.join(out, file)):
            record[name] = json.load(open(os.path.join(out, file)))
    record["tests"] = open(os.path.join(out, "tests_summary.txt")).read()
    json.dump(record, open(path, "w"), indent=1, default=str)
EOF
cat "$OUT/tests_summary.txt"
say "tables (also in $OUT/profile.txt)"
cat "$OUT/microbench.txt" 2>/dev/null | tail -25
"$PY" - "$OUT" <<'EOF'
import json, os, sys
sys.path.insert(0, "experiments")
path = os.path.join(sys.argv[1], "gpu_run.json")
if os.path.exists(path):
    from gpu_profile import tables
    print(tables(json.load(open(path))))
else:
    print("no gpu_run.json: the profile step failed (see profile.log)")
EOF
say "done: $OUT"
