"""Tests run single-threaded: on a 2-core machine with other processes busy, OpenMP barrier
stalls make multi-threaded torch many times slower (a test about threading sets its own).
Async tests (``pytest.mark.anyio``) run on asyncio. ``SEDD_TEST_DEVICE`` picks the device of the
device-relevant tests (``tests/helpers/devices.py``); a lane that cannot run here stops in one
line. ``SEDD_EMULATE_CUDA=1`` runs the session on emulated CUDA (``sedd.cuda_emulation``).
Shared helpers live in ``tests/helpers`` (on the path: ``pyproject.toml``); the bundled
model is one session fixture, ``bundled_model``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from devices import EMULATED, lane_problem

import sedd

_EMULATION = contextlib.ExitStack()


def pytest_configure(config: pytest.Config) -> None:
    problem = lane_problem()
    if problem is not None:
        pytest.exit(problem, returncode=4)
    if EMULATED:  # before collection: test modules build CUDA models at import
        from sedd.cuda_emulation import DeviceSpec, emulate_cuda

        # cuda:0 an H100, cuda:1 an older GPU without native bf16 (tests that name a device)
        v100 = DeviceSpec("Tesla V100-SXM2-16GB (emulated)", (7, 0), 16 << 30, 80)
        emulator = emulate_cuda(devices=[DeviceSpec(), v100])
        config.stash[EMULATOR] = _EMULATION.enter_context(emulator)
        from sedd.engine import forwards

        # The emulated GPU computes on this CPU: the CPU's row block (a GPU's 131,072 tokens
        # would pad a 765-gene cell to 171 rows). Cells then equal the CPU lane's bit for bit.
        cpu_block = forwards.DEFAULT_TOKENS_PER_FORWARD["cpu"]
        _EMULATION.enter_context(pytest.MonkeyPatch.context()).setitem(
            forwards.DEFAULT_TOKENS_PER_FORWARD, "cuda", cpu_block
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    _EMULATION.close()


EMULATOR = pytest.StashKey["object"]()


@pytest.fixture(scope="session")
def emulator(request: pytest.FixtureRequest) -> object:
    """The session's ``sedd.cuda_emulation.Emulator`` (the emulated lane only)."""
    if not EMULATED:
        pytest.skip("the emulated CUDA lane: SEDD_EMULATE_CUDA=1")
    return request.config.stash[EMULATOR]


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
def fp32_no_grad() -> Iterator[None]:
    """fp32 without autocast or gradients, as upstream outputs were computed: parity tests
    take it for every test (``pytest.mark.usefixtures("fp32_no_grad")``)."""
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        yield


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
