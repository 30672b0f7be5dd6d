#!/usr/bin/env bash
# inf_imputation.sh - st3's imputation job: scripts/inference_imputation.py, in one process.
# Unsharded: the scores (accuracy.txt, mae.json, within_{k}.csv, metrics.json) are over every
# hidden entry of the run at once, and one GPU imputes a test split in minutes; a SLURM job
# array is refused (it would run the whole job once per task). st3's variables mean what they
# mean in its bash/inf_imputation.sh; a variable left unset passes no flag, so CONFIG's YAML
# (then st3's defaults) decide, as in st3.
#
# st3's variables (EXPERIMENT_DIR required):
#   EXPERIMENT_DIR   st3 experiment dir (args.json + best.pt ...) or a sedd model dir
#   CONFIG           st3 YAML (data.data_path, inference.mask_ratio, ...)   --config
#   DATA_PATH        h5ad of real counts to mask and impute                 --data_path
# sedd's own (each an st3 flag of the script unless marked):
#   CHECKPOINT       checkpoint file, as given (st3: from the cwd)          --checkpoint
#   MASK_RATIO       fraction of entries hidden and imputed (default 0.2)   --mask_ratio
#   VAL_FRACTION     held-out fraction imputed (default 0.1)                --val_fraction
#   USE_TRAIN_SPLIT  true: impute the other cells of st3's split            --use_train_split
#   NUM_STEPS        reverse diffusion steps (default 50)                   --num_steps
#   TEMPERATURE      sampling temperature (default 1.0)                     --temperature
#   SEED             split, mask and sampling seed (default 42)             --seed
#   BATCH_SIZE       cells a batch (default 32)                             --batch_size
#   NUM_BATCHES      impute the first N batches only (default all)          --num_batches
#   GENES_FILE       gene names (sedd's; default for an st3 model: DATA_PATH's)  --genes
#   PRECISION        auto | bf16 | fp16 | fp32 (sedd's; default fp32, st3's)  --precision
#   OUTPUT_DIR       results (sedd's; default $EXPERIMENT_DIR/imputation_results)  --output_dir
#   OVERWRITE=1      replace an earlier result (sedd's; default: refuse, before any sampling)
#   SEDD             the sedd executable whose Python runs the script (see sharded_run.sh)
# Arguments after the script name are passed on (st3's job script appends "$@" too).
#
#   EXPERIMENT_DIR=models/pbmc_default DATA_PATH=data/pbmc68k_counts.h5ad \
#     bash scripts/inf_imputation.sh
# On SLURM: slurm/inf_imputation.sbatch.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/sharded_run.sh"  # sedd_python, st3_flag, the checks

require_experiment_dir slurm/inf_imputation.sbatch
if [[ -n ${SLURM_ARRAY_TASK_COUNT:-} && ${SLURM_ARRAY_TASK_COUNT} != 1 ]]; then
  echo "error: imputation runs in one process, not as a job array of" \
    "$SLURM_ARRAY_TASK_COUNT tasks: submit slurm/inf_imputation.sbatch without --array." >&2
  exit 2
fi
if [[ -z ${OMP_NUM_THREADS:-} && -n ${SLURM_CPUS_PER_TASK:-} ]]; then
  export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK  # torch would otherwise use every core
fi

cmd=("$(sedd_python)" "$SEDD_REPO/scripts/inference_imputation.py"
  --experiment_dir "$EXPERIMENT_DIR")
st3_flag --config CONFIG
st3_flag --data_path DATA_PATH
st3_flag --checkpoint CHECKPOINT
st3_flag --mask_ratio MASK_RATIO
st3_flag --val_fraction VAL_FRACTION
st3_flag --num_steps NUM_STEPS
st3_flag --temperature TEMPERATURE
st3_flag --seed SEED
st3_flag --batch_size BATCH_SIZE
st3_flag --num_batches NUM_BATCHES
st3_flag --genes GENES_FILE
st3_flag --precision PRECISION
st3_flag --output_dir OUTPUT_DIR
case ${USE_TRAIN_SPLIT:-false} in
  true) cmd+=(--use_train_split) ;;
  false) ;;
  *) echo "error: USE_TRAIN_SPLIT=$USE_TRAIN_SPLIT: use true or false." >&2; exit 2 ;;
esac
[[ ${OVERWRITE:-0} != 1 ]] || cmd+=(--overwrite)
cmd+=("$@")

echo "$(date -Is) $(hostname -s): ${cmd[*]}"
"${cmd[@]}"
echo "results: ${OUTPUT_DIR:-$EXPERIMENT_DIR/imputation_results}"
