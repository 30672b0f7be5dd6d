#!/usr/bin/env bash
# CI: the package works the ordinary way, from its wheel, outside the checkout. Builds the wheel,
# checks it carries the bundled model and its data (and not models/pbmc_v1 or the quality
# reports), installs it into a fresh virtual environment in a temporary directory, and there runs
# the README's main job (`sedd serve`, then a POST /generate) and a `sedd generate`.
# Exit status 0 = all passed. Needs python3 and the package registry (torch==2.13.0, as the
# README installs it; pip's cache serves the wheel the first step downloaded).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
WORK=$(mktemp -d /tmp/sedd_wheel.XXXXXX)
say() { printf '[ci/wheel %4ds] %s\n' "$SECONDS" "$*"; }
cleanup() { [[ -n ${SERVER:-} ]] && kill "$SERVER" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

say "building the wheel"
"$REPO/.venv/bin/pip" wheel -q --no-deps -w "$WORK/dist" "$REPO"
WHEEL=$(ls "$WORK"/dist/sedd-*.whl)
"$REPO/.venv/bin/python" - "$WHEEL" <<'PY'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = ["sedd/bundled/pbmc_default/config.json", "sedd/bundled/pbmc_default/model.safetensors",
        "sedd/bundled/pbmc_default/calibration.json", "sedd/bundled/data/pbmc68k_counts.h5ad",
        "sedd/bundled/data/pbmc68k_split.json", "sedd/py.typed", "server/app.py"]
missing = [n for n in need if n not in names]
leaked = sorted(n for n in names if "pbmc_v1" in n or n.startswith("sedd/bundled/pbmc_default/quality"))
if missing or leaked:
    sys.exit(f"wheel {sys.argv[1]}: missing {missing}; must not hold {leaked[:5]}")
print(f"wheel carries the bundled model and data ({len(names)} files), no pbmc_v1, no reports")
PY

say "installing it into a fresh environment outside the checkout"
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q torch==2.13.0 "$WHEEL"
cd "$WORK"  # nothing of the checkout is reachable from here
"$WORK/venv/bin/python" -c "import sedd, sys; p = sedd.__file__
assert '$REPO' not in p, p; print('sedd from', p)"

say "sedd generate from the wheel"
OMP_NUM_THREADS=1 "$WORK/venv/bin/sedd" generate --cells 2 --steps 2 --seed 1 --out "$WORK/cells.h5ad"
"$WORK/venv/bin/python" -c "import anndata; a = anndata.read_h5ad('$WORK/cells.h5ad')
assert a.n_vars == 765 and a.n_obs > 0, a; print('generated', a.shape)"

say "the README's main job from the wheel: sedd serve, then POST /generate"
PORT=$("$WORK/venv/bin/python" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
OMP_NUM_THREADS=1 "$WORK/venv/bin/sedd" serve --port "$PORT" >"$WORK/serve.log" 2>&1 &
SERVER=$!
for _ in $(seq 1 120); do
  if "$WORK/venv/bin/python" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/readyz', timeout=2)" 2>/dev/null; then
    break
  fi
  sleep 1
done
"$WORK/venv/bin/python" - "$PORT" <<'PY'
import json, sys, urllib.request
body = {"num_cells": 2, "steps": 5, "condition": "CD19+ B", "seed": 1}
request = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/generate",
                                 data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
with urllib.request.urlopen(request, timeout=120) as response:  # raises on a non-2xx status
    payload = response.read()
print("POST /generate:", response.status, len(payload), "bytes")
PY
say "PASSED"
