"""``DeviceOpOverrides`` for the devices we graph: the stock ones plus the graph runtime.

Each class subclasses Inductor's in-tree overrides for its device, so every stock method
(device guards, raw stream import, synchronize; their torch 2.11/2.13 differences) is kept.
What is added is what the wrapper needs to emit graph-tree code for that device.
"""

from __future__ import annotations

from torch._inductor.codegen.cpu_device_op_overrides import CpuDeviceOpOverrides
from torch._inductor.codegen.cuda.device_op_overrides import CUDADeviceOpOverrides
from torch._inductor.codegen.xpu.device_op_overrides import XPUDeviceOpOverrides


class GraphTreeOpsMixin:
    """What the graph-tree wrapper asks of a device."""

    graph_device_type: str
    #: The device's graphs are emulated (cpu): the emitted comment says so.
    emulated_graphs = False


class XPUGraphTreeOpOverrides(GraphTreeOpsMixin, XPUDeviceOpOverrides):
    graph_device_type = "xpu"


class CUDAGraphTreeOpOverrides(GraphTreeOpsMixin, CUDADeviceOpOverrides):
    graph_device_type = "cuda"


class CpuEmulationOpOverrides(GraphTreeOpsMixin, CpuDeviceOpOverrides):
    graph_device_type = "cpu"
    emulated_graphs = True


OP_OVERRIDES = {
    "xpu": XPUGraphTreeOpOverrides,
    "cuda": CUDAGraphTreeOpOverrides,
    "cpu": CpuEmulationOpOverrides,
}
