"""What is said of recordings outside the messages: a ``torch._logging`` structured-trace entry
per recorded graph (``TORCH_TRACE``), so that tlparse shows our graphs beside Inductor's output
of the same compile, and one log line per step that captured."""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Callable
from typing import Any

import torch

from . import messages
from .node import GraphNode

log = logging.getLogger("inductor_xpugraph")

# tlparse files an artifact under the compile it names, where trace_structured takes one.
_TRACE_TAKES_COMPILE_ID = (
    "compile_id" in inspect.signature(torch._logging.trace_structured).parameters
)


def trace_recording(node: GraphNode, device: str, compile_id: Any) -> None:
    """``node`` was just recorded on ``device``, by the compile ``compile_id``."""
    where = {"compile_id": compile_id} if _TRACE_TAKES_COMPILE_ID else {}
    torch._logging.trace_structured(
        "artifact",
        metadata_fn=lambda: {"name": "inductor_xpugraph_recording", "encoding": "json"},
        payload_fn=lambda: json.dumps(
            {
                "graph": node.name,
                "phase": node.phase,
                "device": device,
                "sizes": list(node.sizes),
                "parent": node.parent.name if node.parent is not None else None,
                "output_bytes": sum(block.nbytes for block in node.recording.blocks),
                "source": node.source,
            }
        ),
        **where,
    )


def log_captures(device: str, captures: int, seconds: float, pool_bytes: Callable[[], int]) -> None:
    """One info line for the captures of the generation that ended (as vLLM logs one per
    capture burst): how many, how long they took, and the pool they left (``pool_bytes()``,
    counted only when the line is logged)."""
    if log.isEnabledFor(logging.INFO):
        pool_mib = pool_bytes() / 2**20
        log.info(messages.CAPTURES_OF_A_STEP, device, captures, seconds * 1e3, pool_mib)
