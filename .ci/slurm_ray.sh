#!/usr/bin/env bash
# CI: slurm/serve_ray.sbatch on the real one-node SLURM cluster, with CPU replicas: the job
# starts a Ray head, `sedd serve --replicas 2` joins it, the URL file appears, requests reach
# both replicas and give the Python API's cells, and scancel drains it and stops Ray.
# Needs .venv with the ray extra (pip install -e '.[ray]'), root, Debian's slurm-wlm + munge.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
T0=$SECONDS
TIMEOUT=${CI_SLURM_TIMEOUT:-300}
WORK=$(mktemp -d /tmp/sedd_ci_ray.XXXXXX)
export LOCAL_CLUSTER_DIR=$WORK/cluster LOCAL_CLUSTER_GPUS=1
export PATH=$REPO/.venv/bin:$PATH  # sbatch exports the environment to the job
PY=$REPO/.venv/bin/python
JOB=""
say() { printf '[ci/slurm_ray %4ds] %s\n' $((SECONDS - T0)) "$*"; }
fail() { say "FAIL: $*"; exit 1; }

cleanup() {
  local rc=$?
  set +e
  if [[ -n $JOB ]]; then  # let the job's own clean-up run before the cluster stops
    scancel "$JOB" 2>/dev/null
    for _ in $(seq 60); do [[ -z $(squeue -h -j "$JOB" 2>/dev/null) ]] && break; sleep 1; done
  fi
  if ((rc != 0)); then
    say "--- job log (tail)"
    tail -n 40 "$WORK"/sedd-serve-ray-*.out 2>/dev/null
  fi
  slurm/local_cluster.sh stop
  ray stop --force >/dev/null 2>&1  # a failed run must not leave Ray to the next step
  ((rc == 0)) && say "PASSED in $((SECONDS - T0)) s" || say "FAILED (exit $rc); work dir $WORK"
  exit "$rc"
}
trap cleanup EXIT
slurm/local_cluster.sh install
slurm/local_cluster.sh start

# a free port below the ephemeral range, where Ray's own processes pick theirs
PORT=$("$PY" -c 'import socket
for port in range(20000, 30000):
    try:
        socket.create_server(("", port)).close()
        print(port)
        break
    except OSError:
        pass')
export URL_FILE=$WORK/url.txt PORT SEDD_PRECISION=fp32 SEDD_DEVICE=cpu SEDD_LOG_LEVEL=warning
JOB=$(sbatch --parsable --gres=none --cpus-per-task=2 --mem=8G --output="$WORK/%x-%j.out" \
  slurm/serve_ray.sbatch | cut -d';' -f1)
say "job $JOB: sbatch --gres=none --cpus-per-task=2 slurm/serve_ray.sbatch"
for _ in $(seq "$TIMEOUT"); do
  [[ -s $URL_FILE ]] && break
  [[ -n $(squeue -h -j "$JOB" 2>/dev/null) ]] || fail "job $JOB ended before writing $URL_FILE"
  sleep 1
done
[[ -s $URL_FILE ]] || fail "no URL in $URL_FILE after $TIMEOUT s"
URL=$(cat "$URL_FILE")
say "the job serves at $URL"

"$PY" - "$URL" <<'PYEOF' || fail "requests to the replicas"
import sys, time
import httpx, numpy as np, torch
import sedd

url = sys.argv[1]
seen, answers = set(), {}
for seed in range(40):  # until both replicas have answered
    reply = httpx.post(f"{url}/generate", json={"steps": 3, "seed": seed}, timeout=120)
    assert reply.status_code == 200, reply.text
    seen.add(reply.headers["x-sedd-replica"])
    answers[seed] = reply.json()["counts"]
    if len(seen) == 2:
        break
assert len(seen) == 2, f"requests reached {seen}"
torch.set_num_threads(1)
model = sedd.load(device="cpu", precision="fp32")
for seed in (0, max(answers)):
    want = model.generate(1, condition=model.default_condition, steps=3, seed=seed, progress=False).X
    np.testing.assert_array_equal(np.asarray(answers[seed]), want.toarray())
print(f"  {len(answers)} requests reached both replicas {sorted(seen)}; cells equal the API's")
PYEOF

say "scancel --signal=TERM --batch $JOB: the replicas drain, Ray stops, the job ends"
scancel --signal=TERM --batch "$JOB"
for _ in $(seq "$TIMEOUT"); do
  [[ -z $(squeue -h -j "$JOB" 2>/dev/null) ]] && break
  sleep 1
done
[[ -z $(squeue -h -j "$JOB" 2>/dev/null) ]] || fail "job $JOB still running after scancel"
JOB=""
[[ ! -e $URL_FILE ]] || fail "the URL file outlived the service"
for _ in $(seq 30); do pgrep -f 'ray::|raylet' >/dev/null || break; sleep 1; done
! pgrep -f 'raylet' >/dev/null || fail "Ray still runs after the job ended"
