"""Shared fixtures: the device under test, a clean runtime per test, a private Inductor cache.

Every test that compiles runs against its own runtime state (``inductor_xpugraph.reset()``,
``torch._dynamo.reset()``) and a per-session Inductor cache directory, so results never
depend on the order tests run in or on the developer's ~/.cache.
"""

import collections
import gc
import os
import tempfile
import warnings

# Before torch reads it: one private cache for the whole session (hits make repeats fast).
os.environ.setdefault(
    "TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor_xpugraph_tests_")
)
# Before torch reads it, and inherited by the fresh processes tests start: Inductor's CPU
# vector-ISA probe compiles and loads a test program per instruction set in every process
# with a new cache (10-15 s of a fresh process on 2 cores); the suite takes the ISAs
# /proc/cpuinfo lists, which is what the probe confirms.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")

import pytest
import torch
from torch._inductor.cudagraph_trees import MarkStepBox

import inductor_xpugraph
from inductor_xpugraph.trees.per_thread import all_trees


def pytest_addoption(parser):
    parser.addoption(
        "--conformance-table",
        action="store_true",
        help="after tests/conformance: print each behaviour's outcome per implementation",
    )


def pytest_terminal_summary(terminalreporter):
    """Skips counted by reason, one line each (most of them: no cuda device here)."""
    reasons = collections.Counter()
    for report in terminalreporter.stats.get("skipped", []):
        if isinstance(report.longrepr, tuple):
            reasons[report.longrepr[2].removeprefix("Skipped: ")] += 1
    if reasons:
        terminalreporter.write_sep("-", "skipped, by reason")
        for reason, count in reasons.most_common():
            terminalreporter.write_line(f"{count:5d}  {reason}")


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


@pytest.fixture
def emulator():
    """``device`` on the CPU emulator only."""
    yield from _fresh_runtime("cpu", False)


def _fresh_runtime(name, checkpointing):
    was_enabled = name in inductor_xpugraph.enabled_devices()
    inductor_xpugraph.enable(name)
    torch._dynamo.reset()
    # A test that called mark_step_begin() leaves generations to its counter, for the process.
    MarkStepBox.mark_step_counter = 0
    with inductor_xpugraph.config.patch(allocator_checkpointing=checkpointing):
        inductor_xpugraph.reset()
        yield name
        reset_and_check_nothing_is_left()
    if not was_enabled:
        inductor_xpugraph.disable(name)


def reset_and_check_nothing_is_left():
    """Teardown, as upstream's tests do it: after ``reset()`` no tree holds a node, the pools
    hold no bytes, and on cuda no segment of a pool our trees used is left."""
    pools = [tree._pool.handle for tree in all_trees() if hasattr(tree._pool, "handle")]
    torch._dynamo.reset()
    inductor_xpugraph.reset()
    assert all(tree.nodes() == [] for tree in all_trees()), "a tree kept nodes after reset()"
    assert inductor_xpugraph.stats()["pool_bytes"] == 0
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        assert_random_ops_work_on_cuda()
    if pools:
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        pool_ids = {tuple(pool) for pool in pools}
        left = [s for s in torch.cuda.memory_snapshot() if tuple(s["segment_pool_id"]) in pool_ids]
        assert not left, f"{len(left)} segment(s) of a graph pool left after reset()"


def assert_random_ops_work_on_cuda():
    """A capture that failed must not leave the cuda generator in capture mode: every later
    random op in the process would raise (on the H100, one such test failed 83 after it).
    Checked after each test, so that the test that did it fails; then repaired, so that the
    tests after it run as they would have."""
    try:
        torch.rand(1, device="cuda")
    except RuntimeError as error:
        if "Offset increment outside graph capture" not in str(error):
            raise
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        with warnings.catch_warnings(), torch.cuda.stream(stream):
            warnings.simplefilter("ignore")  # "the graph is empty"
            graph.capture_begin()  # the generator enters capture mode...
            graph.capture_end()  # ...and, the capture having succeeded, leaves it
        pytest.fail("the test left the cuda random number generator in capture mode")


@pytest.fixture
def cuda_device():
    if not torch.cuda.is_available():
        pytest.skip("needs a cuda device")
    inductor_xpugraph.enable("cuda")
    torch._dynamo.reset()
    inductor_xpugraph.reset()
    yield "cuda"
    reset_and_check_nothing_is_left()
    inductor_xpugraph.disable("cuda")
