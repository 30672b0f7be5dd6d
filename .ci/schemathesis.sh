#!/usr/bin/env bash
# Property-based API test: schemathesis generates requests from /openapi.json and fails on any
# 5xx answer ("not_a_server_error"). Serves the bundled model with small limits so every
# generated request finishes fast on 2 CPU cores.
#   usage: .ci/schemathesis.sh [max-examples per operation, default 25]
set -euo pipefail
cd "$(dirname "$0")/.."

PY=$(cd "${PY:-.venv/bin}" && pwd)
PORT=${SEDD_CI_PORT:-8765}
MAX_EXAMPLES=${1:-25}
LOG=$(mktemp -t sedd-serve.XXXXXX.log)

export SEDD_MAX_CELLS_PER_REQUEST=2 SEDD_MAX_STEPS=3 SEDD_MAX_QUEUED_JOBS=64
export SEDD_REQUEST_TIMEOUT_S=60 SEDD_MAX_BODY_BYTES=65536 SEDD_PRECISION=fp32
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

"$PY/sedd" serve --host 127.0.0.1 --port "$PORT" --log-level warning >"$LOG" 2>&1 &
SERVER=$!
stop_server() {
    kill -TERM "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
}
trap stop_server EXIT

for _ in $(seq 1 120); do
    if curl -fsS "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1; then break; fi
    if ! kill -0 "$SERVER" 2>/dev/null; then
        echo "sedd serve exited before it was ready:" >&2; cat "$LOG" >&2; exit 1
    fi
    sleep 1
done
curl -fsS "http://127.0.0.1:$PORT/readyz" >/dev/null || { echo "not ready after 120 s" >&2; exit 1; }

status=0
# run from a scratch directory: schemathesis keeps a replay store in ./.schemathesis
WORK=$(mktemp -d -t sedd-schemathesis.XXXXXX)
(cd "$WORK" && "$PY/schemathesis" run "http://127.0.0.1:$PORT/openapi.json" \
    --checks not_a_server_error \
    --max-examples "$MAX_EXAMPLES" \
    --workers 1 \
    --request-timeout 60 \
    --generation-database none \
    --seed 0) || status=$?
rm -rf "$WORK"

if grep -q "Traceback" "$LOG"; then
    echo "the server logged a traceback:" >&2; grep -A 30 "Traceback" "$LOG" >&2; status=1
fi
exit "$status"
