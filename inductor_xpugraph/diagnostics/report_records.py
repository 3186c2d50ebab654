"""The records a ``report()`` is made of: frozen data (for tests and tools) and its text.

``report`` builds them from the trees; ``report_picture`` draws them. Neither is needed to read
them, so this module imports neither.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterator

from ..trees import stats


class NodeState(enum.Enum):
    RECORDED = "recorded"  # captured, not replayed yet
    REPLAYING = "replaying"


class CallableState(enum.Enum):
    WARMUP = "warmup"  # no recording yet
    GRAPHED = "graphed"  # recorded in a tree
    FALLBACK = "fallback"  # runs un-graphed for good


@dataclasses.dataclass(frozen=True)
class NodeReport:
    graph: str
    phase: str
    sizes: tuple[int, ...]
    state: NodeState
    replays: int
    output_bytes: int  # memory of the outputs its capture allocated
    owned_bytes: int  # of which it keeps allocated now (the rest is lent to the pool)
    variant: int  # 0: the recording used last here for its callable and sizes; 1, 2: older
    variants: int  # recordings here for its callable and sizes (other static addresses)
    source: str | None
    children: tuple[NodeReport, ...]

    def walk(self) -> Iterator[NodeReport]:
        yield self
        for child in self.children:
            yield from child.walk()


@dataclasses.dataclass(frozen=True)
class TreeReport:
    device: str
    thread: str
    memory: str  # "allocator checkpointing" or "owned outputs"
    pool_bytes: int
    generations: int
    roots: tuple[NodeReport, ...]

    def nodes(self) -> list[NodeReport]:
        return [node for root in self.roots for node in root.walk()]


@dataclasses.dataclass(frozen=True)
class CallableReport:
    graph: str
    phase: str
    device: str
    state: CallableState
    sizes_seen: int  # distinct sizes it was called with
    rerecords: int  # new static-address sets recorded
    source: str | None
    # Static inputs whose memory moves under them (FSDP2's gathered parameters), copied into
    # the graph at each replay: which, bytes copied per replay, replays that copied them, and
    # why they are still copied (``Recording.why_copied``).
    moving_inputs: str | None = None
    moving_bytes: int = 0
    moving_replays: int = 0
    moving_why: str = ""


@dataclasses.dataclass(frozen=True)
class EventReport:
    kind: stats.EventKind
    graph: str | None
    reason: str
    source: str | None
    count: int

    def line(self) -> str:
        return stats.Event(self.kind, self.graph, self.reason, self.source).line()


@dataclasses.dataclass(frozen=True)
class Report:
    trees: tuple[TreeReport, ...]
    callables: tuple[CallableReport, ...]
    events: tuple[EventReport, ...]
    counters: dict[str, object]
    # Why nothing may have been captured (``report.not_enabled_hint``), or None.
    hint: str | None = None
    # How XPUGraph records on each xpu device this process decided it for, and how that was
    # found ("xpu:0: native, probed: ..."; ``trees.backends.xpu_recording``), the stand-in of
    # ``sycl_rules.on_cpu`` included.
    recording: tuple[str, ...] = ()

    def nodes(self) -> list[NodeReport]:
        return [node for tree in self.trees for node in tree.nodes()]

    def text(self) -> str:
        return _text(self)

    __str__ = text


# -- text ---------------------------------------------------------------------------------------


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def node_label(node: NodeReport) -> str:
    sizes = f" sizes {list(node.sizes)}" if node.sizes else ""
    variant = f", variant {node.variant + 1} of {node.variants}" if node.variants > 1 else ""
    return (
        f"{node.graph} [{node.phase}]{sizes}: {node.state.value}, {node.replays} replays, "
        f"outputs {_bytes(node.output_bytes)} (owns {_bytes(node.owned_bytes)}){variant}"
    )


def _text(report: Report) -> str:
    c = report.counters
    lines = [
        f"inductor_xpugraph report: {c['records']} recordings, {c['replays']} replays, "
        f"{c['warmups']} warmup runs, {c['rerecords']} re-records, {c['fallbacks']} "
        f"fallbacks, {c['skips']} skipped calls, {c['handovers']} handovers"
    ]
    if report.hint:
        lines.append(f"hint: {report.hint}")
    lines.extend(f"xpu recording: {line}" for line in report.recording)
    for tree in report.trees:
        lines.append(
            f"tree {tree.device}, thread {tree.thread} ({tree.memory}): pool "
            f"{_bytes(tree.pool_bytes)}, {tree.generations} generations"
        )
        lines.extend(_tree_lines(tree.roots, ""))
    if not report.trees:
        lines.append("no graphs recorded")
    if report.callables:
        lines.append("callables:")
        for graphed in report.callables:
            where = f"  ({graphed.source})" if graphed.source else ""
            lines.append(
                f"  {graphed.graph} [{graphed.phase}] on {graphed.device}: "
                f"{graphed.state.value}, {graphed.sizes_seen} sizes, {graphed.rerecords} "
                f"re-records{where}"
            )
            if graphed.moving_inputs:
                lines.append(
                    f"    {graphed.moving_inputs}: memory moves in place between calls "
                    f"(FSDP2's gathered parameters), copied into the graph at each replay: "
                    f"{_bytes(graphed.moving_bytes)} per replay, {graphed.moving_replays} "
                    f"replays ({graphed.moving_why})"
                )
    if report.events:
        lines.append("events:")
        for event in report.events:
            lines.append(f"  {event.line()} (x{event.count})")
    return "\n".join(lines)


def _tree_lines(nodes: tuple[NodeReport, ...], indent: str) -> list[str]:
    lines = []
    for i, node in enumerate(nodes):
        last = i == len(nodes) - 1
        where = f"  ({node.source})" if node.source else ""
        lines.append(f"{indent}{'└─ ' if last else '├─ '}{node_label(node)}{where}")
        lines.extend(_tree_lines(node.children, indent + ("   " if last else "│  ")))
    return lines
