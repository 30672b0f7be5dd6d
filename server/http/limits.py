"""Request bodies: bounded in size and read time, and parsed strictly, before FastAPI sees them.

``LimitedRoute`` checks the declared ``Content-Length`` first, then counts bytes as the body
streams in (a chunked upload declares no length) and stops reading at ``max_body_bytes``; an
upload that stalls past ``body_timeout_s`` is answered 408 and dropped; one whose client hangs up
is logged in one line and counted as cancelled (499, never sent). A JSON body is then parsed by
``server.http.jsonbody`` (duplicate keys, lone surrogates, deep nesting and huge numbers are 422s
naming the place; a large body in a worker thread, off the event loop) and handed to FastAPI
already parsed. Errors raised here (``server.http.errors``) reach the app's one mapping. The two
limits are the app's settings (``request.app.state.settings``), read per request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from server.http.errors import BodyTimeout, BodyTooLarge, ClientDisconnected
from server.http.jsonbody import parse_json_body

log = logging.getLogger("sedd.server")


class BoundedRequest(Request):
    """A request whose body stream stops with ``BodyTooLarge`` past ``limit`` bytes; ``seen``
    counts the bytes read."""

    limit: int = 0
    seen: int = 0

    async def stream(self) -> AsyncGenerator[bytes, None]:
        async for chunk in super().stream():
            self.seen += len(chunk)
            if self.seen > self.limit:
                raise BodyTooLarge(self.limit, self.seen)
            yield chunk


def _is_json(content_type: str | None) -> bool:
    """FastAPI parses a body as JSON when it has no content type or an (application/*+)json one."""
    if not content_type:
        return True
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def _hung_up(request: BoundedRequest) -> None:
    """The one log line of an upload its client abandoned (no traceback: nothing failed)."""
    declared = request.headers.get("content-length")
    of = f" of {declared}" if declared is not None and declared.isdigit() else ""
    log.info(
        "%s %s: the client hung up mid-upload after %d%s bytes; nothing was run",
        request.method,
        request.url.path,
        request.seen,
        of,
    )


PARSE_IN_THREAD_BYTES = 64 * 1024  # a body this large is parsed off the event loop


_PARSER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sedd-json")


async def _parsed(body: bytes) -> object:
    """``parse_json_body``; a large body (a 3 MB one takes over a second) in the one parser
    thread, so the event loop goes on answering health checks and streams meanwhile. One
    thread, not one per body: several CPU-bound threads would starve the loop of the GIL."""
    if len(body) < PARSE_IN_THREAD_BYTES:
        return parse_json_body(body)
    return await asyncio.get_running_loop().run_in_executor(_PARSER, parse_json_body, body)


class LimitedRoute(APIRoute):
    """An APIRoute that enforces the app's ``max_body_bytes`` on every request it serves."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()

        async def limited(request: Request) -> Response:
            limit = int(request.app.state.settings.max_body_bytes)
            declared = request.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > limit:
                raise BodyTooLarge(limit, int(declared))
            bounded = BoundedRequest(request.scope, request.receive)
            bounded.limit = limit
            timeout = float(request.app.state.settings.body_timeout_s)
            try:  # read (bounded) now; FastAPI then takes the cached body
                async with asyncio.timeout(timeout):
                    body = await bounded.body()
            except TimeoutError:
                raise BodyTimeout(timeout) from None
            except ClientDisconnect:
                _hung_up(bounded)
                raise ClientDisconnected("the client hung up before its body arrived") from None
            if body and _is_json(request.headers.get("content-type")):
                bounded._json = await _parsed(body)  # Request.json() returns this
            return await handler(bounded)

        return limited
