"""Tests run single-threaded: on a 2-core machine with other processes busy, OpenMP barrier
stalls make multi-threaded torch many times slower (a test about threading sets its own).
Async tests (``pytest.mark.anyio``) run on asyncio. ``SEDD_TEST_DEVICE`` picks the device of the
device-relevant tests (``tests/helpers/devices.py``); a lane that cannot run here stops in one
line. Shared helpers live in ``tests/helpers`` (on the path: ``pyproject.toml``); the bundled
model is one session fixture, ``bundled_model``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from devices import lane_problem

import sedd


def pytest_configure(config: pytest.Config) -> None:
    problem = lane_problem()
    if problem is not None:
        pytest.exit(problem, returncode=4)


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def bundled_model() -> sedd.Model:
    """The bundled PBMC model on the CPU in fp32, loaded once for every test that reads it."""
    return sedd.load(device="cpu", precision="fp32")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
