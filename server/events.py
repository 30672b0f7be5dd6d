"""The events of the ``.../stream`` routes, as their OpenAPI schema types them.

Each event is sent as ``event: <name>`` and ``data: <one line of JSON>``: ``queued`` once,
``progress`` after every step, then ``result`` (the plain route's JSON body) or ``error``
(``server.runner.stream_job`` sends them).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class QueuedEvent(BaseModel):
    """``queued``: sent once, when the job is accepted."""

    job_id: str


class ProgressEvent(BaseModel):
    """``progress``: after every step of the job (the final denoise is step == steps; an
    adaptive sampler's cells may finish before its cap, ``steps``)."""

    step: int
    steps: int
    rows: int  # the job's rows this step moved
    fraction_masked: float  # of all the job's positions (0 for uniform graphs)
    fraction_unmasked: float  # of the genes the job draws, the share drawn (uniform: steps)
    cells_finished: int  # the job's cells that finished with this step


class ErrorEvent(BaseModel):
    """``error``: the job failed; the status and detail the plain route would have answered."""

    status: int
    detail: str | list[dict[str, Any]]


def stream_responses(result: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    """The 200 of a ``.../stream`` route: the stream as text, and each event typed the way
    OpenAPI 3.2 (and FastAPI's own SSE routes) describe one, in ``itemSchema``: its ``event``
    name, and its ``data`` as JSON of the event's schema."""

    def event(name: str, data: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "object",
            "required": ["event", "data"],
            "properties": {
                "event": {"const": name},
                "data": {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": data,
                },
            },
        }

    events = [
        event("queued", QueuedEvent.model_json_schema()),
        event("progress", ProgressEvent.model_json_schema()),
        event("result", {"$ref": f"#/components/schemas/{result.__name__}"}),
        event("error", ErrorEvent.model_json_schema()),
    ]
    return {
        200: {
            "description": "events: queued, progress (per step), then result or error",
            "content": {
                "text/event-stream": {"schema": {"type": "string"}, "itemSchema": {"oneOf": events}}
            },
        }
    }
