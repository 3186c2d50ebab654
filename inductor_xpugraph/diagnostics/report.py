"""What the graph trees hold and why: ``inductor_xpugraph.report()``.

A ``Report`` is a snapshot, as data (frozen records, for tests and tools), as text
(``str(report)``) and as a picture (``report("tree.png")``, or ``.svg``/``.pdf``; needs
matplotlib: ``pip install inductor-xpugraph[report]``); the records are ``report_records``:

- per device and thread, the tree: each node with its graph's name, phase, the sizes it was
  recorded for, its state (recorded, replaying), replays, the memory of its outputs (and how
  much of it the node owns now), which variant it is for its callable and sizes, and the
  user's source line of its graph;
- every compiled callable: warming up, graphed, or fallen back for good;
- every event (skip, fallback, re-record, liveness fallback, start over, pending backward)
  with its reason, graph, source line and count;
- how XPUGraph records on each xpu device (command buffers or natively), and how that was
  found (from the setting, from the build, probed, assumed from the release).

``python -m inductor_xpugraph report script.py [args]`` runs a script and prints its report
at the end; ``INDUCTOR_XPUGRAPH_REPORT=1`` (or ``=tree.png``) prints (and draws) it at exit.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

from torch._dynamo.utils import counters as torch_counters

from ..codegen import enabled_devices
from ..trees import snapshot, stats
from ..trees.graphed_callable import _all_callables
from ..trees.memory import OwnedOutputs
from ..trees.node import GraphNode
from ..trees.per_thread import all_trees
from ..trees.tree import GraphTree
from .report_picture import draw
from .report_records import (
    CallableReport,
    CallableState,
    EventReport,
    NodeReport,
    NodeState,
    Report,
    TreeReport,
)

REPORT_ENV = "INDUCTOR_XPUGRAPH_REPORT"


def report(path: str | os.PathLike[str] | None = None) -> Report:
    """A snapshot of every tree, callable and event of this process; ``path``: also draw it."""
    snapshot = Report(
        trees=tuple(_tree_report(tree) for tree in all_trees() if tree.nodes()),
        callables=tuple(_callable_reports()),
        events=tuple(
            EventReport(e.kind, e.graph, e.reason, e.source, e.count) for e in stats.events.values()
        ),
        counters=stats.counts(),
        hint=not_enabled_hint(),
        recording=recording_lines(),
    )
    if path is not None:
        draw(snapshot, os.fspath(path))
    return snapshot


def recording_lines() -> tuple[str, ...]:
    """How XPUGraph records on each xpu device the process decided it for (a compile for the
    device decides it: ``device_recording.device_recording``), and on the stand-in device while
    ``sycl_rules.on_cpu`` is in force (found by the recording probe, once per stand-in)."""
    from ..trees.backends.device_recording import decisions, device_recording

    lines = [f"{device}: {decision.line()}" for device, decision in decisions().items()]
    rules = sys.modules.get("inductor_xpugraph.sycl_rules.backend")
    stand_in = getattr(rules, "_device", None)
    if stand_in is not None:
        version = stand_in.release.version
        decision = device_recording(
            stand_in.release.number, module=stand_in, setting="auto", captures_key="cpu:0"
        )
        if decision.mode != stand_in.recording:  # the probe could not tell, and assumed
            decision = decision._replace(mode=stand_in.recording, found="as the stand-in was made")
        lines.append(f"cpu:0 (standing in for xpu, torch {version}'s rules): {decision.line()}")
    return tuple(lines)


def counters() -> dict[str, object]:
    """``inductor_xpugraph.stats()``: the counters and pool bytes (``trees.snapshot``). When
    they show that nothing was captured although Inductor skipped its own device graphs, it
    says once, in the log, what is likely missing (``not_enabled_hint``)."""
    counts = snapshot()
    hint = not_enabled_hint(counts)
    if hint is not None:
        stats.warn_once(f"inductor_xpugraph.stats(): {hint}")
    return counts


def not_enabled_hint(counts: dict[str, object] | None = None) -> str | None:
    """Why nothing may be captured: Inductor skipped its device graphs (``mode=
    "reduce-overhead"``) in this process, and no graphed callable of this package ever ran,
    so the graphs were compiled for a device it is not enabled for. None otherwise."""
    skipped = torch_counters["inductor"].get("cudagraph_skips", 0)
    counts = stats.counts() if counts is None else counts
    if not skipped or any(counts[name] for name in ("warmups", "records", "skips", "fallbacks")):
        return None
    enabled = ", ".join(enabled_devices()) or "no device"
    return (
        f'Inductor skipped its device graphs (mode="reduce-overhead") in this process and this '
        f"package captured nothing: it is enabled for {enabled}. Enable it for the device your "
        f'model runs on before compiling: inductor_xpugraph.enable("cpu") (the CPU emulator) '
        f'or enable("xpu") / enable("cuda"), or INDUCTOR_XPUGRAPH_DEVICES=cpu before the import'
    )


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
    nodes = [node for tree in all_trees() for node in tree.nodes()]
    recorded = {node.callable_id for node in nodes}
    for graphed in sorted(_all_callables, key=lambda g: g.id):
        copying = [n for n in nodes if n.callable_id == graphed.id and n.recording.moving_inputs]
        moving = sorted({i for n in copying for i in n.recording.moving_inputs})
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
            moving_inputs=graphed.input_names.describe(moving, shown=2) if moving else None,
            moving_bytes=max((n.recording.moving_input_bytes() for n in copying), default=0),
            moving_replays=sum(n.replays for n in copying),
            moving_why="; ".join(dict.fromkeys(n.recording.why_copied() for n in copying)),
        )


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
