"""Ray's own routes behind the API key (issue 44, item 10), over real HTTP through the proxy's
middlewares (``server.ray.proxy_errors.proxy_middlewares``), on a stand-in for Ray's proxy app:
Ray itself is an optional extra (CI's Ray step checks the real proxy in test_replicas.py)."""

from __future__ import annotations

import json

import httpx
import pytest
from server_client import free_port, make_settings, uvicorn_in_thread
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from server.http.protocol import TimedH11Protocol
from server.ray import proxy_errors
from server.ray.proxy_http import environment

KEY = "s3cret-ключ"  # compared as UTF-8 bytes
PROTOCOL = TimedH11Protocol.configured(header_timeout_s=5.0, body_timeout_s=5.0, max_connections=8)


def _rays_proxy() -> Starlette:
    """Routes as Ray's proxy answers them itself, and one the app would answer."""
    routes = [
        Route("/-/routes", lambda request: JSONResponse({"/": "sedd"})),
        Route("/-/healthz", lambda request: PlainTextResponse("success")),
        Route("/v1/models", lambda request: JSONResponse({"data": []})),
    ]
    return Starlette(routes=routes, middleware=proxy_errors.proxy_middlewares())


@pytest.fixture()
def proxy(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SEDD_API_KEY", KEY)
    with uvicorn_in_thread(_rays_proxy(), PROTOCOL, free_port()) as port:
        yield f"http://127.0.0.1:{port}"


def test_rays_route_list_needs_the_key_and_its_refusal_closes_the_connection(proxy: str) -> None:
    keyless = httpx.get(f"{proxy}/-/routes")
    assert keyless.status_code == 401
    assert json.loads(keyless.text)["detail"].startswith("missing bearer API key")
    assert keyless.headers["connection"] == "close"
    assert "sedd" not in keyless.text
    wrong = httpx.get(f"{proxy}/-/routes", headers={"Authorization": "Bearer s3cret"})
    assert wrong.status_code == 401 and wrong.json()["detail"] == "invalid API key."
    keyed = httpx.get(f"{proxy}/-/routes",
                      headers={"Authorization": f"Bearer {KEY}".encode()})  # fmt: skip
    assert keyed.status_code == 200 and keyed.json() == {"/": "sedd"}


def test_rays_liveness_probe_and_the_apps_routes_pass_the_proxy_unchecked(proxy: str) -> None:
    assert httpx.get(f"{proxy}/-/healthz").text == "success"  # like the app's /healthz
    # the app's own routes are checked by the app in each replica, not twice
    assert httpx.get(f"{proxy}/v1/models").status_code == 200


def test_without_a_key_rays_routes_stay_open(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEDD_API_KEY", raising=False)
    with uvicorn_in_thread(_rays_proxy(), PROTOCOL, free_port()) as port:
        assert httpx.get(f"http://127.0.0.1:{port}/-/routes").json() == {"/": "sedd"}


def test_the_proxys_environment_carries_the_settings_key(tmp_path) -> None:
    settings = make_settings(tmp_path, api_key=KEY)
    assert environment(settings)["SEDD_API_KEY"] == KEY
    assert "SEDD_API_KEY" not in environment(make_settings(tmp_path))
