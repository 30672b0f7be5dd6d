"""Errors the app raises itself, and ``http_error``: THE one mapping from these, the generic HTTP
layer's (``server.http.errors``: a body too large or too slow, a refused field, a client that hung
up), the engine's and the library's errors to an HTTP status, a ``detail`` and headers. The app's
exception handlers (``server.app``) and the event streams both answer through it, and both write
the body with ``server.http.errors``."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import torch

from sedd.checkpoints import UnknownLabelError
from sedd.engine import (
    BlockOutOfMemoryError,
    EngineFull,
    EngineStopped,
    InvalidTokensError,
    JobCancelled,
    JobTimeout,
)
from sedd.io.tokens import CountRangeError
from sedd.precision import NonFiniteScoreError
from server.http.errors import (
    DRAINING_DETAIL,
    RETRY_DRAINING_S,
    BodyTimeout,
    BodyTooLarge,
    ClientDisconnected,
    Detail,
    FieldError,
)

log = logging.getLogger("sedd.server")
CLIENT_CLOSED = 499  # nginx's status for "client closed the request"; never seen by a client
DEADLINE_DETAIL = (
    "the request did not finish within its deadline; ask for fewer cells or steps, or raise "
    "timeout_s (up to the server's request_timeout_s)."
)


class ModelNotServed(Exception):
    """The body's ``model`` names a model this server does not serve."""

    def __init__(self, asked: str, served: list[str]) -> None:
        known = ", ".join(repr(name) for name in served)
        super().__init__(
            f"no served model is called {asked!r}; this server serves {known} "
            "(GET /v1/models lists them); send one of those ids or leave out `model` for the "
            "default."
        )


class ModelInUse(Exception):
    """An unload of a model that a request or job holds, or of the default model (409)."""


class ModelsBusy(Exception):
    """A model must load and every loaded one has work in flight (503 with Retry-After)."""


class Draining(Exception):
    """The server is shutting down and takes no new work."""


class NotReady(Exception):
    """/readyz: the engine is not running, or has work and has stopped stepping."""


class DeadlineExceeded(Exception):
    """The request's deadline passed before the engine answered."""


class StorageFull(Exception):
    """No room in the server's temporary directory for an ``.h5ad`` answer (507): a condition
    of the server's disk, not of the request; ``RETRY_STORAGE_S`` later it may have cleared."""


RETRY_STORAGE_S = 30
RETRY_MODELS_BUSY_S = 5  # a model must load and every loaded one is busy: try again soon


class Overloaded(Exception):
    """The work already admitted would keep this request past its deadline (429): it could
    finish alone, so retrying after ``retry_after`` seconds can succeed."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


# Every class ``http_error`` maps (subclasses included); the app registers a handler for each.
MAPPED: tuple[type[Exception], ...] = (
    ValueError,  # FieldError, UnknownLabelError, CountRangeError, engine field checks
    BodyTooLarge,
    BodyTimeout,
    ModelNotServed,
    ModelInUse,
    ModelsBusy,
    EngineFull,
    Overloaded,
    StorageFull,
    Draining,
    EngineStopped,
    NotReady,
    torch.OutOfMemoryError,
    JobTimeout,
    DeadlineExceeded,
    ClientDisconnected,
    JobCancelled,
    NonFiniteScoreError,
    InvalidTokensError,
)


@dataclass(frozen=True)
class HTTPFailure:
    status: int
    detail: Detail
    headers: dict[str, str] = field(default_factory=dict)


def _retry_after(seconds: float | None, default: int = 1) -> dict[str, str]:
    if seconds is None or not math.isfinite(seconds):
        seconds = default
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def http_error(exc: BaseException) -> HTTPFailure:
    """Status, detail and headers for any error a request can end in."""
    match exc:
        case FieldError():
            return HTTPFailure(422, exc.detail())
        case UnknownLabelError() | CountRangeError():  # the planner names the field first
            return HTTPFailure(422, str(exc))
        case BodyTooLarge():
            return HTTPFailure(413, str(exc))
        case BodyTimeout():
            return HTTPFailure(408, str(exc), {"Connection": "close"})
        case ModelNotServed():
            return HTTPFailure(404, str(exc))
        case ModelInUse():
            return HTTPFailure(409, str(exc))
        case ModelsBusy():
            return HTTPFailure(503, str(exc), _retry_after(RETRY_MODELS_BUSY_S))
        case EngineFull():
            headers = _retry_after(getattr(exc, "retry_after", None))
            return HTTPFailure(
                429,
                "the request queue is full (max_queued_jobs); retry after "
                f"{headers['Retry-After']} s.",
                headers,
            )
        case Overloaded():
            return HTTPFailure(429, str(exc), _retry_after(exc.retry_after))
        case StorageFull():
            log.warning("%s", exc)  # one line: the operator's disk, not a bug
            return HTTPFailure(507, str(exc), _retry_after(RETRY_STORAGE_S))
        case Draining() | EngineStopped():
            return HTTPFailure(503, DRAINING_DETAIL, _retry_after(RETRY_DRAINING_S))
        case NotReady():
            return HTTPFailure(503, str(exc), _retry_after(RETRY_DRAINING_S))
        case BlockOutOfMemoryError():  # persistent: a retry runs the same block out again
            log.error("%s", exc)
            return HTTPFailure(
                500,
                "out of accelerator memory in one block step of this request alone: the "
                "server's row block does not fit its accelerator, and a retry would run out "
                "again. The operator must lower SEDD_TOKENS_PER_FORWARD (--tokens-per-forward, "
                f"now {exc.tokens_per_forward}), e.g. to {exc.suggested}.",
            )
        case torch.OutOfMemoryError():  # packed with other work: alone it may fit later
            log.warning("out of accelerator memory: %s", exc)
            return HTTPFailure(
                503,
                "out of accelerator memory in this request's forward; retry later (the "
                "server's row block sets a forward's memory: SEDD_TOKENS_PER_FORWARD)",
                _retry_after(RETRY_DRAINING_S),
            )
        case DeadlineExceeded() if str(exc):  # it passed while the model loaded: say so
            return HTTPFailure(504, str(exc))
        case JobTimeout() | DeadlineExceeded():
            return HTTPFailure(504, DEADLINE_DETAIL)
        case ClientDisconnected() | JobCancelled():
            return HTTPFailure(CLIENT_CLOSED, "the client disconnected; its job was cancelled")
        case NonFiniteScoreError():
            log.error("non-finite model output: %s", exc)
            return HTTPFailure(
                500,
                "the model produced NaN/Inf scores for this request even in fp32; no cells "
                "were returned. Other requests are unaffected; check the checkpoint weights.",
            )
        case InvalidTokensError():
            log.error("%s", exc)
            return HTTPFailure(
                500,
                "the sampler left mask or out-of-range tokens; no cells "
                "were returned (docs/precision.md rule 5)",
            )
        case ValueError():  # the library's user-caused errors (bad field values)
            return HTTPFailure(422, str(exc))
        case _:
            log.error("request failed", exc_info=exc)
            return HTTPFailure(500, f"internal error ({type(exc).__name__}); see the server log")
