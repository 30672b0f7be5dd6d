#!/usr/bin/env bash
# inf_generation.sh - st3's generation job: scripts/inference_generation.py, in shards, then
# `sedd merge`. Every variable st3's bash/inf_generation.sh reads means what it means there; a
# variable left unset passes no flag, so CONFIG's YAML (then st3's defaults) decide.
#
# st3's variables (EXPERIMENT_DIR required):
#   EXPERIMENT_DIR   st3 experiment dir (args.json + best.pt ...) or a sedd model dir
#   CONFIG           st3 YAML (inference.num_generate, reference_data, output_path, ...)  --config
#   CHECKPOINT       checkpoint file, as given (st3: from the cwd)          --checkpoint
#   REFERENCE_DATA   h5ad whose var_names name the genes                    --reference_data
#   OUTPUT_PATH      the h5ad to write (default: CONFIG's inference.output_path, else
#                    $OUTPUT_DIR/generated_cells.h5ad)                       --output_path
#   NUM_GENERATE     cells to generate (default 100, st3's)                 --num_generate
#   NUM_STEPS        reverse diffusion steps (default 100, st3's)           --num_steps
#   TEMPERATURE      sampling temperature (default 1.0)                     --temperature
#   SEED             cell i draws from stream (SEED, i) (default 42)        --seed
#   KEEP_SPARSE      true: accepted, noted (sedd always writes sparse X)    --keep_sparse
# sedd's own:
#   OVERWRITE=1      replace an earlier result (default: refuse, before any sampling)
#   GENES_FILE       gene names (default: the experiment's genes.json/genes.txt)  --genes
#   PRECISION        auto | bf16 | fp16 | fp32 (default bf16, st3's)       --precision
#   BATCH_SIZE       cells in flight (never changes a cell)                 --batch_size
#   OUTPUT_DIR       shards + result (default $EXPERIMENT_DIR/inference)
#   NUM_SHARDS, SHARD_INDEX, SUBMIT_MERGE, SEDD: see scripts/sharded_run.sh
# Arguments after the script name are passed on; NAME=VALUE words set these variables.
#
# Without SLURM it runs every shard in turn and merges:
#   EXPERIMENT_DIR=exp/mlm NUM_GENERATE=20 bash scripts/inf_generation.sh
# On SLURM, slurm/inf_gen.sbatch runs it once per array task (one shard each).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/sharded_run.sh"
take_words "$@"
set -- ${WORDS[@]+"${WORDS[@]}"}

require_experiment_dir slurm/inf_gen.sbatch
OUTPUT_DIR=${OUTPUT_DIR:-$EXPERIMENT_DIR/inference}
if [[ -z ${OUTPUT_PATH:-} && -n ${CONFIG:-} ]]; then  # st3's inference.output_path in CONFIG
  OUTPUT_PATH=$("$(sedd_python)" -m sedd.commands.st3_config "$CONFIG" inference.output_path)
fi
if [[ -n ${OUTPUT_PATH:-} ]]; then  # the shards go beside the file they merge into
  OUTPUT_DIR=$(dirname "$OUTPUT_PATH")
  MERGED_FILE=$OUTPUT_PATH
else
  MERGED_FILE=$OUTPUT_DIR/generated_cells.h5ad
fi

cmd=("$(sedd_python)" "$SEDD_REPO/scripts/inference_generation.py"
  --experiment_dir "$EXPERIMENT_DIR" --output_dir "$OUTPUT_DIR")
st3_flag --config CONFIG
st3_flag --checkpoint CHECKPOINT
st3_flag --reference_data REFERENCE_DATA
st3_flag --output_path OUTPUT_PATH
st3_flag --num_generate NUM_GENERATE
st3_flag --num_steps NUM_STEPS
st3_flag --temperature TEMPERATURE
st3_flag --seed SEED
st3_flag --genes GENES_FILE
st3_flag --precision PRECISION
st3_flag --batch_size BATCH_SIZE
case ${KEEP_SPARSE:-false} in
  true) cmd+=(--keep_sparse) ;;
  false) ;;
  *) echo "error: KEEP_SPARSE=$KEEP_SPARSE: use true or false (st3's values)." >&2; exit 2 ;;
esac
[[ ${OVERWRITE:-0} != 1 ]] || cmd+=(--overwrite)
cmd+=("$@")

echo "$(date -Is) $(hostname -s): ${cmd[*]}"
run_sharded "${cmd[@]}"
