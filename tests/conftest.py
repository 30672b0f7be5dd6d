"""Tests run single-threaded: on a 2-core machine with other processes busy, OpenMP barrier
stalls make multi-threaded torch many times slower (a test about threading sets its own).
Async tests (``pytest.mark.anyio``) run on asyncio."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
