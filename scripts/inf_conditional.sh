#!/usr/bin/env bash
# inf_conditional.sh - predict cells for perturbations with `sedd predict`, in shards.
#
# st3's environment variables (EXPERIMENT_DIR required):
#   EXPERIMENT_DIR        model: st3 experiment dir (args.json + best.pt ...) or native model dir
#   CHECKPOINT            file inside it (st3: best.pt / final.pt / epoch_N.pt; default: best)
#   GENES_FILE            gene names in model order, one a line, or an .h5ad whose var_names
#                         are used (default: genes.txt in EXPERIMENT_DIR; st3 stores no names,
#                         so without either genes are "0".."G-1" and sedd warns loudly)
#   PERTURBATION_MAP      label name -> index file of an st3 perturbation model (JSON or one
#                         name a line; default: the names files in EXPERIMENT_DIR)
#   PERTURBATIONS_FILE    perturbations to predict, one a line (default: every label of the model)
#   NUM_SAMPLES_PER_PERT  cells per perturbation                            (default 10, as st3)
#   CELL_TYPE             condition every cell on this cell type            (default: none)
#   NUM_STEPS             reverse diffusion steps                           (default 50)
#   TEMPERATURE           sampling temperature                              (default 1.0)
#   SEED                  cell i draws from the random stream (SEED, i)     (default 0)
#   PRECISION             auto | bf16 | fp16 | fp32 (auto = bf16 where fast) (default auto)
#   BATCH_SIZE            cells in flight (never changes a cell)            (default 64)
#   OUTPUT_DIR            shards + merged file        (default $EXPERIMENT_DIR/inference_results)
#   MERGED_FILE           merged h5ad                 (default $OUTPUT_DIR/generated_cells.h5ad)
#   NUM_SHARDS, SHARD_INDEX, SUBMIT_MERGE, SEDD: see scripts/sharded_run.sh
#
# Without SLURM it runs every shard in turn and merges:
#   EXPERIMENT_DIR=models/pbmc_default bash scripts/inf_conditional.sh
# On SLURM, slurm/inf_cond.sbatch runs it once per array task (one shard each).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/sharded_run.sh"

require_experiment_dir slurm/inf_cond.sbatch
OUTPUT_DIR=${OUTPUT_DIR:-$EXPERIMENT_DIR/inference_results}
MERGED_FILE=${MERGED_FILE:-$OUTPUT_DIR/generated_cells.h5ad}

cmd=("$(sedd_executable)" predict --model "$EXPERIMENT_DIR"
  --cells-per-perturbation "${NUM_SAMPLES_PER_PERT:-10}"
  --steps "${NUM_STEPS:-50}" --temperature "${TEMPERATURE:-1.0}" --seed "${SEED:-0}"
  --precision "${PRECISION:-auto}" --batch-size "${BATCH_SIZE:-64}" --out-dir "$OUTPUT_DIR")
[[ -z ${CHECKPOINT:-} ]] || cmd+=(--checkpoint "$CHECKPOINT")
[[ -z ${GENES_FILE:-} ]] || cmd+=(--genes "$GENES_FILE")
[[ -z ${PERTURBATION_MAP:-} ]] || cmd+=(--perturbation-map "$PERTURBATION_MAP")
[[ -z ${PERTURBATIONS_FILE:-} ]] || cmd+=(--perturbations-file "$PERTURBATIONS_FILE")
[[ -z ${CELL_TYPE:-} ]] || cmd+=(--cell-type "$CELL_TYPE")

echo "$(date -Is) $(hostname -s): ${cmd[*]}"
run_sharded "${cmd[@]}"
