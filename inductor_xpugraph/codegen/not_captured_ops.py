"""Operators never captured on a device, partitioned out by Inductor around the graphs.

``trees.backends.unrecordable_ops`` lists, per device, the operators its graphs cannot record
(with ``config.never_capture_ops`` and ``config.allow_capture_ops``). Inductor splits a graph
into partitions around the fallback kernels named in ``custom_should_partition_ops``
(``Scheduler.should_partition``), and only with ``graph_partition`` on. So, while our wrapper
generates a graph for a device we graph, ``partitioning_around(ops)`` adds that
device's list to the user's ``custom_should_partition_ops`` and gives the user's list back
when the wrapper is generated. Graphs of devices we do not graph (upstream's cuda graphs
included) never see the addition. The cache key holds the lists (``cache_key``).

``listed_ops(...)`` then finds each listed operator the graph runs, with why and where: the
wrapper names them in a comment above each call ``call`` makes of one, and in the comment
block at the end; a graph Inductor could not split around one (``graph_partition`` off, the
CPU, an operator Inductor does not lower as a fallback kernel) is not captured at all
(``eligibility``).

Inductor's config is process-wide: compiles on several threads at once share the addition.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import threading
from collections.abc import Iterator, Sequence

import torch
from torch._inductor import config as inductor_config
from torch._inductor import ir
from torch._inductor.graph import GraphLowering
from torch._inductor.scheduler import BaseSchedulerNode, Scheduler
from torch._inductor.utils import get_op_names
from torch._inductor.virtualized import V

from ..trees.backends.unrecordable_ops import listed_name, why_not_captured
from ..trees.source_lines import user_source


@dataclasses.dataclass(frozen=True)
class ListedOp:
    """An operator the graph runs that is never captured on its device."""

    op: str  # the list entry that names it, "aten::_scaled_dot_product_flash_attention"
    reason: str  # why_not_captured(...)
    source: str | None  # the user's line, "model.py:12 in forward"
    buffer: str  # the buffer Inductor names its output, "buf3"
    fallback: bool  # a fallback kernel: Inductor partitions around it


@dataclasses.dataclass
class _Addition:
    graph: GraphLowering
    before: list[str]  # the user's custom_should_partition_ops
    after: list[str]  # with the device's list


_additions: list[_Addition] = []
_lock = threading.Lock()


def partitioning_around(ops: Sequence[str]) -> None:
    """Make Inductor partition the graph being generated around ``ops`` (until ``restore``)."""
    with _lock:
        _keep_multi_outputs_with_their_kernel()
        _drop_additions_of_failed_compiles()
        before = list(inductor_config.custom_should_partition_ops)
        after = list(dict.fromkeys([*before, *inductor_names(ops)]))
        _additions.append(_Addition(V.graph, before, after))
        inductor_config.custom_should_partition_ops = after


def inductor_names(ops: Sequence[str]) -> list[str]:
    """``ops`` as ``custom_should_partition_ops`` matches every overload they name. Inductor
    compares an overload's ``op.name()`` and ``op.name() + "." + overload`` with the list
    (``get_op_names``), and ``name()`` already ends in the overload's name unless it is
    ``default``: ``aten::x`` matches ``aten.x.default`` only, ``aten::x.quantized`` matches
    ``aten.x.quantized``. So each overload of a ``namespace::name`` entry is added by name."""
    names = []
    for op in ops:
        names.append(op)
        namespace, _, name = op.partition("::")
        if "." in name:
            continue
        try:
            packet = getattr(getattr(torch.ops, namespace), name)
        except (AttributeError, RuntimeError):  # not registered in this process
            continue
        names += [f"{op}.{overload}" for overload in packet.overloads() if overload != "default"]
    return names


def _keep_multi_outputs_with_their_kernel() -> None:
    """Partition out, with a listed kernel, the nodes that take its outputs out of its tuple.

    A fallback kernel with several outputs (flash attention returns its output and its
    log-sum-exp) is read through ``MultiOutput`` nodes (``buf2 = buf1[0]``), which Inductor
    places in the next partition: that partition then takes the kernel's tuple as an input.
    A graph cannot copy a tuple into its buffers, so each call passed a new one and recorded
    again (seen on the H100 with cuDNN attention listed). ``Scheduler.should_partition`` is
    wrapped, once, to partition those nodes out too while one of our additions is active,
    so the partition takes the tensors."""
    should_partition = Scheduler.should_partition
    if getattr(should_partition, "_keeps_multi_outputs", False):
        return

    @functools.wraps(should_partition)
    def wrapped(self: Scheduler, node: BaseSchedulerNode) -> str | None:
        reason = should_partition(self, node)
        if reason is None and _additions and isinstance(node.node, ir.MultiOutput):
            kernel = _kernel_of(node.node)
            op = getattr(kernel, "op_overload", None)
            if isinstance(kernel, ir.FallbackKernel) and op is not None:
                listed = inductor_config.custom_should_partition_ops
                if any(name in listed for name in get_op_names(op)):
                    return f"custom partition op: an output of {get_op_names(op)[1]}"
        return reason

    wrapped._keeps_multi_outputs = True  # type: ignore[attr-defined]
    Scheduler.should_partition = wrapped  # type: ignore[method-assign]


def _kernel_of(node: ir.MultiOutput) -> object:
    """The kernel whose (possibly nested) tuple ``node`` indexes."""
    while isinstance(node, ir.MultiOutput):
        node = node.inputs[0]
    return node


def restore() -> None:
    """Give back the ``custom_should_partition_ops`` of before ``partitioning_around``."""
    with _lock:
        for index in range(len(_additions) - 1, -1, -1):
            if _additions[index].graph is V.graph:
                _undo(_additions.pop(index))
                return


def _undo(addition: _Addition) -> None:
    # A list the user set meanwhile stays.
    if list(inductor_config.custom_should_partition_ops) == addition.after:
        inductor_config.custom_should_partition_ops = addition.before


def _drop_additions_of_failed_compiles() -> None:
    """A compile that raised between its wrapper's creation and ``generate`` never restored
    the list: undo its addition now, unless that compile is still running (an autotuning
    compile nested in it)."""
    running = set(map(id, _graphs_generating_code()))
    while _additions and id(_additions[-1].graph) not in running:
        _undo(_additions.pop())


def _graphs_generating_code() -> Iterator[GraphLowering]:
    """The graphs whose ``GraphLowering.codegen`` is on this thread's stack."""
    code = inspect.unwrap(GraphLowering.codegen).__code__
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            graph = frame.f_locals.get("self")
            if isinstance(graph, GraphLowering):
                yield graph
        frame = frame.f_back


def listed_op(node: object, device_type: str, ops: Sequence[str]) -> ListedOp | None:
    """``node`` (an operation of the graph being generated) as a ``ListedOp`` when it runs an
    operator of ``ops`` on ``device_type`` (a device graph's CPU ops are never captured)."""

    name = listed_name(getattr(node, "op_overload", None), tuple(ops))
    if name is None or not isinstance(node, ir.ExternKernel):
        return None
    device = node.get_device()
    if device is not None and device.type != device_type:  # a CPU op of a device graph
        return None
    fx_node = node.get_origin_node() or next(iter(node.origins), None)
    stack_trace = fx_node.meta.get("stack_trace") if fx_node is not None else None
    return ListedOp(
        op=name,
        reason=why_not_captured(device_type, name),
        source=user_source(stack_trace),
        buffer=node.get_name(),
        fallback=isinstance(node, ir.FallbackKernel),
    )


def listed_ops(device_type: str, ops: Sequence[str]) -> list[ListedOp]:
    """Every call of an operator of ``ops`` in the graph being generated, in program order."""
    found = (listed_op(node, device_type, ops) for node in V.graph.operations)
    return [op for op in found if op is not None]
