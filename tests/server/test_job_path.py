"""The JSON routes and the event streams run a job along one path, ``server.runner.job_events``
(the JSON route drains it, as TGI's ``generate`` drains ``generate_stream``), so what they submit,
wait for, time and cancel cannot drift apart. The same counts from both routes are checked in
``test_server.py``; here, that nothing else in the server submits or waits for a job."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _callers(name: str) -> set[str]:
    """``module:function`` of every top-level function of ``server/`` that calls ``name``."""
    found = set()
    for path in (ROOT / "server").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for function in tree.body:
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id == name
                ):
                    found.add(f"{path.relative_to(ROOT).with_suffix('')}:{function.name}")
    return found


def test_one_path_submits_and_waits_for_a_job() -> None:
    assert _callers("submit") == {"server/runner:job_events"}
    assert _callers("_wait") == {"server/runner:job_events"}
    assert _callers("job_events") == {"server/runner:run_job", "server/runner:stream_job"}
