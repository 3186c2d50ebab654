"""Operators submitted to the stand-in's current queue, with SYCL Graph's rules applied.

``SubmitToCurrentQueue`` is a dispatch mode: every ATen operator on real tensors goes to the
current stream's queue of the stand-in device (``torch_xpu.StandInXpu``), which decides:

- the queue executes: the operator runs. A random operator while the default generator is in
  capture mode raises torch's "Offset increment outside graph capture" (a failed capture that
  left it there poisons every later random op);
- the queue records, and a capture is running its callable into that recording: an operator
  SYCL Graph refuses on the release and recording mode (``StandInXpu.refused_ops``) raises
  SYCL's "Graph nodes cannot depend on events from outside the graph." (natively recorded:
  Level Zero's refusal of the same) at submission; any
  other runs now (the capture's run is the graph's first replay, as on the CPU emulator);
- the queue records and no capture runs into it (a queue a failed capture left recording, or
  one that joined a recording by waiting for it): the operator becomes a node of that graph
  and does not run. What it returns is allocated but never written (NaN, or the type's
  lowest value); what it would have written in place keeps its old contents.

An operator whose kernel waits on the host (``StandInXpu.host_waits``: ``.item()``, and what
the package's do-not-capture list marks ``waits_on_host``) copies to the host and waits on the
copy's event: on a recording queue, live or not, the wait throws SYCL's text, as on an Intel GPU
(a copy node, then a host wait on it: tests/sycl_rules/sycl_cpu/scenarios.py,
``scenario_blocking_copy_on_recording_queue``). An operator from outside ATen (a custom
operator) runs its body in a live capture with this mode still on: its own operators are
submitted one by one, so an ``.item()`` or a refused operator inside it fails the capture as
it would on the device.

Operators that only make views or allocate run everywhere (they launch nothing). Fake and
meta tensors (while Dynamo and AOTAutograd trace) pass through untouched.

It is an infra mode (``is_infra_mode``) so that ``torch.compile`` compiles and runs its
compiled code inside it; user modes are refused by Dynamo.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from . import sycl
from .torch_xpu import OFFSET_OUTSIDE_CAPTURE, StandInXpu

_LAUNCHES_NOTHING = {
    torch.ops.aten.empty.memory_format,
    torch.ops.aten.empty_strided.default,
    torch.ops.aten.detach.default,
    torch.ops.aten.set_.source_Storage,
    torch.ops.aten.set_.source_Storage_storage_offset,
}


#: Namespaces of operators whose kernels are the device's own; others have bodies of operators.
_ATEN_NAMESPACES = frozenset({"aten", "prims"})
#: Where a custom operator's body is found once this mode has seen the operator.
_BODY_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def _copy_to_host() -> None:
    """The copy a blocking device-to-host transfer submits (its values are the operator's)."""


def operator_name(func: Any) -> str:
    """``aten::mm``: the name ``custom_should_partition_ops`` and the rule sets use."""
    return func._schema.name


class SubmitToCurrentQueue(TorchDispatchMode):
    """Every operator goes to the stand-in device's current queue (module docstring)."""

    def __init__(self, device: StandInXpu) -> None:
        super().__init__()
        self.device = device
        self.refused = device.refused_ops

    @classmethod
    def is_infra_mode(cls) -> bool:
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _tracing(args, kwargs):
            return func(*args, **kwargs)
        device = self.device
        queue = device.current_stream().queue
        recording = queue.recording_into
        if recording is None:
            if (
                torch.Tag.nondeterministic_seeded in func.tags
                and device.default_generators[0].state.capturing
            ):
                raise RuntimeError(OFFSET_OUTSIDE_CAPTURE)
            return func(*args, **kwargs)
        if func in _LAUNCHES_NOTHING or func.is_view:
            return func(*args, **kwargs)
        name = operator_name(func)
        if name in device.host_waits:  # a copy to the host, then a wait on it
            queue.submit(_copy_to_host).wait()
        if recording in device.live_recordings:
            if torch.Tag.nondeterministic_seeded in func.tags:  # philox_xpu_state's increase
                device.default_generators[0].state.offset_intragraph += 4
            if name in self.refused:
                raise sycl.SyclError(
                    sycl.NATIVE_OUTSIDE_EVENT
                    if recording.native
                    else sycl.NODE_DEPENDS_ON_OUTSIDE_EVENT
                )
            if func.namespace not in _ATEN_NAMESPACES:  # a custom operator: its body, op by op
                with self:
                    return func.redispatch(_BODY_KEYS, *args, **kwargs)
            return func(*args, **kwargs)
        device.dropped_work += 1
        return _recorded_not_run(func, args, kwargs)


def _tracing(args: Any, kwargs: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    flat, _ = tree_flatten((args, kwargs))
    return any(
        isinstance(t, torch.Tensor) and (isinstance(t, FakeTensor) or t.device.type == "meta")
        for t in flat
    )


def _recorded_not_run(func: Any, args: Any, kwargs: Any) -> Any:
    """What a recorded operator returns without running: its outputs, never written; its
    in-place and ``out=`` arguments, unchanged."""
    written = _written_arguments(func, args, kwargs)
    stand_ins = {id(t): t.clone() for t in written}
    originals = {id(stand_ins[id(t)]): t for t in written}

    def swap(value: Any) -> Any:
        return stand_ins.get(id(value), value) if isinstance(value, torch.Tensor) else value

    result = func(*tree_map(swap, args), **tree_map(swap, kwargs))

    def unwritten(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        if id(value) in originals:
            return originals[id(value)]
        if value.is_floating_point() or value.is_complex():
            value.fill_(float("nan"))
        elif value.dtype != torch.bool:
            value.fill_(torch.iinfo(value.dtype).min)
        return value

    return tree_map(unwritten, result)


def _written_arguments(func: Any, args: Any, kwargs: Any) -> list[torch.Tensor]:
    written = []
    for i, argument in enumerate(func._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(argument.name)
        flat, _ = tree_flatten(value)
        written += [t for t in flat if isinstance(t, torch.Tensor)]
    return written
