"""``sedd serve``: the HTTP service (``server.app``) under uvicorn.

Settings come from ``SEDD_*`` environment variables (``server.config.Settings``); the flags
given here override them. The API key is read from ``SEDD_API_KEY`` only, never from a flag
(command lines are visible to every user of the machine).
"""

from __future__ import annotations

import argparse

from sedd.commands.args import add_cuda_graphs_argument


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve a model over HTTP (generate, predict, impute, metrics)",
        description="Start the inference service. Every option can also be set as an "
        "environment variable SEDD_<OPTION> (e.g. SEDD_MAX_STEPS=100, SEDD_API_KEY=...); "
        "flags win over the environment.",
    )
    p.add_argument("--host", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8000)")
    p.add_argument(
        "--model",
        "--checkpoint-dir",
        dest="model",
        metavar="PATH",
        help="checkpoint to serve (default: the bundled models/pbmc_default)",
    )
    p.add_argument("--device", help="auto (default), cpu, cuda, cuda:1, ...")
    p.add_argument("--precision", choices=["auto", "bf16", "fp16", "fp32"])
    add_cuda_graphs_argument(p)
    p.add_argument("--max-cells-per-request", type=int)
    p.add_argument("--max-steps", type=int)
    p.add_argument("--max-queued-jobs", type=int)
    p.add_argument("--max-rows-per-forward", type=int)
    p.add_argument("--tokens-per-forward", type=int)
    p.add_argument("--request-timeout-s", type=float)
    p.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=run)


_FLAGS = (
    "host",
    "port",
    "model",
    "device",
    "precision",
    "max_cells_per_request",
    "max_steps",
    "max_queued_jobs",
    "max_rows_per_forward",
    "tokens_per_forward",
    "cuda_graphs",
    "request_timeout_s",
    "log_level",
)


def run(args: argparse.Namespace) -> int:
    # The web stack is imported here, so other commands do not pay for it.
    import logging

    from pydantic import ValidationError

    from server.app import create_app, preload
    from server.config import Settings
    from server.serve import serve

    overrides = {name: getattr(args, name) for name in _FLAGS if getattr(args, name) is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        raise ValueError(f"invalid settings: {problems}") from None
    if not settings.model.exists():
        raise FileNotFoundError(f"no model at {settings.model}; pass --model PATH.")
    logging.basicConfig(level=settings.log_level.upper(), format="%(levelname)s:  %(message)s")
    app = create_app(settings)
    preload(app)  # a bad checkpoint is a one-line error here, before anything listens
    serve(app, host=settings.host, port=settings.port, log_level=settings.log_level)
    return 0
