#!/usr/bin/env bash
# gpu_check.sh - the one command to run the day a GPU is at hand. On one H100 it takes at most
# about 10 minutes: every step has a time budget (seconds, below) and is stopped when it runs
# past it (reported as "timeout"; the rest still run). The steps, in order:
#   cuda_lane (200 s)       the CUDA test lane: SEDD_TEST_DEVICE=cuda pytest -rfE over the lane's
#                           test paths, which scripts/lane_tests.py derives (every folder and
#                           top-level module of tests/ but those it excludes, each with a reason:
#                           the engine, diffusion, API, server, request, shards and model tests,
#                           ...: bf16 autocast, the OOM split, CUDA graphs bit for bit, no sync
#                           inside a step); LANE_TESTS="tests/engine ..." runs other paths instead
#   compare_cells (60 s)    scripts/gpu_compare_cells.py: one request, same seed, fp32, on the
#                           CPU, on CUDA and on CUDA with graphs: identical cells or the first
#                           differing cell and gene
#   bench_bundled_shape (45 s)  sedd bench, fp32 against bf16 (cells/s, ms/forward, peak
#                           memory): a random-weight model of the bundled shape (765 genes, 260
#                           bins, 128/4/4), 171 cells
#   bench_k562_shape (75 s) the same through the engine at the K562 shape (8563 genes, 1724 bins,
#                           256/8/8), 15 cells (one 131,072-token block)
#   bench_compare (100 s)   sedd bench --compare: st3's pattern against our default on the
#                           bundled model, with quality and MFU
#   overhead_{small,bundled}_{no-cuda-graphs,cuda-graphs} (25 s each)  sedd bench --overhead at
#                           1/16/64/256 rows in flight, eager and with CUDA graphs
# then scripts/gpu_report.py folds everything into $OUT/report.md and $OUT/report.json (failed
# test names, cells CUDA vs CPU, bf16 vs fp32, MFU, graphs on vs off, the K562 throughput).
#
#   bash scripts/gpu_check.sh                       # OUT=bench_results/gpu_check
#   bash scripts/gpu_check.sh --list                # the steps and their budgets
#   bash scripts/gpu_check.sh --only bench_k562_shape,compare_cells   # some steps (globs too:
#   bash scripts/gpu_check.sh --skip cuda_lane      #   --only 'overhead_*'); the report keeps
#                                                   #   the other steps' earlier results in $OUT
#   OUT=/tmp/gpu PYTHON=/path/to/python TIME_SCALE=2 bash scripts/gpu_check.sh   # budgets x2
#   bash scripts/gpu_check.sh --emulated            # no GPU: the emulated lane (below)
#
# It installs what it needs: if $PYTHON (default .venv/bin/python) lacks pytest, httpx or sedd,
# it first runs pip install -q -e "$REPO[test]" (and says so). Without CUDA it stops at once
# with a one-line message, unless --emulated (or SEDD_EMULATE_CUDA=1): then every python step
# runs through `python -m sedd.cuda_emulation` (a CUDA device computing on this CPU; the lane
# step with SEDD_EMULATE_CUDA=1) on tiny shapes and short runs, the lane step runs the same
# derived test paths (the whole lane: 9 minutes on a quiet 2-core CPU, 20 on a busy one; CI
# runs all of this as .ci/gpu_check_emulated.sh), and the report says in its first line that its
# timings mean nothing. Each step's log is kept in $OUT/STEP.log and its outcome in
# $OUT/STEP.status; the exit status is 1 if any step failed.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
[[ -x $PY ]] || PY=$(command -v python3)
OUT=${OUT:-$REPO/bench_results/gpu_check}
TIME_SCALE=${TIME_SCALE:-1}
case ${SEDD_EMULATE_CUDA:-} in "" | 0 | false | False | no | No) EMULATED=0 ;; *) EMULATED=1 ;; esac
ONLY="" SKIP="" LIST=0
while (($#)); do
  case $1 in
    --emulated) EMULATED=1 ;;
    --only) ONLY+=",${2:?--only needs STEP[,STEP...]}" && shift ;;
    --only=*) ONLY+=",${1#--only=}" ;;
    --skip) SKIP+=",${2:?--skip needs STEP[,STEP...]}" && shift ;;
    --skip=*) SKIP+=",${1#--skip=}" ;;
    --list) LIST=1 ;;
    -h | --help) sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" && exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (see --help)" >&2 && exit 2 ;;
  esac
  shift
done
MODE=$([[ $EMULATED == 1 ]] && echo emulated || echo cuda)

# --- the steps: NAME BUDGET_SECONDS (real GPU) and their commands (cuda and emulated) ---
STEPS=(cuda_lane compare_cells bench_bundled_shape bench_k562_shape bench_compare
  overhead_small_no-cuda-graphs overhead_small_cuda-graphs
  overhead_bundled_no-cuda-graphs overhead_bundled_cuda-graphs)
declare -A BUDGET=([cuda_lane]=200 [compare_cells]=60 [bench_bundled_shape]=45
  [bench_k562_shape]=75 [bench_compare]=100 [overhead_small_no-cuda-graphs]=25
  [overhead_small_cuda-graphs]=25 [overhead_bundled_no-cuda-graphs]=25
  [overhead_bundled_cuda-graphs]=25 [emulated_heldout]=60)
if [[ $EMULATED == 1 ]]; then
  STEPS=(emulated_heldout "${STEPS[@]}")
  for name in "${!BUDGET[@]}"; do BUDGET[$name]=180; done  # a hang guard: about 3x the slowest
  BUDGET[cuda_lane]=3600  # the whole lane computes on the CPU: 9-20 min on 2 cores
fi

selected() {  # selected NAME: whether --only / --skip leave step NAME in
  [[ $1 == emulated_heldout ]] && {  # bench_compare's data on the emulated lane
    selected bench_compare
    return
  }
  local pattern hit=0 only skip
  IFS=, read -r -a only <<<"$ONLY"
  IFS=, read -r -a skip <<<"$SKIP"
  if [[ -n $ONLY ]]; then
    for pattern in "${only[@]}"; do [[ -n $pattern && $1 == $pattern ]] && hit=1; done
    ((hit)) || return 1
  fi
  for pattern in "${skip[@]}"; do [[ -n $pattern && $1 == $pattern ]] && return 1; done
  return 0
}

budget_of() {  # budget_of NAME: its budget in seconds, times TIME_SCALE
  awk -v b="${BUDGET[$1]}" -v s="$TIME_SCALE" 'BEGIN { v = int(b * s + 0.5); print (v < 1 ? 1 : v) }'
}

if ((LIST)); then
  total=0
  for name in "${STEPS[@]}"; do
    b=$(budget_of "$name")
    selected "$name" && total=$((total + b)) && printf '%-34s %4d s\n' "$name" "$b"
  done
  printf '%-34s %4d s (%s)\n' "total" "$total" "$MODE"
  exit 0
fi

# --- what it needs: CUDA (or the emulation), then pytest, httpx and sedd in $PY ---
if [[ $EMULATED == 0 ]]; then
  if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_check: torch sees no CUDA device ($PY); run this on a GPU machine with a CUDA build of torch, or emulate one: --emulated." >&2
    exit 2
  fi
fi
needs="pytest httpx sedd.cli"
[[ $EMULATED == 1 ]] && needs+=" ninja"
missing=$(cd / && "$PY" -c '
import importlib.util, sys
for name in sys.argv[1:]:
    try:
        found = importlib.util.find_spec(name) is not None
    except ImportError:
        found = False
    if not found:
        print(name.split(".")[0])
' $needs 2>/dev/null | tr '\n' ' ')
if [[ -n $missing ]]; then
  echo "gpu_check: $PY lacks ${missing% }: installing what it needs, pip install -q -e \"$REPO[test]\""
  if ! "$PY" -m pip install -q -e "$REPO[test]"; then
    echo "gpu_check: the install failed; install sedd's test extra by hand (docs/gpu.md, GPU set-up) and rerun." >&2
    exit 2
  fi
fi
if [[ $EMULATED == 1 ]] && ! "$PY" -c 'import sys, torch; sys.exit(1 if torch.backends.cuda.is_built() else 0)'; then
  echo "gpu_check: --emulated needs a CPU build of torch; this one is a CUDA build: run without --emulated." >&2
  exit 2
fi

mkdir -p "$OUT" || exit 2
cd "$REPO" || exit 2
if [[ -z $ONLY && -z $SKIP ]]; then  # a whole run: no result of an earlier run may remain
  rm -f "$OUT"/*.status "$OUT/report.md" "$OUT/report.json" "$OUT/failed.txt" "$OUT/emulated_heldout.h5ad"
  for name in "${STEPS[@]}" emulated_heldout; do rm -f "$OUT/$name.log" "$OUT/$name.json"; done
fi
status=0
ran=0
step() {  # step NAME CMD...: run CMD within NAME's budget, log to $OUT/NAME.log, keep the outcome
  local name=$1
  shift
  selected "$name" || return 0
  local budget rc=0 start=$SECONDS state=ok
  budget=$(budget_of "$name")
  rm -f "$OUT/$name.log" "$OUT/$name.json" "$OUT/$name.status"
  echo "=== gpu_check: $name (budget ${budget} s)"
  # past its budget: SIGINT (pytest then still prints its summary, the FAILED lines), SIGKILL
  # 20 s later; --foreground: a Ctrl-C at the terminal reaches the step too
  timeout --foreground -s INT -k 20 "$budget" "$@" >"$OUT/$name.log" 2>&1 || rc=$?
  local took=$((SECONDS - start))
  if ((rc == 124 || rc == 137)); then
    state=timeout
  elif ((rc != 0)); then
    state=failed
  fi
  printf '%s %d %d %d %s\n' "$state" "$rc" "$took" "$budget" "$MODE" >"$OUT/$name.status"
  ran=$((ran + 1))
  if [[ $state == ok ]]; then
    echo "    ok (${took} s)"
  else
    echo "    ${state^^} (exit $rc after ${took} s; see $OUT/$name.log)"
    status=1
  fi
}

lane_tests=()
if selected cuda_lane; then  # $LANE_TESTS, or the paths scripts/lane_tests.py derives
  if [[ -n ${LANE_TESTS:-} ]]; then
    read -r -a lane_tests <<<"$LANE_TESTS"
  elif ! mapfile -t lane_tests < <("$PY" scripts/lane_tests.py) || ((${#lane_tests[@]} == 0)); then
    echo "gpu_check: scripts/lane_tests.py named no test path (its message is above)" >&2
    exit 2
  fi
fi
total=0
for name in "${STEPS[@]}"; do selected "$name" && total=$((total + $(budget_of "$name"))); done
echo "gpu_check ($MODE): results in $OUT; the selected steps take at most ${total} s"

if [[ $EMULATED == 0 ]]; then
  # four workers (pytest-xdist, as the README's suite): ~630 tests in the 200 s budget; each
  # worker holds its own CUDA context, well within one GPU's memory
  step cuda_lane env SEDD_TEST_DEVICE=cuda "$PY" -m pytest -q -p no:cacheprovider -rfE -n 4 \
    "${lane_tests[@]}"
  step compare_cells "$PY" scripts/gpu_compare_cells.py --out "$OUT/compare_cells.json"
  step bench_bundled_shape "$PY" -m sedd.cli bench --device cuda --shapes 128/4/4 \
    --num-genes 765 --num-bins 260 --batch-sizes 171 --out "$OUT/bench_bundled_shape.json"
  step bench_k562_shape "$PY" -m sedd.cli bench --device cuda --shapes 256/8/8 \
    --num-genes 8563 --num-bins 1724 --batch-sizes 15 --out "$OUT/bench_k562_shape.json"
  step bench_compare "$PY" -m sedd.cli bench --compare --device cuda --out "$OUT/bench_compare.json"
  for graphs in no-cuda-graphs cuda-graphs; do
    step "overhead_small_$graphs" "$PY" -m sedd.cli bench --overhead --device cuda "--$graphs" \
      --out "$OUT/overhead_small_$graphs.json"
    step "overhead_bundled_$graphs" "$PY" -m sedd.cli bench --overhead --device cuda "--$graphs" \
      --model models/pbmc_default --out "$OUT/overhead_bundled_$graphs.json"
  done
else
  # Emulated: the same steps on tiny shapes, each python step under sedd.cuda_emulation.
  emu=("$PY" -m sedd.cuda_emulation)
  tiny=tests/data/st3/experiments/tiny_pert  # 64 genes, 5 labels, 64/2/4: bench --compare's model
  heldout_py='
import sys, warnings
import anndata as ad, numpy as np, pandas as pd
from sedd.checkpoints import load_checkpoint
warnings.simplefilter("ignore")
config = load_checkpoint(sys.argv[1], device="cpu").config
labels = list(config.perturbations)
n = 8 * len(labels)  # one test cell a label (5: the fewest the quality figures take), 7 train
obs = pd.DataFrame({config.label_key: [labels[i % len(labels)] for i in range(n)],
                    "split": ["test" if i < len(labels) else "train" for i in range(n)]},
                   index=[f"cell{i}" for i in range(n)])
counts = np.random.default_rng(0).poisson(3.0, (n, config.num_genes)).astype(np.float32)
ad.AnnData(counts, obs=obs, var=pd.DataFrame(index=list(config.genes))).write_h5ad(sys.argv[2])
print(f"wrote {sys.argv[2]}: {n} cells, {config.num_genes} genes, labels {labels}")'
  step emulated_heldout "$PY" -c "$heldout_py" "$tiny" "$OUT/emulated_heldout.h5ad"
  step cuda_lane env SEDD_EMULATE_CUDA=1 "$PY" -m pytest -q -p no:cacheprovider -rfE "${lane_tests[@]}"
  step compare_cells env PYTHONPATH="$REPO/scripts${PYTHONPATH:+:$PYTHONPATH}" "${emu[@]}" \
    gpu_compare_cells --num-conditions 2 --cells 1 --steps 3 --rows-per-forward 2 \
    --require-identical --out "$OUT/compare_cells.json"
  step bench_bundled_shape "${emu[@]}" sedd.cli bench --device cuda --shapes 32/1/2 \
    --num-genes 48 --num-bins 20 --batch-sizes 4 --steps 2 --repeats 1 \
    --out "$OUT/bench_bundled_shape.json"
  step bench_k562_shape "${emu[@]}" sedd.cli bench --device cuda --shapes 32/1/2 \
    --num-genes 256 --num-bins 64 --batch-sizes 2 --steps 2 --repeats 1 \
    --out "$OUT/bench_k562_shape.json"
  step bench_compare "${emu[@]}" sedd.cli bench --compare --device cuda --model "$tiny" \
    --data "$OUT/emulated_heldout.h5ad" --precision fp32 --chunks 1 --out "$OUT/bench_compare.json"
  for graphs in no-cuda-graphs cuda-graphs; do
    step "overhead_small_$graphs" "${emu[@]}" sedd.cli bench --overhead --device cuda "--$graphs" \
      --rows 1 4 --ticks 1 --out "$OUT/overhead_small_$graphs.json"
    step "overhead_bundled_$graphs" "${emu[@]}" sedd.cli bench --overhead --device cuda \
      "--$graphs" --rows 1 4 --ticks 1 --model models/pbmc_default \
      --out "$OUT/overhead_bundled_$graphs.json"
  done
fi
if ((ran == 0)); then
  echo "gpu_check: --only/--skip left no step to run (--list shows them)" >&2
  exit 2
fi
"$PY" scripts/gpu_report.py "$OUT" || status=1
echo "gpu_check ($MODE): done in ${SECONDS} s"
exit $status
