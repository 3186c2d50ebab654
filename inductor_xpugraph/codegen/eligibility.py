"""Decide, while Inductor generates a wrapper, what may be captured and what may not.

Inductor itself checks most of its CUDA-graph skip rules *after* codegen (and on xpu it
only ever answers "multiple devices"). We need the answer *during* codegen, so that the
source says what will happen. This module replays those rules on ``V.graph`` and produces
a ``GraphPlan``: one ``GraphTarget`` per callable to wrap (``call``, or each
``partition_N`` when Inductor split the graph), or a reason why nothing is captured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch._inductor import config as inductor_config
from torch._inductor.virtualized import V
from torch._library.fake_class_registry import FakeScriptObject

from .. import config
from ..trees.node import Phase
from ..trees.source_lines import user_source
from .not_captured_ops import ListedOp

_ACCEPTED_INPUT_TYPES = (torch.Tensor, torch.SymInt, int, torch.Generator)

try:  # torch 2.13+: opaque objects (DTensor's DeviceMesh, process groups) as graph inputs
    from torch._library.opaque_object import is_opaque_value
except ImportError:  # torch 2.11: none reach a graph

    def is_opaque_value(value: object) -> bool:
        return False


def _accepted_input(value: object) -> bool:
    """Tensors and sizes, and objects a replay passes on unchanged (the runtime checks that
    each replay gets the objects the capture got)."""
    if isinstance(value, FakeScriptObject):  # torch 2.12 hands codegen the fake of the object
        value = value.real_obj
    return isinstance(value, _ACCEPTED_INPUT_TYPES) or is_opaque_value(value)


@dataclasses.dataclass(frozen=True)
class GraphTarget:
    name: str  # "call" or "partition_N"
    static_inputs: tuple[int, ...]  # positions not copied on replay
    copied_inputs: tuple[int, ...]  # tensor positions copied into static buffers
    mutated_inputs: tuple[int, ...]  # positions the graph writes to
    # What the static, mutated and object inputs are, by position, for messages about an
    # input that moved or is written (``graph_input_names``).
    input_names: dict[int, str] = dataclasses.field(default_factory=dict)
    # Static inputs the kernels take as aligned that Inductor does not check at each call
    # (``assumed_aligned_inputs``): checked by the runtime on every call that does not replay.
    aligned_inputs: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class GraphPlan:
    device: str  # "xpu:0"
    phase: Phase
    targets: tuple[GraphTarget, ...]
    skip_reason: str | None  # why nothing is captured, or None
    # The user's source line the graph comes from (of the op that prevents capture, when one
    # does), as ``path:line in function``; None when Inductor kept no stack trace.
    source: str | None = None
    # Operators never captured on the device that Inductor partitioned out: `call` runs
    # them un-graphed, between the graphed partitions.
    left_out: tuple[ListedOp, ...] = ()
    # Graph inputs (not static) that partitions after the first write and the first is not
    # passed: `call` tells the first partition which tensors they are, so that a generation
    # it starts keeps them as state (``trees.keep_state_written_later``).
    written_later: tuple[int, ...] = ()


def partitioned_device(device_type: str) -> bool:
    """Whether Inductor splits graphs of ``device_type`` into partitions around what cannot be
    captured: with ``graph_partition`` on, device kernels that can be captured go into
    ``partition_N`` functions (CPU ops, unsafe ops, unbacked sizes stay in ``call``). On the
    CPU every kernel stays in ``call`` (all are CPU ops): the CPU has no partitions."""
    return bool(inductor_config.graph_partition) and device_type != "cpu"


def plan_graphs(
    device_type: str, partition_names: Sequence[str], not_captured: Sequence[ListedOp] = ()
) -> GraphPlan:
    """The plan for the graph being generated; ``partition_names`` as the wrapper has them;
    ``not_captured``, the calls of operators never captured on the device."""
    graph = V.graph
    device_index = next(iter(graph.device_idxs), 0) if graph.device_idxs else 0
    device = f"{device_type}:{device_index}"
    phase = _phase()
    static = static_input_indices()
    aligned = assumed_aligned_inputs(static)
    # With graph partitions, the partition_N functions are what we capture; without, `call`.
    partitioned = partitioned_device(device_type)

    reason, culprit = _whole_graph_skip_reason(device_type, partitioned)
    if reason is None:
        reason = _mutation_skip_reason(static)
    culprit_source = user_source(culprit.meta.get("stack_trace")) if culprit else None
    # Never-captured operators Inductor partitioned out run between the partitions; any other
    # would be captured with the graph, which is then not captured at all.
    left_out = tuple(op for op in not_captured if partitioned and op.fallback)
    kept_in = [op for op in not_captured if op not in left_out]
    if reason is None and kept_in:
        reason = _not_partitioned_reason(kept_in[0], device_type)
        culprit_source = kept_in[0].source
    source = culprit_source or graph_source()
    if reason is None and partitioned and not partition_names:
        reason = "no device kernels to capture (no graph partitions)"
        min_size = getattr(inductor_config.triton, "cudagraph_min_partition_size", 0)
        if min_size:
            reason = (
                f"every partition has fewer kernels than triton.cudagraph_min_partition_size"
                f" ({min_size})"
            )
        if left_out:
            reason = f"{left_out[0].reason} (and the graph has nothing else to capture)"
    if reason is not None:
        return GraphPlan(device, phase, (), reason, source)

    is_tensor = [isinstance(x, torch.Tensor) for x in graph.example_inputs]
    sizes = {i for i, x in enumerate(graph.example_inputs) if isinstance(x, (int, torch.SymInt))}
    names = [None if i in sizes else name for i, name in enumerate(graph_input_names())]
    if not partitioned:
        target = _target("call", is_tensor, graph.mutated_input_idxs, static, names, aligned)
        return GraphPlan(device, phase, (target,), None, source)

    targets = []
    for name, partition_map in zip(partition_names, graph.partition_maps):
        # Partition inputs that are not graph inputs come from un-graphed code between
        # partitions: they are copied. Graph inputs keep their static/mutated status.
        mapping = partition_map.input_index_mapping
        partition_is_tensor = [True if g is None else is_tensor[g] for g in mapping]
        partition_static = [i for i, g in enumerate(mapping) if g is not None and g in static]
        partition_mutated = [
            i for i, g in enumerate(mapping) if g is not None and g in graph.mutated_input_idxs
        ]
        names_here = [names[g] if g is not None else None for g in mapping]
        partition_aligned = [i for i, g in enumerate(mapping) if g is not None and g in aligned]
        targets.append(
            _target(
                name,
                partition_is_tensor,
                partition_mutated,
                partition_static,
                names_here,
                partition_aligned,
            )
        )
    first_inputs = set(graph.partition_maps[0].input_index_mapping) if targets else set()
    written_later = tuple(
        i for i in sorted(graph.mutated_input_idxs) if i not in static and i not in first_inputs
    )
    return GraphPlan(device, phase, tuple(targets), None, source, left_out, written_later)


def _mutation_skip_reason(static: Sequence[int]) -> str | None:
    """Upstream's ``triton.cudagraph_support_input_mutation=False``: a graph that writes to an
    input that is not static is not captured, even where the input is an output of an earlier
    graph (which the trees can capture otherwise)."""
    if getattr(inductor_config.triton, "cudagraph_support_input_mutation", True):
        return None
    mutated = [i for i in sorted(V.graph.mutated_input_idxs) if i not in static]
    if not mutated:
        return None
    return (
        f"it mutates inputs {mutated} that are not static "
        f"(torch._inductor.config.triton.cudagraph_support_input_mutation=False)"
    )


def _not_partitioned_reason(op: ListedOp, device_type: str) -> str:
    """Why a graph that runs ``op`` is not captured at all: Inductor could not split it."""
    if not inductor_config.graph_partition:
        why = "torch._inductor.config.graph_partition is off: Inductor cannot partition around it"
    elif device_type == "cpu":
        why = "Inductor does not split CPU graphs into partitions"
    else:
        why = "Inductor partitions around fallback kernels only, and lowers it otherwise"
    return f"{op.reason} ({why})"


def static_input_indices() -> tuple[int, ...]:
    """Inputs at fixed addresses, as Inductor's own cudagraphs would get them, and those an
    export names (``deploy.export(..., static_inputs=...)``)."""
    graph = V.graph
    if graph.is_backward:
        # Saved activations and parameters: everything but the incoming gradients.
        from torch._inductor.utils import count_tangents

        return tuple(range(count_tangents(graph.module)))
    static = set(config._export_static_inputs)
    context = torch._guards.TracingContext.try_get()
    if context is not None and context.fw_metadata is not None:
        static.update(context.fw_metadata.static_input_indices)
    return tuple(sorted(static))


def assumed_aligned_inputs(static: Sequence[int]) -> frozenset[int]:
    """The static inputs Inductor's kernels take as aligned (``ALIGNMENT`` bytes) without
    checking them at each call, as Inductor's ``get_input_idxs_to_check`` decides: on a GPU,
    those aligned at compile time. A replay meets them at the addresses its recording was
    checked at; any other call may meet them elsewhere (a weight swapped for a view), where
    the kernels would read them wrong: the runtime checks them there (``GraphedCallable``)."""
    from torch._inductor.utils import (
        is_gpu,
        maybe_get_suppress_shape_guards_ctx,
        tensor_is_aligned,
    )

    inputs = V.graph.example_inputs
    aligned = set()
    with maybe_get_suppress_shape_guards_ctx():
        for i in static:
            value = inputs[i] if i < len(inputs) else None
            if (
                isinstance(value, torch.Tensor)
                and is_gpu(value.device.type)
                and tensor_is_aligned(value)
            ):
                aligned.add(i)
    return frozenset(aligned)


def _phase() -> Phase:
    if V.graph.is_inference:
        return Phase.INFERENCE
    return Phase.BACKWARD if V.graph.is_backward else Phase.FORWARD


def _whole_graph_skip_reason(
    device_type: str, partitioned: bool
) -> tuple[str | None, torch.fx.Node | None]:
    """Why nothing of the graph can be captured, and the node responsible when one is."""
    graph = V.graph
    if graph.disable_cudagraphs_reason:
        return graph.disable_cudagraphs_reason, None
    devices = set(graph.device_types) - {"meta"}
    if partitioned:
        devices.discard("cpu")  # CPU ops run between the captured partitions
    if devices != {device_type}:
        return f"the graph uses devices {sorted(devices)}, not only {device_type}", None
    if len(graph.device_idxs) > 1:
        return f"the graph uses several {device_type} devices {sorted(graph.device_idxs)}", None
    if inductor_config.triton.cudagraph_skip_dynamic_graphs and any(
        isinstance(x, torch.SymInt) for x in graph.example_inputs
    ):
        return (
            "graph with symbolic shapes inputs "
            "(torch._inductor.config.triton.cudagraph_skip_dynamic_graphs=True)"
        ), None
    bad_inputs = [i for i, x in enumerate(graph.example_inputs) if not _accepted_input(x)]
    if bad_inputs:
        return f"inputs {bad_inputs} are neither tensors nor sizes", None
    if not partitioned:
        from torch._inductor.utils import get_first_incompatible_cudagraph_node

        node = get_first_incompatible_cudagraph_node(graph.module)
        if node is not None:
            return f"op {node.target} cannot be captured (node {node.name})", node
    return None, None


def graph_source() -> str | None:
    """Where the graph being generated starts in the user's code: its first op's line."""
    for node in V.graph.module.graph.nodes:
        source = user_source(node.meta.get("stack_trace"))
        if source is not None:
            return source
    return None


def graph_input_names() -> list[str]:
    """Each input of the graph being generated, as its placeholder's name and where the user's
    code first reads it: ``arg3_1, read by L['self'].b (Linear) at model.py:20 in forward``.
    Inductor keeps no source for an input itself, only for the ops that use it."""
    names = []
    for node in V.graph.module.graph.find_nodes(op="placeholder"):
        name = node.name
        for user in node.users:
            source = user_source(user.meta.get("stack_trace"))
            if source is None:
                continue
            modules = list((user.meta.get("nn_module_stack") or {}).values())
            if modules:
                path, module_type = modules[-1]
                kind = getattr(module_type, "__name__", str(module_type))
                name += f", read by {path} ({kind}) at {source}"
            else:
                name += f", read at {source}"
            break
        names.append(name)
    return names


def _target(
    name: str,
    is_tensor: Sequence[bool],
    mutated: Sequence[int],
    static: Sequence[int],
    input_names: Sequence[str | None],
    aligned: Sequence[int] = (),
) -> GraphTarget:
    static_set = set(static)
    tensors = [i for i, tensor in enumerate(is_tensor) if tensor]
    static_inputs = tuple(i for i in tensors if i in static_set)
    copied_inputs = tuple(i for i in tensors if i not in static_set)
    mutated_inputs = tuple(sorted(mutated))
    # Named: the inputs a message may be about (moved, written, or another object than at
    # capture); sizes come without a name.
    objects = [i for i, tensor in enumerate(is_tensor) if not tensor]
    named = sorted(set(static_inputs) | set(mutated_inputs) | set(objects))
    names = {i: input_names[i] for i in named if i < len(input_names) and input_names[i]}
    # A mutated input that is not static is only safe to capture when, at run time, it is an
    # output of an earlier graph (the graph then writes into that memory, not into a copy):
    # the runtime decides that per call.
    aligned_set = set(aligned)
    aligned_inputs = tuple(i for i in static_inputs if i in aligned_set)
    return GraphTarget(name, static_inputs, copied_inputs, mutated_inputs, names, aligned_inputs)
