"""The API key is on or off, never both (issue "Hardening, round 5", item 4): an empty
``SEDD_API_KEY=`` is a start-up error (it logged "API key off", then answered 401 to requests
without a header and 200 to ``Authorization: Bearer`` with nothing after it), and a key is
compared as UTF-8 bytes (a non-ASCII key matched its latin-1 encoding, not its UTF-8 one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError
from server_client import make_settings, serve_subprocess, served, server_env
from server_models import save_tiny_model

from sedd.defaults import DEFAULT_MODEL

KEY = "clé-ünï"  # not ASCII: its UTF-8 and its latin-1 bytes differ


def _bearer(raw: bytes) -> dict[str, bytes]:
    return {"Authorization": b"Bearer " + raw}


# what each way of sending the key gets (the latin-1 bytes used to be the ones that matched)
SENT = {
    "utf-8": _bearer(KEY.encode("utf-8")),
    "latin-1": _bearer(KEY.encode("latin-1")),
    "empty bearer": {"Authorization": b"Bearer"},  # (HTTP drops a trailing space)
    "no header": {},
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("api_key") / "tiny")


def test_an_empty_key_stops_sedd_serve_in_one_line() -> None:
    argv = [sys.executable, "-m", "sedd.cli", "serve", "--port", "1"]
    for empty in ("", "   "):
        done = subprocess.run(argv, env=server_env(SEDD_API_KEY=empty), capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        assert "SEDD_API_KEY is set but empty; unset it to serve without a key" in lines[0]


def test_a_key_with_whitespace_around_it_is_refused() -> None:
    with pytest.raises(ValidationError, match="starts or ends with whitespace"):
        make_settings(DEFAULT_MODEL, api_key=" key ")


WANT = {"utf-8": 200, "latin-1": 401, "empty bearer": 401, "no header": 401}


@pytest.mark.anyio
async def test_the_key_is_compared_as_utf8_bytes(model_dir: Path) -> None:
    async with served(make_settings(model_dir, api_key=KEY)) as (client, _):
        got = {name: (await client.get("/v1/models", headers=headers)).status_code
               for name, headers in SENT.items()}  # fmt: skip
    assert got == WANT


@pytest.mark.slow
def test_the_key_is_compared_as_utf8_bytes_over_real_http() -> None:
    flags = ["--precision", "fp32", "--device", "cpu", "--log-level", "warning"]
    with serve_subprocess(*flags, SEDD_API_KEY=KEY) as url:
        got = {name: httpx.get(f"{url}/v1/models", headers=headers, timeout=30).status_code
               for name, headers in SENT.items()}  # fmt: skip
    assert got == WANT
