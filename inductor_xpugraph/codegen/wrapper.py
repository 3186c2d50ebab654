"""The Python wrapper codegen that emits graph-tree capture and replay calls.

``GraphTreeWrapperCodegen`` is Inductor's ``PythonWrapperCodegen`` plus one step at the end
of the module: when Inductor's graph switch is on (``mode="reduce-overhead"``, i.e.
``torch._inductor.config.triton.cudagraphs``), it renders a template that wraps ``call`` —
or each ``partition_N`` when Inductor partitioned the graph — with
``inductor_xpugraph.trees.graphify(...)``, with the device, static/mutated inputs and phase
baked in; or, when the graph cannot be captured, a comment and a ``record_skip`` call saying
why. Operators the device's graphs cannot record are partitioned out while the wrapper is
generated (``not_captured_ops``); a comment above each call of one says why it runs
un-graphed. Everything else in the module is stock Inductor output.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._inductor import config as inductor_config
from torch._inductor.codegen.wrapper import MemoryPlanningLine, PythonWrapperCodegen
from torch._inductor.utils import IndentedBuffer
from torch._inductor.virtualized import V

from ..trees.backends.unrecordable_ops import ops_not_to_capture
from ..trees.recording_policy import RecordingSettings
from . import not_captured_ops
from .eligibility import partitioned_device, plan_graphs
from .render import render

# What Inductor's own cudagraphs see for a graph we own (it is pickled with the compiled
# graph, so cache hits are protected too): they must never capture the same code again.
OWNED_REASON = "graphs are captured by inductor_xpugraph in the generated wrapper"


class GraphTreeWrapperCodegen(PythonWrapperCodegen):
    # The operators never captured on this graph's device (see `create`).
    not_captured: tuple[str, ...] = ()
    # Whether Inductor partitions this graph around them until `generate`.
    partitioning_around: bool = False

    @staticmethod
    def create(
        is_subgraph: bool, subgraph_name: str | None, parent_wrapper: Any, *args: Any, **kwargs: Any
    ) -> PythonWrapperCodegen:
        if is_subgraph:  # subgraphs (control flow bodies) are part of their parent's graph
            return PythonWrapperCodegen.create(
                is_subgraph, subgraph_name, parent_wrapper, *args, **kwargs
            )
        wrapper = GraphTreeWrapperCodegen()
        if inductor_config.triton.cudagraphs:
            device_type = graph_device_type()
            wrapper.not_captured = ops_not_to_capture(device_type)
            # Inductor schedules the graph after this: until `generate` it partitions the
            # graph around these operators too.
            if wrapper.not_captured and partitioned_device(device_type):
                not_captured_ops.partitioning_around(wrapper.not_captured)
                wrapper.partitioning_around = True
        return wrapper

    def generate(self, is_inference: bool) -> Any:
        try:
            return super().generate(is_inference)
        finally:
            if self.partitioning_around:
                not_captured_ops.restore()

    def writeline(self, line: Any) -> None:
        node = getattr(line, "node", None)
        if self.not_captured and node is not None and not isinstance(line, MemoryPlanningLine):
            listed = not_captured_ops.listed_op(node, graph_device_type(), self.not_captured)
            if listed is not None:
                for comment in render("not_graphed_op.py.j2", op=listed).splitlines():
                    super().writeline(comment)
        super().writeline(line)

    def generate_after_suffix(self, result: IndentedBuffer) -> None:
        if not inductor_config.triton.cudagraphs:
            return super().generate_after_suffix(result)
        device_type = graph_device_type()
        plan = plan_graphs(
            device_type,
            list(getattr(self, "all_partition_names", ())),
            not_captured_ops.listed_ops(device_type, self.not_captured),
        )
        V.graph.disable_cudagraphs_reason = (
            OWNED_REASON if plan.skip_reason is None else f"{plan.skip_reason} ({OWNED_REASON})"
        )
        context = dict(
            plan=plan,
            device=plan.device,
            device_type=device_type,
            phase=plan.phase.value,  # generated code names it as a string
            emulated=getattr(V.graph.device_ops, "emulated_graphs", False),
            # Read here, on the compiling thread, and baked into each graphify(...) call.
            recording=RecordingSettings.current(),
            module_label=_module_label(),
        )
        if plan.skip_reason is not None:
            super().generate_after_suffix(result)
            result.splice(render("not_captured.py.j2", reason=plan.skip_reason, **context))
        elif plan.targets[0].name == "call":
            super().generate_after_suffix(result)
            inductor_runner = bool(inductor_config.graph_partition)  # see generate_after_suffix
            result.splice(render("graphify_call.py.j2", inductor_runner=inductor_runner, **context))
        else:
            result.splice(render("graphify_partitions.py.j2", **context))


def graph_device_type() -> str:
    device_ops = V.graph.device_ops
    return getattr(device_ops, "graph_device_type", None) or V.graph.device_type


def _module_label() -> str:
    """The AOT graph name (e.g. ``0_inference``), already printed in the module header."""
    context = torch._guards.TracingContext.try_get()
    name = getattr(context, "aot_graph_name", None) if context is not None else None
    if not name:
        return "graph"
    return "_".join(map(str, name)) if isinstance(name, (list, tuple)) else str(name)
