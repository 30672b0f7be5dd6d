"""The HTTP/1.1 connection protocol ``sedd serve`` runs: uvicorn's h11 protocol, plus

* **a header timeout**: a connection must send a complete request head within
  ``header_timeout_s`` of connecting (or of its last response); else it gets a JSON 408 and is
  closed. uvicorn alone waits forever for a head that never completes (its keep-alive timer only
  runs between requests, and any byte cancels it), so a few hundred connections sending a request
  line, or nothing, would hold sockets and memory indefinitely;
* **JSON protocol errors**: a request h11 cannot parse (a NUL in a header, Transfer-Encoding with
  Content-Length, a bad Content-Length) gets ``{"detail": ...}`` with its 400, like every other
  error of the service, instead of uvicorn's plain text.

Idle keep-alive connections are closed by uvicorn after ``timeout_keep_alive`` (5 s), and the
number of connections is capped by uvicorn's ``limit_concurrency`` (``SEDD_MAX_CONNECTIONS``);
past it uvicorn answers 503 itself, the one plain-text answer left (it is written before any
request is parsed).
"""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_TIMEOUT_DETAIL = (
    "the request head did not arrive within {s:g} s (header_timeout_s); send the request line "
    "and headers without pausing"
)


def _json_response(status: int, reason: str, detail: str) -> bytes:
    body = json.dumps({"detail": detail}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the header timeout and JSON 400s above (``header_timeout_s``
    is set on a subclass by ``server.serve.serve``)."""

    header_timeout_s = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # the next head is not complete yet
            self._arm()
        else:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        detail = f"the request is not valid HTTP/1.1 ({msg.rstrip('.')}); nothing was run"
        self.transport.write(_json_response(400, "Bad Request", detail))
        self.transport.close()

    def _arm(self) -> None:
        if self._head_timer is None and not self.transport.is_closing():
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _expire(self) -> None:
        self._head_timer = None
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            return  # a request is under way: its own limits apply
        detail = HEAD_TIMEOUT_DETAIL.format(s=self.header_timeout_s)
        self.transport.write(_json_response(408, "Request Timeout", detail))
        self.transport.close()
