#!/usr/bin/env bash
# CI: a real one-node SLURM cluster runs slurm/inf_cond.sbatch as docs/slurm.md documents.
#   1. an uninterrupted array + chained merge; the merged h5ad is checked;
#   2. a second array with one task cancelled mid-shard: its merge must be cancelled, not run;
#      the same sbatch command is resubmitted and the merged result must equal run 1 (X, obs).
# Runs as root on Debian 12 (installs munge + slurm-wlm daemons if missing). Needs .venv (the
# README's install). Exit status 0 = all passed. Knob: CI_SLURM_TIMEOUT (s per wait, default 300).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
T0=$SECONDS
TIMEOUT=${CI_SLURM_TIMEOUT:-300}
WORK=$(mktemp -d /tmp/sedd_ci_slurm.XXXXXX)
export LOCAL_CLUSTER_DIR=$WORK/cluster
# The CI node has no GPU: a placeholder GRES lets the unmodified '#SBATCH --gres=gpu:1' schedule.
export LOCAL_CLUSTER_GPUS=1
export PATH=$REPO/.venv/bin:$PATH  # the jobs inherit it (sbatch exports the environment)
# 2 shared cores: one torch thread per job is faster than two competing ones (jobs inherit it)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
PY=$REPO/.venv/bin/python

say() { printf '[ci/slurm %4ds] %s\n' $((SECONDS - T0)) "$*"; }

diagnose() {
  say "--- diagnostics: squeue"
  squeue -a -o '%.18i %.20j %.10T %.12r %.10M %E' || true
  say "--- scontrol show job (jobs known to the controller)"
  scontrol show job -o 2>/dev/null | cut -c1-400 || true
  say "--- sacct needs slurmdbd (not run here); job completion log instead"
  cat "$LOCAL_CLUSTER_DIR/log/jobcomp.log" 2>/dev/null || true
  local f
  for f in "$REPO"/sedd-inf-cond-*.out "$REPO"/sedd-inf-cond-merge-*.out; do
    [[ -f $f ]] || continue
    say "--- $f (tail)"
    tr '\r' '\n' <"$f" | grep -v '%|' | tail -n 25 || true
  done
  say "--- slurmctld.log (tail)"
  tail -n 20 "$LOCAL_CLUSTER_DIR/log/slurmctld.log" 2>/dev/null || true
}

cleanup() {
  local rc=$?
  set +e
  ((rc == 0)) || diagnose
  mkdir -p "$WORK/logs"
  mv "$REPO"/sedd-inf-cond-*.out "$WORK/logs/" 2>/dev/null
  slurm/local_cluster.sh stop
  if ((rc == 0)); then
    rm -rf "$WORK/model" "$WORK/run1" "$WORK/run2"
    say "PASSED in $((SECONDS - T0)) s (logs: $WORK/logs)"
  else
    say "FAILED (exit $rc) after $((SECONDS - T0)) s (work dir kept: $WORK)"
  fi
  exit "$rc"
}

fail() { say "FAIL: $*"; exit 1; }

wait_gone() {  # wait_gone JOB: until no task of JOB is pending or running (bounded)
  local _
  for _ in $(seq $((TIMEOUT * 2))); do
    [[ -z $(squeue -h -j "$1" 2>/dev/null) ]] && return 0
    sleep 0.5
  done
  fail "job $1 still queued after $TIMEOUT s"
}

job_state() {  # job_state JOB -> e.g. COMPLETED, CANCELLED (+ reason)
  scontrol show job -o "$1" | grep -o 'JobState=[A-Z_]* Reason=[^ ]*' | head -1
}

merge_job_of() {  # merge_job_of OUTPUT_DIR ARRAY_JOB: the merge job the array's first task submitted
  local f="$1/.merge_jobs/$2/job_id" _
  for _ in $(seq $((TIMEOUT * 2))); do [[ -s $f ]] && break; sleep 0.5; done
  [[ -s $f ]] || fail "array $2 submitted no merge job ($f missing)"
  cat "$f"
}

submit() {  # submit OUTPUT_DIR: docs/slurm.md's command, settings in the environment
  OUTPUT_DIR=$1 sbatch --parsable slurm/inf_cond.sbatch | cut -d';' -f1
}

check_merged() {  # check_merged FILE [--same-as OTHER]
  "$PY" scripts/check_merged.py "$1" --model "$EXPERIMENT_DIR" \
    --perturbations-file "$PERTURBATIONS_FILE" --cells-per-perturbation "$NUM_SAMPLES_PER_PERT" \
    --no-control "${@:2}" || fail "merged file check failed: $1"
}

trap cleanup EXIT
slurm/local_cluster.sh install
slurm/local_cluster.sh start

# The bundled model may be retrained while this runs: both runs use one frozen copy.
cp -rL models/pbmc_default "$WORK/model"  # -L: models/pbmc_default links to sedd/bundled
# two perturbations other than the control (st3's script generates exactly the listed ones)
"$PY" -c 'import json, sys
c = json.load(open(sys.argv[1]))
print("\n".join([p for p in c["perturbations"] if p != c.get("control_label")][:2]))' \
  "$WORK/model/config.json" >"$WORK/perturbations.txt"
export EXPERIMENT_DIR=$WORK/model PERTURBATIONS_FILE=$WORK/perturbations.txt
export NUM_SAMPLES_PER_PERT=3 NUM_STEPS=40 BATCH_SIZE=1 SEED=7 PRECISION=fp32
say "model copy $EXPERIMENT_DIR; perturbations: $(paste -sd, "$PERTURBATIONS_FILE") (no control: st3 generates the listed ones)"

# --- run 1: uninterrupted -------------------------------------------------------------------
say "run 1: EXPERIMENT_DIR=$EXPERIMENT_DIR sbatch slurm/inf_cond.sbatch"
RUN1=$WORK/run1
A=$(submit "$RUN1")
say "array job $A submitted"
M1=$(merge_job_of "$RUN1" "$A")
say "merge job $M1 chained on afterok:$A"
wait_gone "$A"
wait_gone "$M1"
say "array: $(job_state "$A"); merge: $(job_state "$M1")"
[[ -f $RUN1/generated_cells.h5ad ]] || fail "run 1 left no merged file"
check_merged "$RUN1/generated_cells.h5ad"

# --- run 2: cancel task 1 mid-shard, then resubmit -----------------------------------------
RUN2=$WORK/run2
B=$(submit "$RUN2")
M2=$(merge_job_of "$RUN2" "$B")
say "run 2: array job $B, merge job $M2; waiting for task ${B}_1 to finish its first batch"
# a finished batch of shard 1: a part file (temp files start with '.') in its parts directory
shard1_parts() { find "$RUN2/shards" -path '*shard-00001-of-*.parts-*' -name 'cells-*' 2>/dev/null; }
for _ in $(seq $((TIMEOUT * 5))); do
  [[ -n $(shard1_parts) ]] && break
  sleep 0.2
done
[[ -n $(shard1_parts) ]] || fail "shard 1 never wrote a part file"
[[ -z $(find "$RUN2/shards" -name 'shard-00001-of-*.h5ad') ]] || fail "shard 1 finished too fast"
say "shard 1 has a finished batch and is still sampling: scancel ${B}_1"
scancel "${B}_1"
wait_gone "$B"
wait_gone "$M2"
say "array ${B}_1: $(job_state "${B}_1"); merge $M2: $(job_state "$M2")"
[[ $(job_state "$M2") == *CANCELLED* ]] || fail "merge job $M2 was not cancelled"
[[ ! -e $RUN2/generated_cells.h5ad ]] || fail "a merged file exists although a shard failed"
[[ -z $(find "$RUN2/shards" -name 'shard-00001-of-*.h5ad') ]] || fail "shard 1 is complete?"

say "resubmitting the same command"
C=$(submit "$RUN2")
M3=$(merge_job_of "$RUN2" "$C")
wait_gone "$C"
wait_gone "$M3"
say "array: $(job_state "$C"); merge: $(job_state "$M3")"
grep -h 'already complete\|resuming' "$REPO"/sedd-inf-cond-"$C"_*.out || fail "no shard resumed"
check_merged "$RUN2/generated_cells.h5ad" --same-as "$RUN1/generated_cells.h5ad"

# A cluster without GPUs accepts the same file with the documented override.
sbatch --test-only --gres=none slurm/inf_cond.sbatch 2>&1 | sed 's/^/  /'
