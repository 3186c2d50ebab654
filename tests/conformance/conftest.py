"""Conformance: the behaviours upstream's CUDA Graph Trees test suite checks, run against
every implementation of graph trees through public APIs only (issue 14).

Each test takes ``impl``: ``ours-cpu`` (the emulator, in CI), ``ours-cuda-checkpointing`` and
``ours-cuda-owned`` (our two memory strategies) and ``upstream`` (stock torch's trees), the
last three on the GPU machine only (``-m gpu``). A behaviour we deliberately do differently
carries ``@pytest.mark.difference(reason, impls=...)``: it is expected to fail there
(strict), and the README lists it. ``-p no:randomly --conformance-table`` prints the table
of behaviours tried, passing for both, upstream-only, ours-only and documented differences.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._inductor import cudagraph_trees as upstream_trees
from torch._inductor import cudagraph_utils

import inductor_xpugraph
from inductor_xpugraph.trees.per_thread import all_trees

_GPU = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a cuda device"),
]
IMPLS = [
    pytest.param("ours-cpu", id="ours-cpu"),
    pytest.param("ours-cuda-checkpointing", id="ours-cuda-checkpointing", marks=_GPU),
    pytest.param("ours-cuda-owned", id="ours-cuda-owned", marks=_GPU),
    pytest.param("upstream", id="upstream", marks=_GPU),
]


@dataclasses.dataclass
class Counts:
    records: int
    replays: int


class _UpstreamProbe:
    """Counts upstream's recordings and replays and keeps its skip messages.

    The messages are taken from the logger calls themselves (``cudagraph_utils``' loggers:
    ``cudagraphs_log`` on newer torch, ``perf_hint_log`` on older), whichever logging
    artifacts are switched on."""

    def __init__(self) -> None:
        self.records = 0
        self.replays = 0
        self.skips: list[str] = []
        self._patched: list[tuple[Any, str, Any]] = []

    def install(self) -> None:
        node = upstream_trees.CUDAGraphNode
        probe = self

        def counting(original: Callable, counter: str) -> Callable:
            def wrapper(*args, **kwargs):
                setattr(probe, counter, getattr(probe, counter) + 1)
                return original(*args, **kwargs)

            return wrapper

        def keeping_skips(original: Callable) -> Callable:
            def warning(message, *args, **kwargs):
                text = str(message) % args if args else str(message)
                if "skipping cudagraphs" in text:
                    probe.skips.append(text)
                return original(message, *args, **kwargs)

            return warning

        for name, counter in (("__init__", "records"), ("run", "replays")):
            original = getattr(node, name)
            self._patched.append((node, name, original))
            setattr(node, name, counting(original, counter))
        for name in ("cudagraphs_log", "perf_hint_log"):
            logger = getattr(cudagraph_utils, name, None)
            if isinstance(logger, logging.Logger):
                self._patched.append((logger, "warning", None))
                logger.warning = keeping_skips(logger.warning)

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._patched):
            if original is None:  # an instance attribute we added
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._patched.clear()


@dataclasses.dataclass
class Impl:
    """One graph-tree implementation under test, seen through what a user can observe."""

    name: str
    # What both implementations' stale-output errors say.
    stale_output = "overwritten by a subsequent run"

    @property
    def ours(self) -> bool:
        return self.name.startswith("ours")

    @property
    def device(self) -> str:
        return "cpu" if self.name == "ours-cpu" else "cuda"

    def compile(self, fn: Callable, **options: Any) -> Callable:
        return torch.compile(fn, mode="reduce-overhead", **options)

    def counts(self) -> Counts:
        """Recordings made and replays run (a recording's first run is not a replay)."""
        if self.ours:
            stats = inductor_xpugraph.stats()
            return Counts(stats["records"], stats["replays"])
        # A recording's first run is CUDAGraphNode.run_first_inputs, never run().
        return Counts(self._probe.records, self._probe.replays)

    def skip_messages(self) -> list[str]:
        """Why graphs were not captured, one message per reason."""
        if self.ours:
            return list(inductor_xpugraph.stats()["skip_reasons"])
        return list(dict.fromkeys(self._probe.skips))

    def mark_step(self) -> None:
        torch.compiler.cudagraph_mark_step_begin()

    def reset(self) -> None:
        if self.ours:
            inductor_xpugraph.reset()
        else:
            upstream_trees.reset_cudagraph_trees()

    def skip_dynamic_graphs(self) -> Any:
        """Upstream's switch: graphs with symbolic sizes are not captured (ours honours it)."""
        return torch._inductor.config.patch({"triton.cudagraph_skip_dynamic_graphs": True})

    def rerecord_limit(self, limit: int) -> Any:
        """A context in which a graph falls back after ``limit`` unexpected re-records."""
        if self.ours:
            return inductor_xpugraph.config.patch(rerecord_limit=limit)
        return torch._inductor.config.patch({"triton.cudagraph_unexpected_rerecord_limit": limit})

    def _setup(self) -> None:
        torch._dynamo.reset()
        if self.ours:
            inductor_xpugraph.enable(self.device)
            checkpointing = self.name == "ours-cuda-checkpointing"
            self._config = inductor_xpugraph.config.patch(allocator_checkpointing=checkpointing)
            self._config.__enter__()
            inductor_xpugraph.reset()
        else:
            inductor_xpugraph.disable("cuda")
            upstream_trees.reset_cudagraph_trees()
            self._probe = _UpstreamProbe()
            self._probe.install()

    def _teardown(self) -> None:
        torch._dynamo.reset()
        gc.collect()
        if self.ours:
            inductor_xpugraph.reset()
            # Leak check: reset() leaves no graph and no graph memory behind.
            assert inductor_xpugraph.stats()["pool_bytes"] == 0
            assert not any(tree.nodes() for tree in all_trees())
            self._config.__exit__(None, None, None)
            if self.device == "cuda":
                inductor_xpugraph.disable("cuda")
        else:
            self._probe.uninstall()
            upstream_trees.reset_cudagraph_trees()


@pytest.fixture(params=IMPLS)
def impl(request):
    implementation = Impl(request.param)
    for marker in request.node.iter_markers("difference"):
        if implementation.name in marker.kwargs.get("impls", ()):
            request.node.add_marker(pytest.mark.xfail(reason=marker.args[0], strict=True))
    implementation._setup()
    yield implementation
    implementation._teardown()


# -- the table (``--conformance-table``, an option of tests/conftest.py) -------------------------

# behaviour (test node id without the implementation) -> implementation -> outcome
_OUTCOMES: dict[str, dict[str, str]] = collections.defaultdict(dict)


def pytest_configure(config):
    config.addinivalue_line("markers", "difference(reason, impls): a documented difference")


def pytest_runtest_logreport(report):
    if report.when != "call" and not (report.when == "setup" and report.skipped):
        return
    if "conformance/" not in report.nodeid or not report.nodeid.endswith("]"):
        return
    behaviour, _, impl = report.nodeid[:-1].rpartition("[")
    _OUTCOMES[behaviour][impl] = "difference" if hasattr(report, "wasxfail") else report.outcome


def pytest_terminal_summary(terminalreporter, config):
    if not config.getoption("--conformance-table") or not _OUTCOMES:
        return
    write = terminalreporter.write_line
    impls = [param.id for param in IMPLS]
    write("| behaviour | " + " | ".join(impls) + " |")
    write("|---" * (len(impls) + 1) + "|")
    totals: collections.Counter[str] = collections.Counter()
    for behaviour, outcomes in sorted(_OUTCOMES.items()):
        cells = [outcomes.get(i, "-") for i in impls]
        write(f"| {behaviour.split('::')[-1]} | " + " | ".join(cells) + " |")
        totals["behaviours"] += 1
        totals[_classify(outcomes)] += 1
    write(", ".join(f"{kind}: {count}" for kind, count in totals.items()))


def _classify(outcomes: dict[str, str]) -> str:
    ours = [o for i, o in outcomes.items() if i.startswith("ours") and o != "skipped"]
    upstream = outcomes.get("upstream", "skipped")
    if not ours and upstream == "skipped":
        return "not run here"
    if "difference" in ours:
        return "documented differences"
    ours_pass = bool(ours) and all(o == "passed" for o in ours)
    if upstream == "passed":
        return "passing for both" if ours_pass else "upstream only"
    if upstream == "skipped":
        return "ours passing (upstream not run)" if ours_pass else "ours failing (upstream not run)"
    return "ours only" if ours_pass else "failing for both"
