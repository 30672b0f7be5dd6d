"""``sedd serve`` under real uvicorn in a subprocess: SIGTERM drains as the README says, and
start-up faults are one line. Also the CLI's one-line errors for ordinary OS faults."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_models import save_tiny_model

from sedd.defaults import DEFAULT_MODEL

SEDD = [sys.executable, "-m", "sedd.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "SEDD_DEBUG": "", **extra}


def _start(port: int, drain_s: str) -> subprocess.Popen[str]:
    argv = [*SEDD, "serve", "--port", str(port), "--precision", "fp32", "--device", "cpu"]
    proc = subprocess.Popen(
        argv, env=_env(SEDD_DRAIN_TIMEOUT_S=drain_s), stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"the server did not become ready: {proc.communicate()[1][-2000:]}")


def _post_in_background(url: str, body: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {}

    def post() -> None:
        result["response"] = httpx.post(url, json=body, timeout=120)

    thread = threading.Thread(target=post)
    thread.start()
    result["thread"] = thread
    return result


def _sigterm_with(port: int, drain_s: str, steps: int) -> tuple[Any, httpx.Response, float]:
    """Start, send a ``steps``-step request, SIGTERM while it runs, then one new request.
    Returns (the in-flight response, the new request's response, seconds from SIGTERM to exit)."""
    proc = _start(port, drain_s)
    url = f"http://127.0.0.1:{port}/generate"
    long = _post_in_background(url, {"num_cells": 1, "steps": steps, "condition": "CD19+ B"})
    time.sleep(1.0)  # the request is running
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    time.sleep(0.3)
    late = httpx.post(url, json={"num_cells": 1, "steps": 2}, timeout=30)
    long["thread"].join(timeout=120)
    proc.wait(timeout=60)
    return long["response"], late, time.monotonic() - sent


def test_sigterm_refuses_new_requests_with_json_503_and_finishes_in_flight() -> None:
    in_flight, late, took = _sigterm_with(_free_port(), "20", steps=80)
    assert late.status_code == 503 and late.headers["retry-after"] == "5"
    assert late.json() == {"detail": "the server is shutting down and takes no new requests"}
    assert in_flight.status_code == 200 and len(in_flight.json()["counts"]) == 1
    assert took < 20  # it exits once the in-flight request is answered, not at the limit


def test_a_drain_under_one_second_is_honoured_and_cut_requests_get_json_503() -> None:
    in_flight, late, took = _sigterm_with(_free_port(), "0.5", steps=1000)
    assert late.status_code == 503
    assert in_flight.status_code == 503
    assert in_flight.json() == {"detail": "the server is shutting down and takes no new requests"}
    assert int(in_flight.headers["retry-after"]) >= 1
    assert took < 0.5 + 6  # drain + the exit grace, never the request's own length


def _one_line_failure(argv: list[str], code: int) -> str:
    done = subprocess.run([*SEDD, *argv], env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_serve_refuses_a_checkpoint_with_a_nan_weight_in_one_line(tmp_path: Path) -> None:
    model = save_tiny_model(tmp_path / "nan", nan_label="BAD")
    line = _one_line_failure(["serve", "--model", str(model), "--port", "1"], 2)
    assert line.startswith("sedd serve: error: ")
    assert "non-finite weights (NaN or Inf) in pert_embed.weight" in line


def test_generate_to_an_impossible_path_is_one_line_before_sampling() -> None:
    argv = ["generate", "--num-cells", "1", "--steps", "1", "--out", "/proc/nope/x.h5ad"]
    line = _one_line_failure(argv, 3)
    assert line == (
        "sedd generate: error: /proc/nope: No such file or directory; check the path and its "
        "permissions"
    )


def test_a_config_nested_100k_deep_is_one_line(tmp_path: Path) -> None:
    model = tmp_path / "deep"
    model.mkdir()
    (model / "config.json").write_text('{"schema_version": ' + "[" * 100_000 + "]" * 100_000 + "}")
    (model / "model.safetensors").write_bytes((DEFAULT_MODEL / "model.safetensors").read_bytes())
    line = _one_line_failure(["info", str(model)], 2)
    assert line.endswith("config.json is nested too deeply to be a config; fix or replace it.")


def test_huge_config_dimensions_are_refused_before_allocating(tmp_path: Path) -> None:
    model = tmp_path / "huge"
    model.mkdir()
    config = json.loads((DEFAULT_MODEL / "config.json").read_text())
    config["arch"]["hidden_dim"] = 1 << 20  # ~8 TiB of weights if it were allocated
    (model / "config.json").write_text(json.dumps(config))
    (model / "model.safetensors").symlink_to(DEFAULT_MODEL / "model.safetensors")
    line = _one_line_failure(["info", str(model)], 2)
    assert "shape mismatch for 'token_embed.weight': expected (261, 1048576)" in line


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out_dir = tmp_path_factory.mktemp("merge") / "run"
    argv = ["generate", "--num-cells", "1", "--steps", "1", "--conditions", "CD19+ B"]
    subprocess.run([*SEDD, *argv, "--out-dir", str(out_dir)], env=_env(), check=True,
                   capture_output=True, timeout=120)  # fmt: skip
    return out_dir


@pytest.mark.parametrize("target", ["under-a-file/x.h5ad", "/sys/x.h5ad"])
def test_merge_to_an_unwritable_place_is_one_line(
    tmp_path: Path, sharded_run: Path, target: str
) -> None:
    (tmp_path / "under-a-file").write_text("a file, not a directory")
    out = target if target.startswith("/") else str(tmp_path / target)
    line = _one_line_failure(["merge", str(sharded_run), "--out", out], 3)
    assert line.startswith(f"sedd merge: error: {Path(out).parent}: ")
    assert line.endswith("; check the path and its permissions")
