"""The CPU as an Intel GPU under SYCL Graph's rules: check a model's graphs before the hardware.

On an Intel GPU, ``torch.xpu.XPUGraph`` records through SYCL Graph, which refuses work a CUDA
capture accepts, and whose queues keep recording after some failures. The CPU emulator
(``enable("cpu")``) accepts everything; inside ``on_cpu`` the CPU follows SYCL Graph's rules
instead, as torch's XPU runtime of one release meets them::

    import torch
    from inductor_xpugraph import sycl_rules

    with sycl_rules.on_cpu("2.14", recording="native"):
        model = torch.compile(model, mode="reduce-overhead")
        out = model(x)

Inside, graphs on the CPU run through the xpu backend's own code (``DeviceGraphBackend``) over
a stand-in of torch's XPU runtime (``torch_xpu.StandInXpu``: a pool of 32 SYCL queues per
priority, XPUGraph's order of operations, the allocators' routing, the generator's capture
mode) built on a model of SYCL's queues, events and graphs (``sycl``), recorded through command
buffers (rules checked against Intel's SYCL runtime on the CPU:
tests/sycl_rules/test_sycl_rules_differential.py) or natively through Level Zero (torch >= 2.14 on
client GPUs; rules read from intel/llvm, which the CPU runtime cannot run). Every operator is
submitted to the current queue (``submission``); those SYCL Graph refuses under the release
and recording mode (``releases``) raise SYCL's error at capture, as they would on the GPU,
and the graphs that run what this package's list names are not captured (on the GPU,
Inductor partitions around them; it does not split CPU graphs). What it
shows: which of a model's graphs capture, what is left un-graphed and why (``report()``),
that a refused capture never fails a call. What it cannot: speed, and any kernel's own
behaviour (the kernels are Inductor's CPU kernels, replayed as on the emulator).

Modules: ``sycl`` (queues, events, command graphs, recorded through command buffers or
natively), ``releases`` (what each torch release's XPU runtime does, and refuses per
recording mode), ``torch_xpu`` (the device module), ``submission`` (operators to
queues), ``backend`` (the xpu backends over the stand-in).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..codegen import disable, enable, enabled_devices
from ..trees import forget_trees
from ..trees.backends.capture_streams import forget_capture_streams
from ..trees.backends.devices import Device, standing_in
from .backend import AcceleratorRulesBackend, XpuRulesBackend, use_device
from .releases import CPU_STAND_INS, RELEASES, Release, refused_ops, release_of
from .submission import SubmitToCurrentQueue
from .torch_xpu import StandInXpu


@contextlib.contextmanager
def on_cpu(
    release: str | None = None,
    *,
    recording: str | None = None,
    data_center_max: bool = False,
    graph_api: str = "xpu",
) -> Iterator[StandInXpu]:
    """Graphs on the CPU follow SYCL Graph's rules, as torch ``release``'s XPU runtime meets
    them ("2.11", "2.13", "2.14", "2.15"; default: the installed torch's), through
    ``torch.xpu.XPUGraph`` (``graph_api="xpu"``) or ``torch.accelerator.Graph``
    ("accelerator", torch >= 2.13).

    ``recording``: "command-buffer" or "native" (``trees.backends.xpu_recording``); by default
    the mode torch chooses for the release on a client GPU, or on a Data Center GPU Max with
    ``data_center_max``, in this process's environment (``SYCL_GRAPH_FORCE_NATIVE_RECORDING``).

    Enables the package for "cpu" meanwhile. The CPU's graphs made before are dropped on entry,
    and those made inside on exit (the counters stay, for ``stats()`` and ``report()``); the
    stand-in device goes with its state (a device it marked as unable to record, its capture
    streams). Yields the stand-in device (its queues, pools and generator, for tests). One
    thread: the rules apply to the thread that entered, and to the backwards it runs.
    """
    rules = release_of(release)
    if graph_api not in ("xpu", "accelerator"):
        raise ValueError(f"graph_api must be 'xpu' or 'accelerator', got {graph_api!r}")
    if graph_api == "accelerator" and not rules.has_accelerator_graph:
        raise ValueError(f"torch {rules.version} has no torch.accelerator.Graph")
    device = StandInXpu(rules, recording, data_center_max=data_center_max)
    backend = AcceleratorRulesBackend if graph_api == "accelerator" else XpuRulesBackend
    stands_for = {cpu: xpu for xpu, cpu in CPU_STAND_INS.items()}
    record = Device(
        "cpu", unrecordable_ops=device.refused_ops, backend=backend, stands_for=stands_for
    )
    was_enabled = "cpu" in enabled_devices()
    forget_trees("cpu")
    with standing_in(record):
        use_device(device)
        enable("cpu")
        try:
            with SubmitToCurrentQueue(device):
                yield device
        finally:
            forget_trees("cpu")
            use_device(None)
            forget_capture_streams(device)
            if not was_enabled:
                disable("cpu")


__all__ = ["RELEASES", "Release", "StandInXpu", "on_cpu", "refused_ops", "release_of"]
