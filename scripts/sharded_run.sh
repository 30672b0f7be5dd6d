# sharded_run.sh - shared by scripts/inf_conditional.sh and scripts/inf_generation.sh (sourced,
# not run). `run_sharded CMD...` runs one `sedd predict|generate ... --out-dir DIR` command in the
# right shard mode:
#
#   inside a SLURM job array   this task's shard: NUM_SHARDS = SLURM_ARRAY_TASK_COUNT and
#                              SHARD_INDEX = SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN (or, when
#                              NUM_SHARDS is set, SHARD_INDEX = SLURM_ARRAY_TASK_ID, so that
#                              `NUM_SHARDS=4 sbatch --array=2 ...` reruns shard 2 of 4 alone).
#                              The first task to start submits slurm/merge.sbatch once per array,
#                              with --dependency=afterok:<array job> --kill-on-invalid-dep=yes.
#   SHARD_INDEX set            that one shard of NUM_SHARDS (default 1); no merge.
#   otherwise                  every shard 0..NUM_SHARDS-1 in turn, then `sedd merge`.
#
# Completed shards are skipped and partial ones resumed by sedd itself, so any of these can be
# rerun after an interruption. Needs OUTPUT_DIR and MERGED_FILE set by the caller.

# The sedd executable: $SEDD if set, else `sedd` on PATH, else this repository's .venv (found
# from this script's own location, so no environment needs activating, from any directory).
SEDD_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
sedd_executable() {
  if [[ -n ${SEDD:-} ]]; then
    echo "$SEDD"
  elif command -v sedd >/dev/null; then
    command -v sedd
  elif [[ -x $SEDD_REPO/.venv/bin/sedd ]]; then
    echo "$SEDD_REPO/.venv/bin/sedd"
  else
    echo "error: no 'sedd' executable: activate the environment, or set SEDD=/path/to/sedd" >&2
    return 1
  fi
}

require_experiment_dir() {
  if [[ -z ${EXPERIMENT_DIR:-} ]]; then
    echo "error: EXPERIMENT_DIR is not set. Point it at a model: an st3 experiment directory" \
      "or a native model directory, e.g." >&2
    echo "  EXPERIMENT_DIR=models/pbmc_default sbatch $1" >&2
    exit 2
  fi
  if [[ ! -e $EXPERIMENT_DIR ]]; then
    echo "error: EXPERIMENT_DIR=$EXPERIMENT_DIR does not exist (relative paths are taken from" \
      "$PWD)." >&2
    exit 2
  fi
}

# Submit the merge job for this array once: the first task to create the marker directory wins.
submit_merge_once() {
  local marker_root="$OUTPUT_DIR/.merge_jobs" marker job
  marker="$marker_root/$SLURM_ARRAY_JOB_ID"
  [[ ${SUBMIT_MERGE:-1} == 1 ]] || return 0
  mkdir -p "$marker_root"
  mkdir "$marker" 2>/dev/null || return 0
  job=$(sbatch --parsable \
    --job-name="${SLURM_JOB_NAME:-sedd}-merge" \
    --dependency="afterok:$SLURM_ARRAY_JOB_ID" \
    --kill-on-invalid-dep=yes \
    --export="ALL,OUTPUT_DIR=$OUTPUT_DIR,MERGED_FILE=$MERGED_FILE" \
    "${SLURM_SUBMIT_DIR:-.}/slurm/merge.sbatch")
  echo "${job%%;*}" >"$marker/job_id"
  echo "submitted merge job ${job%%;*} (runs after array $SLURM_ARRAY_JOB_ID succeeds)"
}

merge_now() {
  "$(sedd_executable)" merge "$OUTPUT_DIR" --out "$MERGED_FILE"
}

run_sharded() {
  local num index
  if [[ -n ${OMP_NUM_THREADS:-} || -z ${SLURM_CPUS_PER_TASK:-} ]]; then :; else
    export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK  # torch would otherwise use every core
  fi
  if [[ -n ${SLURM_ARRAY_JOB_ID:-} ]]; then
    if [[ -n ${NUM_SHARDS:-} ]]; then
      num=$NUM_SHARDS
      index=$SLURM_ARRAY_TASK_ID
    else
      num=$SLURM_ARRAY_TASK_COUNT
      index=$((SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN))
    fi
    if ((index < 0 || index >= num)); then
      echo "error: array task $SLURM_ARRAY_TASK_ID maps to shard $index of $num: use a" \
        "contiguous --array=0-$((num - 1)), or set NUM_SHARDS." >&2
      exit 2
    fi
    submit_merge_once
    echo "array $SLURM_ARRAY_JOB_ID task $SLURM_ARRAY_TASK_ID: shard $index of $num"
    "$@" --num-shards "$num" --shard-index "$index"
  elif [[ -n ${SHARD_INDEX:-} ]]; then
    "$@" --num-shards "${NUM_SHARDS:-1}" --shard-index "$SHARD_INDEX"
    echo "shard $SHARD_INDEX done; when every shard is, run: sedd merge $OUTPUT_DIR" \
      "--out $MERGED_FILE"
  else
    num=${NUM_SHARDS:-1}
    for ((index = 0; index < num; index++)); do
      "$@" --num-shards "$num" --shard-index "$index"
    done
    merge_now
  fi
}
