"""``sedd serve --replicas 2`` on a real local Ray cluster, at its edges: Ray's proxy keeps the
connection protections of one process (a head that never completes is closed with a JSON 408 at
the header timeout, connections past ``max_connections`` get a JSON 503, a request that is not
HTTP a JSON 400), a stream whose replica dies ends with an ``error`` event, and SIGTERM drains
like one process: the requests in flight finish, new ones get a JSON 503, and the process exits
0. The drain ends the module's server, so it runs last."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from server_client import free_port

pytest.importorskip("ray.serve", reason="pip install -e '.[ray]' runs these")
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.anyio]

KEY = "replica-overload-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
HEADER_TIMEOUT_S = 3.0
MAX_CONNECTIONS = 8


@dataclass
class Served:
    url: str
    port: int
    process: subprocess.Popen

    def metrics(self) -> list[str]:
        """Every replica's /metrics lines (one scrape, merged by the replica that answers)."""
        text = httpx.get(f"{self.url}/metrics", headers=AUTH, timeout=30).text
        return [line for line in text.splitlines() if line.startswith("sedd_")]

    def replicas(self) -> set[str]:
        """The ids of the replicas that answered /metrics."""
        return {line.split('replica="')[1].split('"')[0] for line in self.metrics()
                if 'replica="' in line}  # fmt: skip

    def active_jobs(self) -> float:
        """Jobs the engines of all replicas are running."""
        return sum(float(line.rsplit(" ", 1)[1]) for line in self.metrics()
                   if 'quantity="active_jobs"' in line)  # fmt: skip

    def wait_for_replicas(self, than: set[str] | None = None, within_s: float = 240) -> None:
        """Until two replicas serve (others than ``than``, when given)."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"sedd serve exited: {self.process.returncode}"
            try:
                now = self.replicas()
                if len(now) == 2 and not (than and now & than):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        pytest.fail(f"two replicas were not serving within {within_s:g} s")


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    port = free_port()
    argv = [sys.executable, "-m", "sedd.cli", "serve", "--replicas", "2", "--port", str(port),
            "--threads-per-replica", "1", "--precision", "fp32", "--device", "cpu",
            "--max-queued-jobs", "4", "--max-steps", "400", "--log-level", "warning",
            "--header-timeout-s", str(HEADER_TIMEOUT_S),
            "--max-connections", str(MAX_CONNECTIONS)]  # fmt: skip
    process = subprocess.Popen(argv, env={**os.environ, "SEDD_API_KEY": KEY})
    server = Served(f"http://127.0.0.1:{port}", port, process)
    try:
        server.wait_for_replicas()
        yield server
    finally:
        if process.poll() is None:  # the drain test did not run (or failed before its signal)
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(120)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def _json_answer(answer: bytes, status: int) -> tuple[bytes, dict]:
    """(head, JSON body) of a raw response, which must be ``status`` in JSON."""
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), answer[:300]
    assert b"content-type: application/json" in head.lower(), head
    return head.lower(), json.loads(body)


def test_half_sent_heads_are_closed_at_the_header_timeout_with_json(served: Served) -> None:
    socks = [socket.create_connection(("127.0.0.1", served.port)) for _ in range(6)]
    for i, sock in enumerate(socks):
        sock.settimeout(HEADER_TIMEOUT_S + 30)
        if i % 2:
            sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\n")  # then nothing
    start = time.monotonic()
    try:
        answers = [_answer(sock) for sock in socks]  # each returns when the proxy closes
    except TimeoutError:
        pytest.fail(f"a half-sent head was still open {HEADER_TIMEOUT_S + 30:g} s later")
    finally:
        for sock in socks:
            sock.close()
    assert time.monotonic() - start < HEADER_TIMEOUT_S + 3
    for answer in answers:
        assert "header_timeout_s" in _json_answer(answer, 408)[1]["detail"]


def test_connections_past_the_cap_get_a_json_503_with_retry_after(served: Served) -> None:
    held = [socket.create_connection(("127.0.0.1", served.port)) for _ in range(MAX_CONNECTIONS)]
    try:
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as extra:
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            head, body = _json_answer(_answer(extra), 503)
    finally:
        for sock in held:
            sock.close()
    assert b"retry-after: 1" in head and "max_connections" in body["detail"]
    time.sleep(0.5)  # the proxy sees the held connections close
    assert httpx.get(f"{served.url}/healthz").status_code == 200


def test_a_request_that_is_not_http_gets_a_json_400(served: Served) -> None:
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Bad: a\x00b\r\n\r\n")
        _, body = _json_answer(_answer(sock), 400)
    assert "not valid HTTP/1.1" in body["detail"]


def _replica_pids(root: int) -> list[int]:
    """The replica processes of the server ``root`` (Ray names them after the deployment; the
    raylet of the Ray that ``root`` started is their parent): not another test run's."""
    found = subprocess.run(["pgrep", "-f", "ServeReplica:sedd"], capture_output=True, text=True)
    return [pid for pid in map(int, found.stdout.split()) if _descends_from(pid, root)]


def _descends_from(pid: int, root: int) -> bool:
    """Whether process ``pid`` is ``root`` or one of its descendants."""
    while pid > 1:
        if pid == root:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:  # it ended
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the parent's id
    return False


def _events(lines: Iterator[str]) -> Iterator[tuple[str, str]]:
    """(event, data) of each SSE event in ``lines``."""
    name = ""
    for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            yield name, line.removeprefix("data: ")


def test_a_stream_whose_replica_dies_ends_with_an_error_event(served: Served) -> None:
    before = served.replicas()
    seen: list[tuple[str, str]] = []
    truncated = None
    with httpx.stream("POST", f"{served.url}/generate/stream", json={"steps": 400, "seed": 3},
                      headers=AUTH, timeout=120) as stream:  # fmt: skip
        assert stream.status_code == 200
        try:
            for event in _events(stream.iter_lines()):
                seen.append(event)
                if event[0] == "progress" and len(seen) == 3:  # running: kill its replica
                    pids = _replica_pids(served.process.pid)
                    assert len(pids) == 2, pids
                    for pid in pids:  # the one serving this stream among them
                        os.kill(pid, signal.SIGKILL)
        except httpx.RemoteProtocolError as err:
            truncated = err
    assert truncated is None, f"the stream was cut off without an event: {truncated}"
    name, data = seen[-1]
    assert name == "error", seen[-3:]
    error = json.loads(data)
    assert error["status"] == 503 and "retry" in error["detail"]
    served.wait_for_replicas(than=before)  # Ray restarts them


class FakeReplicas:
    """Ray's deployment handle as ``drain_replicas`` uses it: each broadcast answers the next
    in-flight counts of ``answers`` (the last one repeats) and is recorded."""

    def __init__(self, *answers: list[int]) -> None:
        self.answers, self.calls = list(answers), []

    def get_deployment_handle(self, *_: object, **__: object) -> FakeReplicas:
        return self

    def broadcast(self, method: str) -> FakeReplicas:
        self.calls.append(method)
        return self

    def results(self, **_: object) -> list[int]:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def test_the_drain_cuts_what_is_left_at_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from server.ray import replicas

    busy = FakeReplicas([1, 0])  # one request that outlives the drain
    monkeypatch.setattr(replicas, "_serve", lambda: busy)
    monkeypatch.setattr(replicas, "EXIT_GRACE_S", 0.3)
    start = time.monotonic()
    replicas.drain_replicas(0.5, threading.Event())
    assert 0.5 <= time.monotonic() - start < 2 and "cut" in busy.calls


def test_a_second_signal_ends_the_drain_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from server.ray import replicas

    busy = FakeReplicas([2, 1])  # never drains by itself
    monkeypatch.setattr(replicas, "_serve", lambda: busy)
    cut = threading.Event()
    threading.Timer(0.5, cut.set).start()
    start = time.monotonic()
    replicas.drain_replicas(60, cut)
    assert time.monotonic() - start < 2 and busy.calls[-1] == "cut"
    idle = FakeReplicas([1, 0], [0])  # drains: no cut
    monkeypatch.setattr(replicas, "_serve", lambda: idle)
    replicas.drain_replicas(60, threading.Event())
    assert idle.calls == ["drain", "drain"]


async def test_sigterm_drains_the_replicas_then_exits_0(served: Served) -> None:
    async with httpx.AsyncClient(timeout=300, headers=AUTH) as client:
        load = [asyncio.create_task(client.post(f"{served.url}/generate",
                                                json={"steps": 40, "seed": s}))
                for s in range(4)]  # fmt: skip
        deadline = time.monotonic() + 60
        while await asyncio.to_thread(served.active_jobs) < 4:  # all four running
            assert time.monotonic() < deadline, "the four requests did not start"
            await asyncio.sleep(0.2)
        served.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        refused = None
        async with httpx.AsyncClient(timeout=30, headers=AUTH) as late:
            while refused is None and not all(task.done() for task in load):
                try:
                    reply = await late.post(f"{served.url}/generate", json={"steps": 1})
                except httpx.TransportError:  # the proxy went away
                    reply = None
                if reply is not None and reply.status_code == 503:
                    refused = reply
                await asyncio.sleep(0.2)
        replies = await asyncio.gather(*load, return_exceptions=True)
    for reply in replies:  # every request in flight finished, with its cells
        assert isinstance(reply, httpx.Response), f"dropped in the drain: {reply!r}"
        assert reply.status_code == 200 and len(reply.json()["counts"]) == 1, reply.text
    assert refused is not None, "no request sent during the drain was refused"
    assert refused.headers["content-type"] == "application/json"
    assert int(refused.headers["retry-after"]) >= 1
    assert "takes no new requests" in refused.json()["detail"]
    assert await asyncio.to_thread(served.process.wait, 120) == 0
    print(f"drained and exited {time.monotonic() - signalled:.1f} s after SIGTERM")
