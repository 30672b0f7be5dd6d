#!/usr/bin/env bash
# scripts/gpu_check.sh end to end on the emulated CUDA lane (sedd.cuda_emulation): every step a
# GPU run makes, on tiny shapes, on this CPU. Its timings mean nothing; what it proves is that
# every step runs and that the report (report.md, report.json) is written. It fails if a step
# failed or did not run, or the report is missing; it prints the report either way, and the last
# lines of each failed step's log. A few minutes on a 2-core CPU.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check_emulated.XXXXXX")
trap 'rm -rf "$OUT"' EXIT
start=$SECONDS
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
if [[ -s $OUT/report.json ]] && ! .venv/bin/python -c '
import json, sys
report = json.load(open(sys.argv[1]))
sys.exit(0 if report["emulated"] and not report["failed_steps"] else 1)' "$OUT/report.json"; then
  problems+=("report.json: not an emulated run, or it lists failed steps")
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
