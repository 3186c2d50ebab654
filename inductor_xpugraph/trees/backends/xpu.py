"""XPU backend: ``torch.xpu.XPUGraph`` (torch >= 2.11) over the shared stream-capture backend.

XPUGraph's ``capture_begin`` takes only ``pool`` (no capture error mode). Allocator
checkpoints come with the ``_xpu_*`` bindings of torch 2.15 (``allocator_checkpoints``):
where the installed torch has all of them, the tree lets sibling branches share pool memory as
on cuda; elsewhere (torch 2.11-2.14) it uses the portable strategy, owned outputs.
``config.xpu_graph_api = "accelerator"`` uses ``torch.accelerator.Graph`` instead
(``accelerator_graphs``). Not run on Intel hardware by this project: the same code path is
exercised on CUDA.
"""

from __future__ import annotations

import torch

from .allocator_checkpoints import AllocatorCheckpoints
from .device_graphs import DeviceGraphBackend
from .devices import DEVICES


class XpuGraphBackend(AllocatorCheckpoints, DeviceGraphBackend):
    device_type = "xpu"
    device_module = torch.xpu
    end_allocate_to_pool = staticmethod(torch._C._xpu_endAllocateToPool)
    release_pool = staticmethod(torch._C._xpu_releasePool)
    begin_allocate_to_pool = getattr(torch._C, "_xpu_beginAllocateCurrentThreadToPool", None)
    empty_cache_after_pool_drop = DEVICES["xpu"].empty_cache_after_pool_drop
    failure_leaves_host_routing = DEVICES["xpu"].failure_leaves_host_routing

    def new_graph(self) -> torch.xpu.XPUGraph:
        return torch.xpu.XPUGraph()
