"""XPU backend: ``torch.xpu.XPUGraph`` (torch >= 2.11) over the shared stream-capture backend.

XPUGraph's ``capture_begin`` takes only ``pool`` (no capture error mode), and XPU has no
allocator checkpointing: the runtime's portable memory strategy is the one used here.
Not run on Intel hardware by this project: the same code path is exercised on CUDA.
"""

from __future__ import annotations

import torch

from .device_graphs import DeviceGraphBackend


class XpuGraphBackend(DeviceGraphBackend):
    device_type = "xpu"
    device_module = torch.xpu
    end_allocate_to_pool = staticmethod(torch._C._xpu_endAllocateToPool)
    release_pool = staticmethod(torch._C._xpu_releasePool)

    def new_graph(self) -> torch.xpu.XPUGraph:
        return torch.xpu.XPUGraph()
