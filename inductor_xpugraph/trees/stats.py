"""Process-wide counters of the graph-tree runtime (``inductor_xpugraph.stats()``)."""

from __future__ import annotations

import collections
import logging

log = logging.getLogger("inductor_xpugraph")

COUNTER_NAMES = (
    "warmups",
    "records",
    "replays",
    "rerecords",
    "fallbacks",
    "liveness_fallbacks",
    # Blocks of graph memory still referenced when their generation ended, copied out of
    # the pool for the caller (gradients: ``GraphTree.retire_handed_out``).
    "handovers",
)

counters: collections.Counter[str] = collections.Counter()
skip_reasons: collections.Counter[str] = collections.Counter()


def record_skip(reason: str) -> None:
    """Count a graph that runs un-graphed; log each distinct reason once per process."""
    if reason not in skip_reasons:
        log.warning("inductor_xpugraph: not capturing a graph: %s", reason)
    skip_reasons[reason] += 1


def snapshot() -> dict[str, object]:
    result: dict[str, object] = {name: counters[name] for name in COUNTER_NAMES}
    result["skips"] = sum(skip_reasons.values())
    result["skip_reasons"] = dict(skip_reasons)
    return result


def clear() -> None:
    counters.clear()
    skip_reasons.clear()
