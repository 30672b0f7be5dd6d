#!/usr/bin/env bash
# inf_conditional.sh - st3's conditional inference job: scripts/inference_conditional.py, in
# shards, then `sedd merge`. Every variable st3's bash/inf_conditional.sh and
# slurm/inf_cond.sbatch read means what it means there; a variable left unset passes no flag, so
# CONFIG's YAML (then the script's st3 defaults) decide, as in st3.
#
# st3's variables (EXPERIMENT_DIR required):
#   EXPERIMENT_DIR        st3 experiment dir (args.json + best.pt ...) or a sedd model dir
#   CONFIG                st3 YAML (sections data, inference, other)     --config
#   CHECKPOINT            checkpoint file, as given (st3: from the cwd)   --checkpoint
#   PERTURBATIONS_FILE    perturbations to predict, one a line            --perturbations_file
#   PERTURBATIONS_ALL_FILE every perturbation in training order (control first); where the
#                         model has a {name: index} file, that file gives the indices
#                                                                         --perturbations_all_file
#   MAPPING_DATA_PATH     accepted, noted (st3 parses it, uses it not)    --mapping_data_path
#   TEST_DATA_PATH        held-out real cells for EVALUATE               --test_data_path
#   NUM_SAMPLES_PER_PERT  cells per perturbation (default 10, st3's)      --num_samples_per_pert
#   NUM_STEPS             reverse diffusion steps (default 50)            --num_steps
#   TEMPERATURE           sampling temperature (default 1.0)              --temperature
#   EVALUATE              true: `sedd evaluate` against TEST_DATA_PATH after the merge
#   CELL_TYPE             condition every cell on this cell type          --cell_type
#   SEED                  cell i draws from stream (SEED, i) (default 42) --seed
# sedd's own:
#   OVERWRITE=1           replace an earlier result in OUTPUT_DIR (default: refuse, before any
#                         sampling); without SLURM it starts over (the old shards are removed)
#   GENES_FILE            gene names (default: the experiment's genes.json/genes.txt) --genes
#   PERTURBATION_MAP      sedd's older name for PERTURBATIONS_ALL_FILE (both set: must agree)
#   COND_LABELS_PT_PATH   perturbation vectors {name: tensor}             --cond_labels_pt_path
#   PRECISION             auto | bf16 | fp16 | fp32 (default bf16, st3's) --precision
#   BATCH_SIZE            cells in flight (never changes a cell)          --batch_size
#   OUTPUT_DIR            shards + result (default $EXPERIMENT_DIR/inference_results); the
#                         result is $OUTPUT_DIR/generated_cells.h5ad + generation_metadata.json
#   NUM_SHARDS, SHARD_INDEX, SUBMIT_MERGE, SEDD: see scripts/sharded_run.sh
# Arguments after the script name are passed on (st3's job scripts append "$@" too);
# NAME=VALUE words set these variables (DCM's README form: EXPERIMENT_DIR=... CELL_TYPE=...).
#
# Without SLURM it runs every shard in turn and merges:
#   EXPERIMENT_DIR=models/pbmc_default bash scripts/inf_conditional.sh
# On SLURM, slurm/inf_cond.sbatch runs it once per array task (one shard each).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/sharded_run.sh"
take_words "$@"
set -- ${WORDS[@]+"${WORDS[@]}"}

if [[ -n ${PERTURBATION_MAP:-} && -n ${PERTURBATIONS_ALL_FILE:-} &&
  $PERTURBATION_MAP != "$PERTURBATIONS_ALL_FILE" ]]; then
  echo "error: PERTURBATIONS_ALL_FILE=$PERTURBATIONS_ALL_FILE and PERTURBATION_MAP=$PERTURBATION_MAP" \
    "name two label files; set PERTURBATIONS_ALL_FILE only." >&2
  exit 2
fi
PERTURBATIONS_ALL_FILE=${PERTURBATIONS_ALL_FILE:-${PERTURBATION_MAP:-}}
require_experiment_dir slurm/inf_cond.sbatch
OUTPUT_DIR=${OUTPUT_DIR:-$EXPERIMENT_DIR/inference_results}
MERGED_FILE=$OUTPUT_DIR/generated_cells.h5ad
ST3_SCRIPT=inference_conditional.py

cmd=("$(sedd_python)" "$SEDD_REPO/scripts/inference_conditional.py"
  --experiment_dir "$EXPERIMENT_DIR" --output_dir "$OUTPUT_DIR")
st3_flag --config CONFIG
st3_flag --checkpoint CHECKPOINT
st3_flag --perturbations_file PERTURBATIONS_FILE
st3_flag --mapping_data_path MAPPING_DATA_PATH
st3_flag --test_data_path TEST_DATA_PATH
st3_flag --num_samples_per_pert NUM_SAMPLES_PER_PERT
st3_flag --num_steps NUM_STEPS
st3_flag --temperature TEMPERATURE
st3_flag --cell_type CELL_TYPE
st3_flag --seed SEED
st3_flag --genes GENES_FILE
st3_flag --perturbations_all_file PERTURBATIONS_ALL_FILE
st3_flag --cond_labels_pt_path COND_LABELS_PT_PATH
st3_flag --precision PRECISION
st3_flag --batch_size BATCH_SIZE
[[ ${OVERWRITE:-0} != 1 ]] || cmd+=(--overwrite)
cmd+=("$@")

check_evaluate
echo "$(date -Is) $(hostname -s): ${cmd[*]}"
run_sharded "${cmd[@]}"
