"""``sedd serve`` as a child process, for the benchmark scripts: started on a free port, waited
on until it answers as ready, and stopped with SIGTERM (so it drains) when the block ends."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import httpx


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServeProcess:
    """``with ServeProcess(flags) as server:`` runs ``sedd serve <flags>`` at ``ServeProcess.url``
    (one torch thread), ready once GET ``ready_path`` gives a response ``ready`` accepts."""

    def __init__(
        self,
        flags: list[str],
        *,
        ready_path: str = "/readyz",
        ready: Callable[[httpx.Response], bool] = lambda response: response.status_code == 200,
        timeout_s: float = 120.0,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [sys.executable, "-m", "sedd.cli", "serve", "--port", str(self.port),
                     "--log-level", "warning", *flags]  # fmt: skip
        self.ready_path, self.ready, self.timeout_s = ready_path, ready, timeout_s

    def __enter__(self) -> ServeProcess:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.process = subprocess.Popen(self.argv, env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)  # fmt: skip
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"sedd serve exited with {self.process.returncode}")
            try:
                if self.ready(httpx.get(f"{self.url}{self.ready_path}", timeout=5)):
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"sedd serve was not ready within {self.timeout_s:g} s")

    def __exit__(self, *exc: object) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(120)
        except subprocess.TimeoutExpired:
            self.process.kill()
