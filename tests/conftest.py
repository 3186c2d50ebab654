"""Shared fixtures: the device under test, a clean runtime per test, a private Inductor cache.

Every test that compiles runs against its own runtime state (``inductor_xpugraph.reset()``,
``torch._dynamo.reset()``) and a per-session Inductor cache directory, so results never
depend on the order tests run in or on the developer's ~/.cache.
"""

import os
import tempfile

# Before torch reads it: one private cache for the whole session (hits make repeats fast).
os.environ.setdefault(
    "TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor_xpugraph_tests_")
)

import pytest
import torch

import inductor_xpugraph


def pytest_addoption(parser):
    parser.addoption(
        "--conformance-table",
        action="store_true",
        help="after tests/conformance: print each behaviour's outcome per implementation",
    )


def cuda_available() -> bool:
    return torch.cuda.is_available()


_GPU = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a cuda device"),
]

# (device, allocator checkpointing). "cpu" is the emulator and always runs (it has no
# allocator checkpoints); cuda runs on the GPU machine (-m gpu) in both memory strategies.
DEVICES = [
    pytest.param(("cpu", False), id="cpu"),
    pytest.param(("cuda", True), id="cuda-checkpointing", marks=_GPU),
    pytest.param(("cuda", False), id="cuda-owned-outputs", marks=_GPU),
]


@pytest.fixture(params=DEVICES)
def device(request):
    """A device with the extension enabled, a fresh runtime and fresh Dynamo caches."""
    yield from _fresh_runtime(*request.param)


@pytest.fixture(params=DEVICES[1:])
def cuda_each_strategy(request):
    """``device`` on cuda only, in both memory strategies (for clients too slow on the CPU)."""
    yield from _fresh_runtime(*request.param)


def _fresh_runtime(name, checkpointing):
    was_enabled = name in inductor_xpugraph.enabled_devices()
    inductor_xpugraph.enable(name)
    torch._dynamo.reset()
    with inductor_xpugraph.config.patch(allocator_checkpointing=checkpointing):
        inductor_xpugraph.reset()
        yield name
        torch._dynamo.reset()
        inductor_xpugraph.reset()
    if not was_enabled:
        inductor_xpugraph.disable(name)


@pytest.fixture
def cuda_device():
    if not torch.cuda.is_available():
        pytest.skip("needs a cuda device")
    inductor_xpugraph.enable("cuda")
    torch._dynamo.reset()
    inductor_xpugraph.reset()
    yield "cuda"
    torch._dynamo.reset()
    inductor_xpugraph.reset()
    inductor_xpugraph.disable("cuda")
