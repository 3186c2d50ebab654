"""Where a training step's time goes: the profiler's events, sorted by who spends them.

``profile_steps(run_step, steps)`` runs ``steps`` steps under ``torch.profiler`` and returns
milliseconds per step, in two breakdowns:

- **host**: the self time of every CPU event (an event's duration less its children's), charged
  to the outermost *region* around it (FSDP's hooks, a compiled forward, a compiled backward,
  the optimizer, the loss read back; else "eager ops") and, inside it, to the innermost *kind*
  of work (a graph launch, a copy of a graph's inputs, another device launch, a host wait;
  else the region's own work: for a compiled call, Dynamo's guards, AOTAutograd's wrappers,
  the generated wrapper and the graph tree's bookkeeping). The main thread's time between
  events ("step: between events") is Python between operators, and its wait in ``backward()``
  while the autograd engine's thread runs the backward, whose events are charged as above.
- **device**: kernel, copy and set time on the device, charged the same way through the host
  call that launched it (a graph's kernels to its launch), and the time the device was busy
  at all (the union of those intervals: collectives overlap compute).

The regions are FSDP2's own ``record_function`` labels (``FSDP::pre_forward``, ...), Dynamo's
``Torch-Compiled Region``, AOTAutograd's ``CompiledFunctionBackward`` and the optimizer's
``Optimizer.step#...``: nothing in the profiled code is changed to be measured.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import torch
from torch.autograd import DeviceType

STEP_LABEL = "profiled step"

# (region, test on an event's name): the outermost match around an event is its region.
REGIONS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("FSDP hooks", lambda name: name.startswith("FSDP::")),
    ("compiled forward", lambda name: name.startswith("Torch-Compiled Region")),
    ("compiled backward", lambda name: name.startswith("CompiledFunctionBackward")),
    ("optimizer", lambda name: name.startswith("Optimizer.")),
    ("loss read back", lambda name: name in ("aten::item", "aten::_local_scalar_dense")),
)
# (kind, test): the innermost match at or around an event is its kind of work.
KINDS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("graph launch", lambda name: name in ("cudaGraphLaunch", "cuGraphLaunch")),
    ("host wait", lambda name: "Synchronize" in name or name.endswith("EventSynchronize")),
    ("copy", lambda name: name in ("aten::copy_", "aten::_foreach_copy_")),
    ("device launch", lambda name: name.startswith(("cuda", "cu")) and "Launch" in name),
)
_DEVICE_TYPES = (DeviceType.CUDA, getattr(DeviceType, "XPU", DeviceType.CUDA))


def profile_steps(run_step: Callable[[], None], steps: int) -> dict:
    """``steps`` calls of ``run_step`` under the profiler; the breakdown per step (ms)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            with torch.profiler.record_function(STEP_LABEL):
                run_step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    return breakdown(prof.profiler.kineto_results.events(), steps)


class _Event:
    __slots__ = ("name", "start", "end", "parent", "children_ns", "charge")

    def __init__(self, raw) -> None:
        self.name = raw.name()
        self.start, self.end = raw.start_ns(), raw.start_ns() + raw.duration_ns()
        self.parent: _Event | None = None
        self.children_ns = 0
        self.charge: tuple[str, str] | None = None


def breakdown(raw_events, steps: int) -> dict:
    """The two breakdowns (see the module docstring) of the events of ``steps`` steps."""
    host_events, by_correlation, device_events = [], {}, []
    for raw in raw_events:
        if raw.device_type() == DeviceType.CPU:
            event = _Event(raw)
            host_events.append((raw.start_thread_id(), event))
            by_correlation[raw.correlation_id()] = event
        elif raw.device_type() in _DEVICE_TYPES:
            device_events.append(raw)
    _link_parents(host_events)
    steps_ns = sum(e.end - e.start for _, e in host_events if e.name == STEP_LABEL)

    host: collections.Counter = collections.Counter()
    for _, event in host_events:
        if event.name == STEP_LABEL:
            host[("step", "between events")] += event.end - event.start - event.children_ns
        elif _inside_a_step(event):
            host[_charge(event)] += event.end - event.start - event.children_ns
    device: collections.Counter = collections.Counter()
    intervals = []
    for raw in device_events:
        launcher = by_correlation.get(raw.linked_correlation_id())
        if launcher is None or not _inside_a_step(launcher):
            continue
        device[_charge(launcher)] += raw.duration_ns()
        intervals.append((raw.start_ns(), raw.start_ns() + raw.duration_ns()))

    def per_step(counter) -> dict[str, float]:
        rows = sorted(counter.items(), key=lambda item: -item[1])
        return {f"{region}: {kind}": ns / steps / 1e6 for (region, kind), ns in rows}

    return {
        "step ms": steps_ns / steps / 1e6,
        "host": per_step(host),
        "device": per_step(device),
        "device busy ms": _union_ns(intervals) / steps / 1e6,
    }


def _link_parents(host_events) -> None:
    """Each event's enclosing event on its thread, and its children's total time."""
    by_thread = collections.defaultdict(list)
    for thread, event in host_events:
        by_thread[thread].append(event)
    for events in by_thread.values():
        events.sort(key=lambda e: (e.start, -e.end))
        open_events: list[_Event] = []
        for event in events:
            while open_events and open_events[-1].end <= event.start:
                open_events.pop()
            if open_events:
                event.parent = open_events[-1]
                event.parent.children_ns += min(event.end, event.parent.end) - event.start
            open_events.append(event)


def _inside_a_step(event: _Event) -> bool:
    """Whether ``event`` ran in a profiled step. (The autograd engine's thread has no step
    label: its events count where they lie inside a step's time on any thread.)"""
    while event.parent is not None:
        event = event.parent
    return event.name == STEP_LABEL or event.name.startswith("autograd::engine")


def _charge(event: _Event) -> tuple[str, str]:
    if event.charge is None:
        chain, walk = [], event
        while walk is not None:
            chain.append(walk.name)
            walk = walk.parent
        region = next(
            (r for name in reversed(chain) for r, test in REGIONS if test(name)), "eager ops"
        )
        kind = next((k for name in chain for k, test in KINDS if test(name)), "own work")
        event.charge = (region, kind)
    return event.charge


def _union_ns(intervals: list[tuple[int, int]]) -> int:
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total
