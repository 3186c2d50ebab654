"""The picture of a ``Report``: each tree drawn top-down, then the callables and events.

Layout: a node's leaves get consecutive columns in depth-first order and a parent sits above
the middle of its children; one row per depth. Colours say the state: replaying green,
recorded (not replayed yet) amber; fallen-back callables and events are listed below in red.
Needs matplotlib (the ``report`` extra).
"""

from __future__ import annotations

import textwrap
from typing import Any

from .report_records import NodeReport, NodeState, Report, node_label

_COLOURS = {NodeState.REPLAYING: "#c8e6c9", NodeState.RECORDED: "#ffe0b2"}
_EVENT_COLOUR = "#ffcdd2"


def draw(report: Report, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError(
            "drawing a report needs matplotlib: pip install 'inductor-xpugraph[report]'"
        ) from error

    placed = [_place(tree.roots) for tree in report.trees]
    width = max([len(columns) for _, columns in placed] + [2])
    notes = _notes(report)
    rows = sum(1 + max((d for d, _ in p.values()), default=-1) + 1 for p, _ in placed)
    figure, axes = plt.subplots(
        figsize=(max(8, 4.2 * width), 1.6 * max(rows, 1) + 0.28 * len(notes) + 1)
    )
    axes.set_axis_off()
    y = 0.0
    for tree, (positions, _) in zip(report.trees, placed):
        title = f"{tree.device}, thread {tree.thread} ({tree.memory}), {tree.generations} steps"
        axes.text(0, y, title, fontsize=11, weight="bold", va="center")
        top = y - 1.0
        for node, (level, column) in positions.items():
            x, node_y = column * 4.2 + 2.0, top - level * 1.6
            for child in node.children:
                child_level, child_column = positions[child]
                axes.plot(
                    [x, child_column * 4.2 + 2.0],
                    [node_y - 0.35, top - child_level * 1.6 + 0.35],
                    color="#607d8b",
                    zorder=1,
                )
            _box(axes, x, node_y, node)
        y = top - (max((d for d, _ in positions.values()), default=0) + 1) * 1.6
    if not report.trees:
        axes.text(0, y, "no graphs recorded", fontsize=11, va="center")
        y -= 1.0
    for line in notes:
        box = {"facecolor": _EVENT_COLOUR, "edgecolor": "none"} if line.startswith("  ") else None
        axes.text(0, y, line, fontsize=9, va="center", family="monospace", bbox=box)
        y -= 0.45
    axes.set_xlim(-0.2, max(width, 2) * 4.2 + 0.2)
    axes.set_ylim(y - 0.3, 0.6)
    figure.savefig(path, bbox_inches="tight", dpi=110)
    plt.close(figure)


def _place(roots: tuple[NodeReport, ...]) -> tuple[dict[NodeReport, tuple[int, float]], list[int]]:
    """(depth, column) of every node; and the leaf columns."""
    positions: dict[NodeReport, tuple[int, float]] = {}
    leaves: list[int] = []

    def visit(node: NodeReport, level: int) -> float:
        if not node.children:
            column = float(len(leaves))
            leaves.append(1)
        else:
            columns = [visit(child, level + 1) for child in node.children]
            column = (columns[0] + columns[-1]) / 2
        positions[node] = (level, column)
        return column

    for root in roots:
        visit(root, 0)
    return positions, leaves


def _box(axes: Any, x: float, y: float, node: NodeReport) -> None:
    label = "\n".join(textwrap.wrap(node_label(node), 44))
    if node.source:
        label += "\n" + textwrap.shorten(node.source, 44)
    axes.text(
        x,
        y,
        label,
        ha="center",
        va="center",
        fontsize=7.5,
        zorder=2,
        bbox={
            "boxstyle": "round,pad=0.4",
            "facecolor": _COLOURS[node.state],
            "edgecolor": "#455a64",
        },
    )


def _notes(report: Report) -> list[str]:
    lines = []
    fallen = [c for c in report.callables if c.state.value == "fallback"]
    if fallen:
        lines.append("un-graphed for good:")
        lines += [f"  {c.graph} [{c.phase}]  {c.source or ''}" for c in fallen]
    if report.events:
        lines.append("events:")
        lines += ["  " + textwrap.shorten(f"{e.line()} (x{e.count})", 150) for e in report.events]
    return lines
