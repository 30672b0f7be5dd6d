#!/usr/bin/env bash
# merge_shards.sh - `sedd merge OUTPUT_DIR --out MERGED_FILE`; what slurm/merge.sbatch runs.
# sedd merge checks that every shard is present, with no duplicates and the expected cell
# count, before it writes; an existing MERGED_FILE is replaced only with OVERWRITE=1. With
# EVALUATE=true (st3's), `sedd evaluate` then runs on it, as the run's metadata says.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/sharded_run.sh"

if [[ -z ${OUTPUT_DIR:-} ]]; then
  echo "error: OUTPUT_DIR is not set: the directory whose shards/ should be merged." >&2
  exit 2
fi
MERGED_FILE=${MERGED_FILE:-$OUTPUT_DIR/generated_cells.h5ad}
echo "$(date -Is) $(hostname -s): merging $OUTPUT_DIR into $MERGED_FILE"
merge_now
