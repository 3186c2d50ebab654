"""What xpu's graphs cannot record: the operators never captured there, with why and the source.

A CUDA stream capture records almost any device work. SYCL Graph, under ``torch.xpu.XPUGraph``,
refuses some, and a capture that meets one fails at run time. Listed here, the operator is
partitioned out at compile time instead (``unrecordable_ops`` reads the list in force; the
device's record, ``devices.Device``, holds it).

The list, read from PyTorch's and torch-xpu-ops' sources and issues (no Intel GPU was run by
this project):

What an xpu graph records also depends on how ``XPUGraph`` records on the device
(``xpu_recording``): through SYCL Graph's command buffers (torch 2.11-2.13; Data Center GPU
Max) or natively through Level Zero (torch 2.14+ on other GPUs). Native recording captures
whatever reaches the queue's Level Zero command list, so work SYCL's command buffers refuse
only for being SYCL-side constructs records there; a dependency on an event from before the
recording fails in both modes (intel/llvm ``sycl/test-e2e/Graph/RecordReplay/NativeRecording/
exception_external_event.cpp``).

- Attention. ``F.scaled_dot_product_attention`` on xpu picks, in this order (``priority_order``
  in PyTorch's ``aten/src/ATen/native/mkldnn/xpu/Attention.cpp``), oneDNN's kernel
  (``aten::_scaled_dot_product_fused_attention_overrideable``, only when no input needs a
  gradient), the flash-attention kernels of torch-xpu-ops (``_scaled_dot_product_flash_attention``
  and its backward, built on sycl-tla; what training runs), then the math decomposition. The
  flash kernels use work-group scratch memory, which SYCL Graph's command buffers refused to
  record (intel/torch-xpu-ops#3142, whose failing test captures exactly these two ops;
  vllm-project/vllm#50038 gates the same kernels in graphs on oneAPI 2026.0); native recording
  records it (intel/llvm ``NativeRecording/work_group_scratch_memory.cpp``): listed under
  command buffers only. (intel/llvm#21029 adds it to command buffers too; which torch release
  ships that runtime is not known here, so the entry stays.) oneDNN's kernel raises "Graph
  nodes cannot depend on events from outside the graph" under recording on torch 2.13 with
  oneDNN 3.12 (intel/torch-xpu-ops#5069, whose reproducer warms up and captures on one queue,
  as this package does) and records on a 2.15 nightly: listed before torch 2.15, in both
  modes (the failure is a dependency on an outside event, which native recording refuses too).
- oneMKL. ``torch.linalg`` and ``torch.fft`` on xpu run oneMKL, whose calls make the recording
  queue depend on an event of their own; oneMKL's GEMM under SYCL recording raised "Graph
  nodes cannot depend on events from outside the graph" (ggml-org/llama.cpp#28725, a pull
  request). Listed on every release and in both modes, for the same reason as oneDNN's
  attention (``python -m inductor_xpugraph doctor`` tries each on the machine; where they
  record, ``config.allow_capture_ops`` takes them off).
- Collectives. ``ProcessGroupXCCL::collective`` (torch-xpu-ops ``src/xccl``) runs every
  collective on XCCL's own queue behind an event. CUDA capture follows such a dependency into
  the other stream; SYCL Graph rejects it at capture (pytorch/pytorch#196490, open).
  intel/torch-xpu-ops#2992 lets all_reduce, all_gather and reduce_scatter record with
  oneCCL >= 2021.17.2 (not broadcast or point-to-point). In Inductor graphs every functional
  collective is a fallback kernel (``comm_lowering``), ``wait_tensor`` (and, from torch 2.15,
  ``wait_tensors``) included, which make the recording queue wait for XCCL's: all are listed,
  but the three that #2992 records are not where oneCCL >= 2021.17.2 is installed
  (``Listed.recorded_from``; torch's XPU wheels install oneCCL as a Python distribution).

- Host waits. SYCL refuses any host wait on recorded work: a wait on a node's event
  ("wait method cannot be used for an event associated with a command graph.") or on a recording
  queue, in both recording modes (natively as a Level Zero error). torch-xpu-ops' kernels of
  these operators wait on the host, in every release from 2.11 (intel/torch-xpu-ops, branches
  release/2.11 to release/2.14 and main; paths below): ``.item()`` inside the kernel
  (``_local_scalar_dense_xpu``, ``src/ATen/native/xpu/XPUScalar.cpp``: a copy to the host, then
  ``wait()`` on its event), a count read back to size an output (the ``pstl::copy_if`` and
  ``pstl::unique`` helpers of ``sycl/pstl/PSTLFunctions.h``), or a blocking copy
  (``Copy.cpp``'s ``memcpy`` + ``wait()``). Inductor keeps most of them out of graphs already
  (a data-dependent output size graph-breaks or makes an unbacked size); listed here are those
  whose output size is static, which can sit in a graph Inductor would capture (the embedding
  backward of every training graph with an ``nn.Embedding`` first: intel/torch-xpu-ops#4717 and
  pytorch/torchtitan#4547 met SYCL's text there), and the others for when a graph holds one.
  ``Listed.waits_on_host`` marks them.

An entry (``Listed``) may hold for some torch releases (``Listed.before``), recording modes
(``Listed.recordings``) or library versions (``Listed.recorded_from``) only.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import re
from collections.abc import Callable

from .xpu_recording import COMMAND_BUFFER, RECORDING_MODES

_FLASH_ATTENTION = (
    "its sycl-tla flash-attention kernels use work-group scratch memory, which SYCL Graph's "
    "command buffers do not record; native recording does (intel/torch-xpu-ops#3142)"
)
_XCCL_QUEUE = (
    "XCCL runs it on a queue of its own, and SYCL Graph rejects a dependency on another queue "
    "at capture (pytorch/pytorch#196490)"
)
_XCCL_QUEUE_ONECCL = (
    "XCCL runs it on a queue of its own, and SYCL Graph rejects a dependency on another queue "
    "at capture (pytorch/pytorch#196490; intel/torch-xpu-ops#2992 records it with oneCCL >= "
    "2021.17.2)"
)
_ONEDNN_ATTENTION = (
    "oneDNN's fused attention kernel makes the recording queue depend on an event from outside "
    "the graph, which SYCL Graph rejects on torch 2.13 with oneDNN 3.12 "
    "(intel/torch-xpu-ops#5069; records from torch 2.15)"
)
_ONEMKL = (
    "oneMKL makes the recording queue depend on an event of its own, which SYCL Graph rejects "
    "(ggml-org/llama.cpp#28725)"
)
#: oneMKL-backed operators of torch's XPU build (``torch.linalg``, ``torch.fft``).
ONEMKL_OPS = (
    "aten::_fft_c2c aten::_fft_r2c aten::_fft_c2r aten::linalg_lu_factor_ex "
    "aten::linalg_lu_solve aten::linalg_qr aten::_linalg_eigh aten::_linalg_svd "
    "aten::linalg_cholesky_ex aten::linalg_inv_ex aten::_linalg_solve_ex "
    "aten::linalg_solve_triangular aten::triangular_solve"
).split()
_XCCL_WAIT = (
    "it makes the recording queue wait for XCCL's queue, a dependency SYCL Graph rejects at "
    "capture (pytorch/pytorch#196490)"
)


def _functional_collectives(names: str, reason: str | Listed) -> dict[str, str | Listed]:
    return {f"_c10d_functional::{name}": reason for name in names.split()}


@dataclasses.dataclass(frozen=True)
class Listed:
    """Why an operator is not captured, before which torch release (None: on all), and under
    which recording modes (``xpu_recording``)."""

    reason: str
    before: tuple[int, int] | None = None
    recordings: tuple[str, ...] = RECORDING_MODES
    #: (library, version): where this library is installed at this version or later, the
    #: runtime records the operator (None: no library does).
    recorded_from: tuple[str, tuple[int, ...]] | None = None
    #: Its kernel waits on the host: inside a recording the wait throws, in either mode.
    waits_on_host: bool = False

    def holds_for(
        self, release: tuple[int, int], recording: str, library_version: LibraryVersion
    ) -> bool:
        if self.recorded_from is not None:
            library, first = self.recorded_from
            found = library_version(library)
            if found is not None and found >= first:
                return False
        return (self.before is None or release < self.before) and recording in self.recordings


#: ``(library) -> its installed version, or None``.
LibraryVersion = Callable[[str], "tuple[int, ...] | None"]
#: The oneCCL release whose XCCL records all_reduce, all_gather and reduce_scatter
#: (intel/torch-xpu-ops#2992, ``errorIfCapturingNonCapturableXCCL``).
ONECCL_RECORDS_COLLECTIVES = ("oneccl", (2021, 17, 2))


@functools.cache
def installed_library_version(library: str) -> tuple[int, ...] | None:
    """The version of ``library`` as this Python installed it, or None. torch's XPU wheels
    install oneCCL as the ``oneccl`` / ``oneccl-devel`` distributions, whose versions are
    oneCCL's own (intel/torch-xpu-ops ``.github/scripts/env.sh``)."""
    for distribution in (library, f"{library}-devel"):
        try:
            version = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
        return tuple(int(part) for part in re.findall(r"\d+", version)[:3])
    return None


def no_library(library: str) -> None:
    """``LibraryVersion`` of a runtime described by its torch release only (the stand-in)."""
    return None


def _waits(how: str, seen: str = "vllm-project/vllm-xpu-kernels#567") -> Listed:
    """``seen``: where a real card threw SYCL's wait text inside a capture for such a wait."""
    return Listed(
        f"its XPU kernel waits on the host ({how}), and SYCL Graph refuses a host wait on "
        f"recorded work: 'wait method cannot be used for an event associated with a command "
        f"graph.' ({seen})",
        waits_on_host=True,
    )


_TXO = "intel/torch-xpu-ops src/ATen/native/xpu/"
_ITEM = "an .item() inside the kernel"
#: Operators whose XPU kernels wait on the host, with how and where (intel/torch-xpu-ops).
HOST_WAITING_OPS: dict[str, Listed] = {
    "aten::_local_scalar_dense": _waits(f"a copy to the host, then a wait, {_TXO}XPUScalar.cpp"),
    "aten::nonzero_static": _waits(
        f"it runs the full nonzero kernel, which reads its count back, {_TXO}Nonzero.cpp"
    ),
    "aten::embedding_dense_backward": _waits(
        f"pstl::copy_if and an .item() of the segment count, {_TXO}sycl/EmbeddingBackwardKernel.h",
        seen="intel/torch-xpu-ops#4717, pytorch/torchtitan#4547",
    ),
    "aten::_embedding_bag_backward": _waits(
        f"the embedding backward's pstl::copy_if and .item(), {_TXO}sycl/EmbeddingBag.cpp"
    ),
    "aten::_embedding_bag_dense_backward": _waits(
        f"the embedding backward's pstl::copy_if and .item(), {_TXO}sycl/EmbeddingBag.cpp"
    ),
    "aten::embedding_renorm_": _waits(
        f"pstl::unique reads its count back, {_TXO}sycl/Embedding.cpp"
    ),
    "aten::histc": _waits(
        f"{_ITEM}, of the input's range when min == max, {_TXO}sycl/SummaryOpsKernels.cpp"
    ),
    "aten::bincount": _waits(
        f"the input's range copied to the host, {_TXO}sycl/SummaryOpsKernels.cpp"
    ),
    "aten::nanmedian": _waits(f"{_ITEM}, of the NaN count, {_TXO}Sorting.cpp"),
    "aten::multinomial": _waits(
        f"{_ITEM}, of checks on the probabilities (ATen Distributions.cpp)"
    ),
    "aten::equal": _waits(f"{_ITEM}, {_TXO}Equal.cpp"),
    "aten::_linalg_check_errors": _waits(
        f"{_ITEM}, of the info codes (ATen BatchLinearAlgebra.cpp)"
    ),
    "aten::batch_norm_gather_stats": _waits(
        f"a blocking copy of the counts to the device, {_TXO}sycl/BatchNormKernels.cpp"
    ),
    "aten::_ctc_loss": _waits(
        f"a blocking copy of the target offsets to the device, {_TXO}sycl/LossCTCKernels.cpp"
    ),
    "aten::_fused_moving_avg_obs_fq_helper": _waits(
        f"{_ITEM}, {_TXO}quantized/FusedObsFakeQuant.cpp"
    ),
}


#: The operators xpu's graphs are known not to record, with why. Names as
#: ``custom_should_partition_ops`` takes them ("namespace::op[.overload]").
XPU_UNRECORDABLE_OPS: dict[str, str | Listed] = {
    "aten::_scaled_dot_product_fused_attention_overrideable": Listed(
        _ONEDNN_ATTENTION, before=(2, 15)
    ),
    "aten::_scaled_dot_product_fused_attention_overrideable_backward": Listed(
        _ONEDNN_ATTENTION, before=(2, 15)
    ),
    "aten::_scaled_dot_product_flash_attention": Listed(
        _FLASH_ATTENTION, recordings=(COMMAND_BUFFER,)
    ),
    "aten::_scaled_dot_product_flash_attention_backward": Listed(
        _FLASH_ATTENTION, recordings=(COMMAND_BUFFER,)
    ),
    **_functional_collectives(
        "all_reduce all_reduce_ all_gather_into_tensor all_gather_into_tensor_out "
        "reduce_scatter_tensor reduce_scatter_tensor_out",
        Listed(_XCCL_QUEUE_ONECCL, recorded_from=ONECCL_RECORDS_COLLECTIVES),
    ),
    **_functional_collectives(
        "all_reduce_coalesced all_reduce_coalesced_ all_gather_into_tensor_coalesced "
        "reduce_scatter_tensor_coalesced",
        _XCCL_QUEUE,
    ),
    **_functional_collectives(
        "all_to_all_single broadcast broadcast_ isend irecv batch_p2p_ops", _XCCL_QUEUE
    ),
    "_c10d_functional::wait_tensor": _XCCL_WAIT,
    "_c10d_functional::wait_tensors": _XCCL_WAIT,
    **dict.fromkeys(ONEMKL_OPS, _ONEMKL),
    **HOST_WAITING_OPS,
}
