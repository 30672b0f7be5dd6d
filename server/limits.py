"""The request-body limit: refuse bodies over ``max_body_bytes`` before parsing them.

``LimitedRoute`` checks the declared ``Content-Length`` first, then counts bytes as the body
streams in (a chunked upload declares no length) and stops reading at the limit. It reads the
body before FastAPI parses it, so ``BodyTooLarge`` reaches the app's error mapping.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from server.errors import BodyTooLarge


class BoundedRequest(Request):
    """A request whose body stream stops with ``BodyTooLarge`` past ``limit`` bytes."""

    limit: int = 0

    async def stream(self) -> AsyncGenerator[bytes, None]:
        seen = 0
        async for chunk in super().stream():
            seen += len(chunk)
            if seen > self.limit:
                raise BodyTooLarge(self.limit, seen)
            yield chunk


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
            await bounded.body()  # read (bounded) now; FastAPI then parses the cached bytes
            return await handler(bounded)

        return limited
