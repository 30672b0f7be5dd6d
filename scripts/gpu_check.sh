#!/usr/bin/env bash
# gpu_check.sh - the one command to run the day a GPU is at hand. It runs, on CUDA:
#   1. the CUDA test lane: SEDD_TEST_DEVICE=cuda pytest (engine, API, batch invariance, server,
#      bf16 autocast, the OOM split, CUDA graphs replayed bit for bit, no sync inside a step);
#   2. sedd bench, fp32 against bf16: a random-weight model of the bundled model's shape
#      (765 genes, 260 bins, 128/4/4) and one of the K562 shape (8563 genes, 1724 bins, 256/8/8);
#   3. sedd bench --compare (st3's pattern against our default, with quality and MFU);
#   4. sedd bench --overhead at 1/16/64/256 rows in flight, eager and with CUDA graphs, on a
#      small model and on the bundled model;
# then writes one report, $OUT/report.json and $OUT/report.md (scripts/gpu_report.py).
#
#   bash scripts/gpu_check.sh                # OUT=bench_results/gpu_check
#   OUT=/tmp/gpu SEDD=/path/to/sedd bash scripts/gpu_check.sh
#
# Without CUDA it stops at once with a one-line message. Each step's log is kept in $OUT; a
# failing step is reported and the rest still run; the exit status is that of the worst step.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
[[ -x $PY ]] || PY=$(command -v python3)
OUT=${OUT:-$REPO/bench_results/gpu_check}
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "gpu_check: torch sees no CUDA device ($PY); run this on a GPU machine with a CUDA build of torch." >&2
  exit 2
fi
mkdir -p "$OUT"
status=0
step() {  # step NAME CMD...: run CMD, log to $OUT/NAME.log, remember a failure
  local name=$1
  shift
  echo "=== gpu_check: $name"
  if "$@" >"$OUT/$name.log" 2>&1; then
    echo "    ok"
  else
    local rc=$?
    echo "    FAILED (exit $rc; see $OUT/$name.log)"
    echo "$name" >>"$OUT/failed.txt"
    status=1
  fi
}
rm -f "$OUT/failed.txt"
cd "$REPO" || exit 2
step cuda_lane env SEDD_TEST_DEVICE=cuda "$PY" -m pytest -q -p no:cacheprovider
step bench_bundled_shape "$PY" -m sedd.cli bench --device cuda --shapes 128/4/4 \
  --num-genes 765 --num-bins 260 --batch-sizes 171 --out "$OUT/bench_bundled_shape.json"
step bench_k562_shape "$PY" -m sedd.cli bench --device cuda --shapes 256/8/8 \
  --num-genes 8563 --num-bins 1724 --batch-sizes 15 --out "$OUT/bench_k562_shape.json"
step bench_compare "$PY" -m sedd.cli bench --compare --device cuda --out "$OUT/compare.json"
for graphs in no-cuda-graphs cuda-graphs; do
  step "overhead_small_$graphs" "$PY" -m sedd.cli bench --overhead --device cuda "--$graphs" \
    --out "$OUT/overhead_small_$graphs.json"
  step "overhead_bundled_$graphs" "$PY" -m sedd.cli bench --overhead --device cuda "--$graphs" \
    --model models/pbmc_default --out "$OUT/overhead_bundled_$graphs.json"
done
"$PY" scripts/gpu_report.py "$OUT" || status=1
exit $status
