#!/usr/bin/env bash
# scripts/gpu_check.sh's default run, end to end, on the emulated CUDA lane (sedd.cuda_emulation):
# every step a GPU run makes, the cuda_lane step over the very test paths a GPU run takes
# (scripts/lane_tests.py derives them; no list of ours overrides it), the other steps on tiny
# shapes, all on this CPU. Its timings mean nothing; what it proves is that every lane test
# passes on emulated CUDA, every step runs, and the report (report.md, report.json) is written
# with every section. It fails if a step failed or did not run, the lane ran no test or had a
# failure, or the report misses a section; it prints the report either way, and the last lines
# of each failed step's log. About 15 minutes on a quiet 2-core CPU, 9 of them the lane.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check_emulated.XXXXXX")
trap 'rm -rf "$OUT"' EXIT
start=$SECONDS
unset LANE_TESTS  # gpu_check's own default: the lane scripts/lane_tests.py derives
OUT=$OUT bash scripts/gpu_check.sh --emulated
check=$?
mapfile -t expected < <(bash scripts/gpu_check.sh --emulated --list | awk '$1 != "total" { print $1 }')
problems=()
((${#expected[@]})) || problems+=("gpu_check.sh --list named no step")
for name in "${expected[@]}"; do
  if [[ ! -f $OUT/$name.status ]]; then
    problems+=("$name: did not run")
  elif [[ $(cut -d' ' -f1 "$OUT/$name.status") != ok ]]; then
    problems+=("$name: $(cut -d' ' -f1 "$OUT/$name.status") (exit $(cut -d' ' -f2 "$OUT/$name.status"))")
    echo "--- last lines of $name.log"
    tail -n 15 "$OUT/$name.log"
  fi
done
for file in report.md report.json; do
  [[ -s $OUT/$file ]] || problems+=("$file: not written")
done
if [[ -s $OUT/report.json ]]; then
  # every section the report has: the steps, the lane, cells, bf16/fp32, K562, MFU, graphs, overhead
  mapfile -t report_problems < <(.venv/bin/python -c '
import json, re, sys
report = json.load(open(sys.argv[1]))
md = open(sys.argv[2]).read()
if not report["emulated"] or report["failed_steps"]:
    print("report.json: not an emulated run, or it lists failed steps")
for key in ("steps", "cuda_lane", "compare_cells", "bf16_vs_fp32", "k562_engine", "mfu",
            "cuda_graphs_on_off", "results"):
    if not report.get(key):
        print(f"report.json: no {key} section")
for heading in ("## Steps", "## CUDA graphs on against off", "## Host overhead per engine tick"):
    if heading not in md:
        print(f"report.md: no {heading!r} section")
lane = report.get("cuda_lane") or {}
summary = lane.get("summary") or "no summary line"
if not re.search(r"\d+ passed", summary) or re.search(r"failed|error|no tests ran", summary):
    print(f"the lane: {summary}")
if lane.get("failed_tests") or lane.get("interrupted"):
    print("the lane: failed tests, or it was stopped")' "$OUT/report.json" "$OUT/report.md")
  problems+=("${report_problems[@]}")
fi
if [[ -s $OUT/report.md ]]; then
  echo "--- report.md"
  cat "$OUT/report.md"
fi
echo "--- gpu_check --emulated: ${#expected[@]} steps in $((SECONDS - start)) s (exit $check)"
if ((${#problems[@]} || check != 0)); then
  printf 'FAILED: %s\n' "${problems[@]:-gpu_check.sh exited $check}"
  exit 1
fi
echo "every step ran; report.md and report.json written"
