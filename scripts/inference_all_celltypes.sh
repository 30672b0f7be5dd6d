#!/usr/bin/env bash
# inference_all_celltypes.sh - st3's celltype_cond/bash/inference_all_celltypes.sh: one run of
# scripts/inference_celltype.sh per cell type, each into its own
# <OUTPUT_DIR or EXPERIMENT_DIR/inference_results>/celltype_<name>/.
#
#   bash scripts/inference_all_celltypes.sh --experiment_dir experiments/celltype_model \
#       --cell_types "T cell" "B cell" "Monocyte" "NK cell"
#
# st3's options (each also a variable, as in st3):
#   --experiment_dir DIR      EXPERIMENT_DIR (required)
#   --config YAML             CONFIG (st3 defaulted to its example YAML; here unset passes none)
#   --cell_types A B ...      CELL_TYPES="A,B,..." (comma-separated); neither given: every cell
#                             type of the model, in its order (st3 read args.json's cell_types)
#   --data_path FILE          DATA_PATH (accepted, noted: st3's script reads no cells)
#   --num_samples N           NUM_SAMPLES, cells per perturbation (default 100)
# Every other variable of scripts/inference_celltype.sh applies to each run too (OUTPUT_DIR,
# PERTURBATIONS_FILE, NUM_STEPS, SEED, PRECISION, OVERWRITE=1, ...); NAME=VALUE words set them.
# The first run that fails stops the loop (st3: set -e); runs already written are kept, and a
# rerun refuses them before sampling unless OVERWRITE=1.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/sharded_run.sh"
take_words "$@"
set -- ${WORDS[@]+"${WORDS[@]}"}

cell_types=()
listed=0
while (($# > 0)); do
  case $1 in
    --experiment_dir | --config | --data_path | --num_samples)
      if (($# < 2)); then
        echo "error: $1 needs a value." >&2
        exit 2
      fi
      case $1 in
        --experiment_dir) EXPERIMENT_DIR=$2 ;;
        --config) CONFIG=$2 ;;
        --data_path) DATA_PATH=$2 ;;
        --num_samples) NUM_SAMPLES=$2 ;;
      esac
      shift 2
      ;;
    --cell_types)
      shift
      listed=1
      while (($# > 0)) && [[ $1 != --* ]]; do
        cell_types+=("$1")
        shift
      done
      ;;
    *)
      echo "error: unknown option $1: use --experiment_dir, --config, --cell_types, --data_path" \
        "or --num_samples (st3's), or a variable of scripts/inference_celltype.sh (NAME=VALUE)." >&2
      exit 2
      ;;
  esac
done

if [[ -z ${EXPERIMENT_DIR:-} ]]; then
  echo "error: --experiment_dir (or EXPERIMENT_DIR) is required: the cell-type model to run." >&2
  exit 2
fi
if ((listed)) && ((${#cell_types[@]} == 0)); then
  echo "error: --cell_types names no cell type; name them (\"T cell\" \"B cell\" ...) or leave" \
    "--cell_types out to run every cell type of the model." >&2
  exit 2
fi
if ((${#cell_types[@]} == 0)) && [[ -n ${CELL_TYPES:-} ]]; then
  IFS=',' read -ra cell_types <<<"$CELL_TYPES"
fi
if ((${#cell_types[@]} == 0)); then
  python=$(sedd_python)
  mapfile -t cell_types < <("$python" -m sedd.commands.st3_celltype \
    --experiment_dir "$EXPERIMENT_DIR" ${CHECKPOINT:+--checkpoint "$CHECKPOINT"})
  ((${#cell_types[@]} > 0)) || exit 2  # the lister said why
  echo "cell types of $EXPERIMENT_DIR: ${cell_types[*]}"
fi

NUM_SAMPLES=${NUM_SAMPLES:-100}
export EXPERIMENT_DIR CONFIG="${CONFIG:-}" DATA_PATH="${DATA_PATH:-}" NUM_SAMPLES
echo "generating ${#cell_types[@]} cell types, $NUM_SAMPLES cells per perturbation each"
for cell_type in "${cell_types[@]}"; do
  echo "=== $cell_type"
  CELL_TYPE=$cell_type bash "$SEDD_REPO/scripts/inference_celltype.sh"
done
echo "all ${#cell_types[@]} cell types done:" \
  "${OUTPUT_DIR:-$EXPERIMENT_DIR/inference_results}/celltype_*/"
