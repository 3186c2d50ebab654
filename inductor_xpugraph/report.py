"""What the graph trees hold and why: ``inductor_xpugraph.report()``.

A ``Report`` is a snapshot, as data (frozen records, for tests and tools), as text
(``str(report)``) and as a picture (``report.draw("tree.png")``, or ``.svg``/``.pdf``; needs
matplotlib: ``pip install inductor-xpugraph[report]``):

- per device and thread, the tree: each node with its graph's name, phase, the sizes it was
  recorded for, its state (recorded, replaying), replays, the memory of its outputs (and how
  much of it the node owns now), which variant it is for its callable and sizes, and the
  user's source line of its graph;
- every compiled callable: warming up, graphed, or fallen back for good;
- every event (skip, fallback, re-record, liveness fallback, start over, pending backward)
  with its reason, graph, source line and count.

``python -m inductor_xpugraph report script.py [args]`` runs a script and prints its report
at the end; ``INDUCTOR_XPUGRAPH_REPORT=1`` (or ``=tree.png``) prints (and draws) it at exit.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import sys
from collections.abc import Iterator

from .trees import stats
from .trees.graphed_callable import _all_callables
from .trees.memory import OwnedOutputs
from .trees.node import GraphNode
from .trees.per_thread import all_trees
from .trees.tree import GraphTree

REPORT_ENV = "INDUCTOR_XPUGRAPH_REPORT"


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

    def nodes(self) -> list[NodeReport]:
        return [node for tree in self.trees for node in tree.nodes()]

    def text(self) -> str:
        return _text(self)

    __str__ = text

    def draw(self, path: str | os.PathLike[str]) -> None:
        """Draw the trees, callables and events into ``path`` (.png, .svg, .pdf)."""
        from ._report_picture import draw

        draw(self, os.fspath(path))


def report(path: str | os.PathLike[str] | None = None) -> Report:
    """A snapshot of every tree, callable and event of this process; ``path``: also draw it."""
    snapshot = Report(
        trees=tuple(_tree_report(tree) for tree in all_trees() if tree.nodes()),
        callables=tuple(_callable_reports()),
        events=tuple(
            EventReport(e.kind, e.graph, e.reason, e.source, e.count) for e in stats.events.values()
        ),
        counters=stats.counts(),
    )
    if path is not None:
        snapshot.draw(path)
    return snapshot


def _tree_report(tree: GraphTree) -> TreeReport:
    memory = "owned outputs" if isinstance(tree.memory, OwnedOutputs) else "allocator checkpointing"
    return TreeReport(
        device=tree.device,
        thread=tree.thread,
        memory=memory,
        pool_bytes=tree.pool_bytes(),
        generations=tree.generations_started,
        roots=_children(tree.root),
    )


def _children(parent: GraphNode) -> tuple[NodeReport, ...]:
    reports = []
    for key in list(parent.children):
        variants = parent.variants(key)
        for index, node in enumerate(variants):
            reports.append(_node_report(node, index, len(variants)))
    return tuple(reports)


def _node_report(node: GraphNode, variant: int, variants: int) -> NodeReport:
    blocks = node.recording.blocks
    return NodeReport(
        graph=node.name,
        phase=node.phase,
        sizes=tuple(node.sizes),
        state=NodeState.REPLAYING if node.replays else NodeState.RECORDED,
        replays=node.replays,
        output_bytes=sum(block.nbytes for block in blocks),
        owned_bytes=sum(block.nbytes for block in blocks if block.owner is not None),
        variant=variant,
        variants=variants,
        source=node.source,
        children=_children(node),
    )


def _callable_reports() -> Iterator[CallableReport]:
    recorded = {node.callable_id for tree in all_trees() for node in tree.nodes()}
    for graphed in sorted(_all_callables, key=lambda g: g.id):
        if graphed.policy.stopped:
            state = CallableState.FALLBACK
        elif graphed.id in recorded:
            state = CallableState.GRAPHED
        else:
            state = CallableState.WARMUP
        yield CallableReport(
            graph=graphed.name,
            phase=graphed.phase,
            device=graphed.device,
            state=state,
            sizes_seen=graphed.policy.sizes_seen,
            rerecords=graphed.policy.rerecords,
            source=graphed.source,
        )


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


# -- at exit ------------------------------------------------------------------------------------


def report_at_exit_if_asked() -> None:
    """``INDUCTOR_XPUGRAPH_REPORT=1`` prints the report when the process exits; a path
    ending in .png, .svg or .pdf also draws it there."""
    value = os.environ.get(REPORT_ENV, "").strip()
    if value.lower() in ("", "0", "false", "no"):
        return
    import atexit

    path = value if value.lower().endswith((".png", ".svg", ".pdf")) else None
    atexit.register(lambda: print(report(path).text(), file=sys.stderr))
