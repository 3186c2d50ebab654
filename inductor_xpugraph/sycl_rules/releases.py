"""What torch's XPU runtime does differently from one release to the next, as rule sets.

A ``Release`` holds the facts of one torch release's XPU runtime that decide what a graph
capture does there (read from PyTorch's and torch-xpu-ops' sources and issue threads; no
Intel GPU was run by this project): which operators SYCL Graph refuses to record, whether
``XPUGraph.capture_begin`` routes the host (pinned) allocator into the graph's pool, and
whether ``torch.accelerator.Graph`` exists. The stand-in device (``torch_xpu``) follows one of
them; ``trees.backends.unrecordable_ops`` lists, per release, what they refuse.

The stand-in runs Inductor's CPU code, so an xpu operator is refused through the CPU
operator that does its work there (``CPU_STAND_INS``): the CPU's attention forward stands for
oneDNN's (the kernel xpu picks when no input needs a gradient), its backward for the
sycl-tla flash backward (what training runs); oneMKL's linear algebra and FFT, and the
collectives, have the same operators on both devices.
"""

from __future__ import annotations

import dataclasses

from ..trees.backends.unrecordable_ops import ONEMKL_OPS, torch_release

_ONEDNN_ATTENTION = (
    "oneDNN's fused attention kernel raises \"Graph nodes cannot depend on events from outside "
    'the graph" under recording on torch 2.13 with oneDNN 3.12 (intel/torch-xpu-ops#5069; '
    "records on a 2.15 nightly)"
)
_FLASH_ATTENTION = (
    "the sycl-tla flash-attention kernels use work-group scratch memory, which SYCL Graph does "
    "not record (intel/torch-xpu-ops#3142)"
)
_ONEMKL = (
    'oneMKL makes the recording queue depend on an event of its own: "Graph nodes cannot '
    'depend on events from outside the graph" (ggml-org/llama.cpp#28725)'
)
_XCCL = "XCCL's queue: SYCL Graph rejects the cross-queue dependency (pytorch/pytorch#196490)"

#: The xpu operator each CPU operator stands for on the stand-in, where the names differ:
#: the CPU's attention forward stands for oneDNN's (the kernel xpu picks when no input needs
#: a gradient), its backward for the sycl-tla flash backward (what training runs).
CPU_STAND_INS: dict[str, str] = {
    "aten::_scaled_dot_product_fused_attention_overrideable": (
        "aten::_scaled_dot_product_flash_attention_for_cpu"
    ),
    "aten::_scaled_dot_product_flash_attention_backward": (
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward"
    ),
}


@dataclasses.dataclass(frozen=True)
class Release:
    """The XPU runtime of one torch release, as far as graph capture goes."""

    #: "2.11", "2.13" or "2.15".
    version: str
    #: xpu operators SYCL Graph refuses to record there, with why.
    refused_ops: dict[str, str]
    #: ``XPUGraph::capture_begin`` also routes the host caching allocator (pinned memory) into
    #: the pool, with a filter that refers to the graph; only a successful ``capture_end``
    #: ends that routing, and no Python call can (PyTorch's aten/src/ATen/xpu/XPUGraph.cpp).
    routes_host_allocator: bool
    #: ``torch.accelerator.Graph`` exists (without ``register_generator_state``).
    has_accelerator_graph: bool

    @property
    def number(self) -> tuple[int, int]:
        """``version`` as (major, minor)."""
        major, minor = self.version.split(".")
        return int(major), int(minor)

    def refused_cpu_ops(self) -> dict[str, str]:
        """``refused_ops``, named by the CPU operators that stand for them."""
        return {CPU_STAND_INS.get(op, op): why for op, why in self.refused_ops.items()}


def _refused(onednn_attention: bool) -> dict[str, str]:
    ops = {
        "aten::_scaled_dot_product_flash_attention": _FLASH_ATTENTION,
        "aten::_scaled_dot_product_flash_attention_backward": _FLASH_ATTENTION,
        **dict.fromkeys(ONEMKL_OPS, _ONEMKL),
        "_c10d_functional::wait_tensor": _XCCL,
    }
    if onednn_attention:
        ops["aten::_scaled_dot_product_fused_attention_overrideable"] = _ONEDNN_ATTENTION
    return ops


RELEASES: dict[str, Release] = {
    "2.11": Release("2.11", _refused(onednn_attention=True), False, False),
    "2.13": Release("2.13", _refused(onednn_attention=True), True, True),
    "2.15": Release("2.15", _refused(onednn_attention=False), True, True),
}


def release_of(version: str | None = None) -> Release:
    """The rule set of ``version`` ("2.13"), or of the installed torch: the newest release
    listed that is not newer than it."""
    if version is not None:
        if version not in RELEASES:
            raise ValueError(
                f"inductor_xpugraph.sycl_rules has no rule set for torch {version!r}: "
                f"choose one of {sorted(RELEASES)}"
            )
        return RELEASES[version]
    known = [release for release in RELEASES.values() if release.number <= torch_release()]
    return max(known, key=lambda release: release.number) if known else RELEASES["2.11"]
