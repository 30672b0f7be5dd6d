"""The HTTP/1.1 connection protocol ``sedd serve`` runs: uvicorn's h11 protocol, plus

* **a header timeout**: a connection must send a complete request head within
  ``header_timeout_s`` of connecting (or of its last response); else it gets a JSON 408 and is
  closed. uvicorn alone waits forever for a head that never completes (its keep-alive timer only
  runs between requests, and any byte cancels it);
* **a body deadline**: a request body must have arrived ``body_timeout_s`` (plus
  ``BODY_GRACE_S``) after its head, however slowly it drips; the route's own JSON 408
  (``server.http.limits``) normally comes first, and this closes a connection whose body
  nothing reads;
* **early answers close the connection**: a response sent before its request's body has arrived
  (a 401, 404, 405, 408 or 413 answered from the head) says ``Connection: close``, and the
  connection is closed: the rest of the body is read and dropped for ``LINGER_S`` at most, so the
  client reads the answer rather than a reset, then the socket is closed. uvicorn alone keeps
  such a connection open for as long as the client sends a body byte every few seconds;
* **a write timeout**: a client that reads nothing of its answers (pipelined requests it never
  reads: the socket's send buffer fills and writing pauses) is disconnected once writing has
  stayed paused ``write_timeout_s``; uvicorn alone waits for it forever, and such connections
  held every place under the cap;
* **a connection cap** (``max_connections``): the first ``max_connections`` connections are
  admitted; a request on any connection past them gets a JSON 503 with ``Retry-After`` and the
  connection is closed. A connection frees its place when it closes or starts its lingering
  close. (uvicorn's ``limit_concurrency`` refused every request, in plain text, while the count of
  connections, the refused ones included, was at the cap.);
* **JSON protocol errors**: a request h11 cannot parse (a NUL in a header, a bad
  Content-Length), and one with both Content-Length and Transfer-Encoding (RFC 9112 section 6.3;
  h11 alone takes the chunked body), gets the service's JSON error body with its 400 and is
  closed;
* **no WebSocket**: the service has no WebSocket route, so an ``Upgrade`` header is ignored
  (RFC 9110 section 7.8) and the request answered over HTTP/1.1 like any other, in JSON (uvicorn
  would hand it to a WebSocket protocol that refuses it with a plain-text 403).

Idle keep-alive connections are closed by uvicorn after ``KEEP_ALIVE_S`` (``timeout_keep_alive``;
Ray's proxy is given the same). The limits themselves (``header_timeout_s``, ``body_timeout_s``,
``write_timeout_s``, ``max_connections``) are the settings' (``server.config.Settings``), given
to ``configured``;
every error body is written by ``server.http.errors``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from server.http.errors import body_timeout_detail, raw_error

log = logging.getLogger("sedd.server")
LINGER_S = 2.0  # after an early answer: the most time the rest of its body is read and dropped
BODY_GRACE_S = 1.0  # the route's own body timeout answers first
RETRY_FULL_S = 1  # Retry-After of a connection refused at the cap
KEEP_ALIVE_S = 5  # idle keep-alive connections are closed after this (uvicorn's default)
WRITE_TIMEOUT_S = 30.0  # the settings' default write_timeout_s
HEAD_TIMEOUT_DETAIL = (
    "the request head did not arrive within {s:g} s (header_timeout_s); send the request line "
    "and headers without pausing"
)
FULL_DETAIL = (
    "the server has max_connections={cap} connections open; retry after {s} s, or reuse an "
    "open connection."
)
BOTH_LENGTHS = (
    "a request may not carry both Content-Length and Transfer-Encoding (RFC 9112 section 6.3)"
)


def _framed_twice(request: h11.Request) -> bool:
    """Whether the request declares both a Content-Length and a Transfer-Encoding."""
    names = {name for name, _ in request.headers}
    return b"content-length" in names and b"transfer-encoding" in names


def _closing(response: h11.Response) -> h11.Response:
    """``response`` with ``Connection: close`` (and no other Connection header)."""
    headers = [(name, value) for name, value in response.headers if name != b"connection"]
    return h11.Response(
        status_code=response.status_code,
        headers=[*headers, (b"connection", b"close")],
        reason=response.reason,
        http_version=response.http_version,
    )


class StrictConnection(h11.Connection):
    """h11's server side, stricter: a request with both Content-Length and Transfer-Encoding is a
    protocol error (``problem`` says why), and a response sent while the client is still sending
    its body says ``Connection: close``."""

    problem: str | None = None

    def next_event(self) -> Any:
        event = super().next_event()
        if isinstance(event, h11.Request) and _framed_twice(event):
            self.problem = BOTH_LENGTHS
            raise h11.RemoteProtocolError(BOTH_LENGTHS)
        return event

    def send(self, event: Any) -> bytes | None:
        if isinstance(event, h11.Response) and self.their_state is h11.SEND_BODY:
            event = _closing(event)
        return super().send(event)


class SoftClosingTransport:
    """A connection's transport as uvicorn's code sees it: ``close`` goes through the protocol,
    which lingers when the client is still sending a body; while it lingers the transport says it
    is closing and drops writes. Everything else is the transport's own."""

    def __init__(self, transport: asyncio.Transport, protocol: TimedH11Protocol) -> None:
        self._transport, self._protocol = transport, protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        self._protocol.close_softly()

    def is_closing(self) -> bool:
        return self._protocol.lingering or self._transport.is_closing()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._protocol.lingering:
            self._transport.write(data)


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the timeouts, closes, cap and JSON answers above. It has no
    limits of its own: one server's, from its settings, are set on a subclass by ``configured``
    (the class uvicorn is given)."""

    header_timeout_s: ClassVar[float]
    body_timeout_s: ClassVar[float]
    write_timeout_s: ClassVar[float]
    max_connections: ClassVar[int | None]
    admitted: ClassVar[set[TimedH11Protocol]]  # the connections within the cap

    @classmethod
    def configured(
        cls,
        *,
        header_timeout_s: float,
        body_timeout_s: float,
        max_connections: int | None,
        write_timeout_s: float = WRITE_TIMEOUT_S,
    ) -> type[TimedH11Protocol]:
        """This protocol with these limits, counting its connections on its own (one server)."""
        limits = {
            "header_timeout_s": header_timeout_s,
            "body_timeout_s": body_timeout_s,
            "write_timeout_s": write_timeout_s,
            "max_connections": max_connections,
            "admitted": set(),
        }
        return type("Protocol", (cls,), limits)

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        size = config.h11_max_incomplete_event_size
        self.conn = StrictConnection(h11.SERVER, *(() if size is None else (size,)))

    # asyncio's protocol interface

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.lingering, self._admitted = False, False
        self._timer: asyncio.TimerHandle | None = None
        self._timing: str | None = None  # what the timer times: "head", "body" or "linger"
        self._write_timer: asyncio.TimerHandle | None = None  # while writing is paused
        self._raw = transport
        super().connection_made(SoftClosingTransport(transport, self))  # type: ignore[arg-type]
        self._admit()
        self._time_request()

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            return  # the rest of an answered request: dropped
        if not self._admit():
            self._refuse()
            return
        super().data_received(data)
        self._time_request()

    def pause_writing(self) -> None:
        """The send buffer is full (the client is not reading): it has ``write_timeout_s``."""
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.write_timeout_s, self._write_expired)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_expired(self) -> None:
        self._write_timer = None
        log.warning(
            "closed a connection: its client read nothing of its answers for %g s "
            "(write_timeout_s)",
            self.write_timeout_s,
        )
        self.admitted.discard(self)
        if self.cycle is not None:  # the answer under way is dropped; its job is cancelled
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self._raw.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        self.admitted.discard(self)
        super().connection_lost(exc)

    # uvicorn's hooks

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.lingering:
            self._time_request()  # a pipelined request may be under way

    def send_400_response(self, msg: str) -> None:
        problem = self.conn.problem or msg.rstrip(".")
        detail = f"the request is not valid HTTP/1.1 ({problem}); nothing was run"
        self._raw.write(raw_error(400, "Bad Request", detail))
        self._linger()

    def _should_upgrade(self) -> bool:
        return False  # no WebSocket route: the request is answered as plain HTTP

    # closing

    def close_softly(self) -> None:
        """Close the connection; linger first if the client is still sending a body."""
        busy = self.conn.their_state is h11.SEND_BODY
        if busy and not self.lingering and not self._raw.is_closing():
            self._linger()
        else:
            self._raw.close()

    def _linger(self) -> None:
        """Stop answering: send what is written and a FIN, drop what the client still sends for
        ``LINGER_S`` at most (or until it closes), then close the socket."""
        self.lingering = True
        self.admitted.discard(self)
        if self._raw.is_closing() or not self._raw.can_write_eof():
            self._raw.close()
            return
        self._raw.write_eof()
        self._raw.resume_reading()
        self._start_timer("linger", LINGER_S, self._raw.abort)

    # the connection cap

    def _admit(self) -> bool:
        """Whether this connection is within the cap (taking a place if one is free)."""
        cap = self.max_connections
        if not self._admitted and (cap is None or len(self.admitted) < cap):
            self.admitted.add(self)
            self._admitted = True
        return self._admitted

    def _refuse(self) -> None:
        log.warning("refused a request: max_connections=%d connections open", self.max_connections)
        detail = FULL_DETAIL.format(cap=self.max_connections, s=RETRY_FULL_S)
        answer = raw_error(503, "Service Unavailable", detail, f"retry-after: {RETRY_FULL_S}")
        self._raw.write(answer)
        self._linger()

    # the head and body timers

    def _time_request(self) -> None:
        """Time the head or the body the connection is waiting for, or nothing."""
        state = self.conn.their_state
        if state is h11.IDLE:
            self._start_timer("head", self.header_timeout_s, self._head_expired)
        elif state is h11.SEND_BODY:
            self._start_timer("body", self.body_timeout_s + BODY_GRACE_S, self._body_expired)
        else:
            self._stop_timer()

    def _start_timer(self, timing: str, delay: float, callback: Any) -> None:
        """Run ``callback`` in ``delay`` s, unless the timer already times the same thing."""
        if self._timing == timing or self._raw.is_closing():
            return
        self._stop_timer()
        self._timer, self._timing = self.loop.call_later(delay, callback), timing

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timing = None, None

    def _head_expired(self) -> None:
        self._timer, self._timing = None, None
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            return  # a request is under way: its own limits apply
        detail = HEAD_TIMEOUT_DETAIL.format(s=self.header_timeout_s)
        self._raw.write(raw_error(408, "Request Timeout", detail))
        self._raw.close()

    def _body_expired(self) -> None:
        self._timer, self._timing = None, None
        if self.conn.their_state is not h11.SEND_BODY or self.transport.is_closing():
            return
        log.warning("closed a connection: its request body took over %g s", self.body_timeout_s)
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:  # the app's answer is dropped
            cycle.disconnected = True
            cycle.message_event.set()
            detail = body_timeout_detail(self.body_timeout_s)
            self._raw.write(raw_error(408, "Request Timeout", detail))
        self._linger()
