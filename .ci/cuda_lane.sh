#!/usr/bin/env bash
# The emulated CUDA lane (sedd.cuda_emulation): the engine, diffusion, API and server tests with
# SEDD_TEST_DEVICE's CUDA lane on a CPU build of torch, whose CUDA device keeps its data on the
# CPU. A failure here is a GPU failure: a device mix, a host sync where none may be, a graph
# replay that reads freed memory, cells that differ from the CPU's.
set -euo pipefail
cd "$(dirname "$0")/.."
SEDD_EMULATE_CUDA=1 .venv/bin/pytest -q -p no:cacheprovider -rf \
  tests/engine tests/diffusion tests/test_api.py tests/server tests/request
