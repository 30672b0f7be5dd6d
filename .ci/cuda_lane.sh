#!/usr/bin/env bash
# The emulated CUDA lane alone (sedd.cuda_emulation): SEDD_TEST_DEVICE's CUDA lane on a CPU build
# of torch, whose CUDA device keeps its data on the CPU, over the test paths scripts/lane_tests.py
# derives (the ones gpu_check.sh's cuda_lane step runs). A failure here is a GPU failure: a device
# mix, a host sync where none may be, a graph replay that reads freed memory, cells that differ
# from the CPU's. CI runs the lane inside .ci/gpu_check_emulated.sh (gpu_check's own default);
# this script is the lane without the rest of the check.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t lane < <(.venv/bin/python scripts/lane_tests.py)
((${#lane[@]})) || { echo "cuda_lane: scripts/lane_tests.py named no test path" >&2; exit 2; }
SEDD_EMULATE_CUDA=1 .venv/bin/pytest -q -p no:cacheprovider -rf "${lane[@]}"
