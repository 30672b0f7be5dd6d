# sharded_run.sh - shared by scripts/inf_conditional.sh and scripts/inf_generation.sh (sourced,
# not run). `run_sharded CMD...` runs one scripts/inference_*.py command in the right shard
# mode (with one shard the command writes its result itself and there is nothing to merge):
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
# rerun after an interruption, until the merged file exists: then a rerun is refused before any
# sampling unless OVERWRITE=1. Needs OUTPUT_DIR and MERGED_FILE set by the caller.

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

# The Python of that environment (it runs the st3-compatible scripts/inference_*.py).
sedd_python() {
  local sedd
  sedd=$(sedd_executable) || return 1
  if [[ -x $(dirname "$sedd")/python ]]; then
    echo "$(dirname "$sedd")/python"
  else
    command -v python3
  fi
}

# take_words "$@": DCM's README form, `bash scripts/inf_conditional.sh EXPERIMENT_DIR=exp
# CELL_TYPE=hepg2`: each leading NAME=VALUE word sets that variable, as if it were in the
# environment. The other words are left in the global WORDS array (passed on to the script,
# which reads KEY=VALUE words of its own flags too).
take_words() {
  WORDS=()
  local word
  for word in "$@"; do
    if [[ $word =~ ^([A-Z][A-Z0-9_]*)=(.*)$ ]]; then
      printf -v "${BASH_REMATCH[1]}" '%s' "${BASH_REMATCH[2]}"
      export "${BASH_REMATCH[1]?}"
      echo "note: $word read as the variable ${BASH_REMATCH[1]}" >&2
    else
      WORDS+=("$word")
    fi
  done
}

# st3_flag FLAG VAR: append FLAG "$VAR" to the global cmd array when VAR is set and not empty
# (an unset variable passes nothing, so --config's YAML or the script's default decides).
st3_flag() {
  local value=${!2:-}
  [[ -z $value ]] || cmd+=("$1" "$value")
}

# EVALUATE=true needs the test cells: from TEST_DATA_PATH, or data.test_data_path in CONFIG
# (the script checks that before sampling). Anything else but false is refused.
check_evaluate() {
  case ${EVALUATE:-false} in
    true) cmd+=(--evaluate) ;;
    false) ;;
    *) echo "error: EVALUATE=$EVALUATE: use true or false (st3's values)." >&2; exit 2 ;;
  esac
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
    --export="ALL,OUTPUT_DIR=$OUTPUT_DIR,MERGED_FILE=$MERGED_FILE,OVERWRITE=${OVERWRITE:-0},EVALUATE=${EVALUATE:-false}" \
    "${SLURM_SUBMIT_DIR:-.}/slurm/merge.sbatch")
  echo "${job%%;*}" >"$marker/job_id"
  echo "submitted merge job ${job%%;*} (runs after array $SLURM_ARRAY_JOB_ID succeeds)"
}

# The merge, with OVERWRITE=1 replacing an earlier merged file; then, when the run asked for
# --evaluate (EVALUATE=true, recorded in generation_metadata.json), `sedd evaluate` on it.
merge_now() {
  local overwrite=()
  [[ ${OVERWRITE:-0} != 1 ]] || overwrite=(--overwrite)
  "$(sedd_executable)" merge "$OUTPUT_DIR" --out "$MERGED_FILE" "${overwrite[@]}"
  if [[ ${EVALUATE:-false} == true ]]; then
    "$(sedd_python)" -m sedd.commands.st3_evaluate "$MERGED_FILE"
  fi
}

# OVERWRITE=1 without SLURM starts over: the shards of the earlier request go first (an array's
# tasks run at once, so there they are never removed: delete OUTPUT_DIR by hand).
start_over() {
  [[ ${OVERWRITE:-0} == 1 ]] || return 0
  rm -rf "$OUTPUT_DIR/shards" "$OUTPUT_DIR/request.json"
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
    if ((num == 1)); then  # one shard: the script writes the result itself, no merge
      "$@"
      return
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
    if ((num == 1)); then
      "$@"
      return
    fi
    start_over
    for ((index = 0; index < num; index++)); do
      "$@" --num-shards "$num" --shard-index "$index"
    done
    merge_now
  fi
}
