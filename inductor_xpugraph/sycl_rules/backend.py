"""The xpu backends of the runtime, running on the stand-in device instead of ``torch.xpu``.

``XpuRulesBackend`` is ``DeviceGraphBackend``, the code the xpu backend runs on an Intel GPU,
with the stand-in device (``torch_xpu.StandInXpu``) as its device module and the allocator
calls xpu's backend makes (``_xpu_endAllocateToPool``, ``_xpu_releasePool``,
``_xpu_beginAllocateCurrentThreadToPool``) taken from it. ``AcceleratorRulesBackend`` is the
same over ``torch.accelerator.Graph``'s shape (``config.xpu_graph_api = "accelerator"``).
They run Inductor's CPU code, so two things differ from the backends they stand for, and only
these: a capture records the callable (``run_captured``: the stand-in cannot record CPU
kernels, it replays the callable as the CPU emulator does), and so the capture's run is the
first replay (``capture_executes``). No allocator checkpoints: the stand-in does not model the
allocator's bookkeeping, so trees use owned outputs, xpu's strategy before torch 2.15.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..trees.backends.accelerator_graphs import _PoolGivenAtCaptureBegin
from ..trees.backends.cpu_emulation import EmulatedGraph
from ..trees.backends.device_graphs import DeviceGraphBackend
from .torch_xpu import StandInXpu

# The stand-in device the backends of this process use (``sycl_rules.on_cpu`` sets it).
_device: StandInXpu | None = None


def use_device(device: StandInXpu | None) -> None:
    global _device
    _device = device


def active_device() -> StandInXpu:
    if _device is None:
        raise RuntimeError(
            "inductor_xpugraph: the CPU stands in for an xpu device only inside "
            "`with inductor_xpugraph.sycl_rules.on_cpu(...)`"
        )
    return _device


class XpuRulesBackend(DeviceGraphBackend):
    """``DeviceGraphBackend`` over the stand-in device, with ``torch.xpu.XPUGraph``."""

    device_type = "cpu"
    capture_executes = True
    empty_cache_after_pool_drop = True  # as XpuGraphBackend

    def __init__(self, device_index: int, device: StandInXpu | None = None) -> None:
        stand_in = device or active_device()
        self.device_module = stand_in  # type: ignore[assignment]
        self.end_allocate_to_pool = stand_in.end_allocate_to_pool
        self.release_pool = stand_in.release_pool
        self.begin_allocate_to_pool = stand_in.begin_allocate_current_thread_to_pool
        self.failure_leaves_host_routing = stand_in.release.routes_host_allocator
        super().__init__(device_index)

    def new_graph(self) -> Any:
        return self.device_module.XPUGraph()

    def run_captured(self, graph: Any, fn: Callable[[list[Any]], Any], args: list[Any]) -> Any:
        stand_in_graph = getattr(graph, "graph", graph)  # unwrapped (AcceleratorRulesBackend)
        return stand_in_graph.record_callable(EmulatedGraph(fn, args))


class AcceleratorRulesBackend(XpuRulesBackend):
    """``XpuRulesBackend`` with ``torch.accelerator.Graph``: no generator registration."""

    graphs_register_generators = False

    def __init__(self, device_index: int, device: StandInXpu | None = None) -> None:
        stand_in = device or active_device()
        if not stand_in.release.has_accelerator_graph:
            raise RuntimeError(
                f"torch.accelerator.Graph does not exist in torch {stand_in.release.version}"
            )
        super().__init__(device_index, stand_in)

    def new_graph(self) -> Any:
        # torch.accelerator.Graph's shape, in the wrapper AcceleratorGraphBackend puts on it
        return _PoolGivenAtCaptureBegin(self.device_module.AcceleratorGraph())
