#!/usr/bin/env bash
# inference_celltype.sh - st3's celltype_cond/bash/inference_celltype.sh: perturbed cells of one
# cell type, by scripts/inference_celltype_perturbseq.py, into
# <OUTPUT_DIR or EXPERIMENT_DIR/inference_results>/celltype_<name>/ (generated_cells.h5ad,
# generation_config.json). Each variable means what it means in st3's script:
#
#   CELL_TYPE            the cell type to generate                      --cell_type
#   EXPERIMENT_DIR       st3 experiment dir (args.json + final.pt ...)   --experiment_dir
#   CONFIG               st3 YAML (sections data, inference, other)      --config
#   DATA_PATH            accepted, noted (st3's script reads no cells)   --data_path
#   PERTURBATIONS_FILE   perturbations to generate, one a line           --perturbations_file
#   NUM_SAMPLES          cells per perturbation (default 100, passed as in st3, so it wins over
#                        the YAML's inference.num_samples_per_condition)
#                                                                        --num_samples_per_condition
#   OUTPUT_DIR           where the celltype_<name>/ folder goes          --output_dir
# sedd's own (unset: no flag, so CONFIG's YAML, then st3's defaults, decide):
#   NUM_STEPS, TEMPERATURE, SEED, BATCH_SIZE, CHECKPOINT, COND_LABELS_PT_PATH: their flags
#   GENES_FILE           gene names (default: the experiment's genes.json/genes.txt)  --genes
#   PRECISION            auto | bf16 | fp16 | fp32 (default bf16)        --precision
#   OVERWRITE=1          replace an earlier result (default: refuse, before any sampling)
#   SEDD                 the sedd executable (see scripts/sharded_run.sh)
# Unlike st3's, CONFIG has no default (st3's pointed at its example YAML, whose cell type is
# "T cell"), and a run without a cell type is refused, listing the model's (st3 generated every
# cell type into one file; scripts/inference_all_celltypes.sh writes one folder each).
# Arguments are passed on after these (st3 appends "$@" too); NAME=VALUE words set the
# variables, e.g.
#   bash scripts/inference_celltype.sh EXPERIMENT_DIR=experiments/celltype_model CELL_TYPE="T cell"
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/sharded_run.sh"
take_words "$@"
set -- ${WORDS[@]+"${WORDS[@]}"}
NUM_SAMPLES=${NUM_SAMPLES:-100}
given=" $* "
if [[ -z ${EXPERIMENT_DIR:-} && $given != *" --experiment_dir "* &&
  $given != *" --experiment_dir="* ]]; then
  echo "error: EXPERIMENT_DIR is not set (nor --experiment_dir given): the cell-type model to" \
    "run, e.g. CELL_TYPE=\"T cell\" EXPERIMENT_DIR=experiments/celltype_model." >&2
  exit 2
fi

cmd=("$(sedd_python)" "$SEDD_REPO/scripts/inference_celltype_perturbseq.py")
st3_flag --config CONFIG
st3_flag --experiment_dir EXPERIMENT_DIR
st3_flag --cell_type CELL_TYPE
st3_flag --data_path DATA_PATH
st3_flag --perturbations_file PERTURBATIONS_FILE
st3_flag --num_samples_per_condition NUM_SAMPLES
st3_flag --output_dir OUTPUT_DIR
st3_flag --num_steps NUM_STEPS
st3_flag --temperature TEMPERATURE
st3_flag --seed SEED
st3_flag --batch_size BATCH_SIZE
st3_flag --checkpoint CHECKPOINT
st3_flag --cond_labels_pt_path COND_LABELS_PT_PATH
st3_flag --genes GENES_FILE
st3_flag --precision PRECISION
[[ ${OVERWRITE:-0} != 1 ]] || cmd+=(--overwrite)
cmd+=("$@")

if [[ -z ${OMP_NUM_THREADS:-} && -n ${SLURM_CPUS_PER_TASK:-} ]]; then
  export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK  # torch would otherwise use every core
fi
echo "$(date -Is) $(hostname -s): ${cmd[*]}"
"${cmd[@]}"
