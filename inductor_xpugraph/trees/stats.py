"""Process-wide counters and events of the graph-tree runtime (``inductor_xpugraph.stats()``,
``inductor_xpugraph.report()``).

An *event* is something a user asks "why" about: a graph not captured (skip), a callable
running un-graphed from now on (fallback), a recording for new addresses of its static inputs
(re-record), a step left un-graphed because memory a graph reuses is still referenced
(liveness fallback), a tree recording everything again because its device said its graphs
may not replay (start over), a step that cannot end because a backward may still come, so
that each call records a new graph (pending backward). Each distinct event (kind, graph,
reason) is logged once, with the graph's name and the user's source line, and counted every
time.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import logging

log = logging.getLogger("inductor_xpugraph")

COUNTER_NAMES = (
    "warmups",
    "records",
    "replays",
    "rerecords",
    # Recordings that replaced ones whose state died after they replayed (a cache made for
    # one request): not re-records, the thrash guard does not count them.
    "replacements",
    # New state moved into the memory of a recording whose state died, which then replayed
    # (the next request's cache): one copy instead of a capture (``recorded_state``).
    "adoptions",
    "fallbacks",
    # Captures that failed (the device refused to record): the call ran un-graphed.
    "capture_failures",
    "liveness_fallbacks",
    # Blocks of graph memory still referenced when their generation ended, copied out of
    # the pool for the caller (gradients: ``GraphTree.retire_handed_out``), and outputs kept
    # as state, once each (Note [Outputs kept as state] in ``kept_state``).
    "handovers",
    # Held outputs compared before and after a call, with ``config.debug_checks`` on.
    "outputs_checked",
)


class EventKind(enum.Enum):
    SKIP = "skip"  # not captured: runs un-graphed (this call, or always)
    FALLBACK = "fallback"  # un-graphed from now on
    RERECORD = "re-record"  # recorded again for new static-input addresses
    LIVENESS_FALLBACK = "liveness fallback"  # the rest of a step un-graphed
    START_OVER = "start over"  # a tree records every graph again, from the next step
    PENDING_BACKWARD = "pending backward"  # a step that cannot end records every call


# How each kind is logged the first time it happens for a graph and reason.
_LOG_LEVELS = {
    EventKind.SKIP: logging.WARNING,
    EventKind.FALLBACK: logging.WARNING,
    EventKind.RERECORD: logging.INFO,
    EventKind.LIVENESS_FALLBACK: logging.WARNING,
    EventKind.START_OVER: logging.WARNING,
    EventKind.PENDING_BACKWARD: logging.WARNING,
}


@dataclasses.dataclass
class Event:
    kind: EventKind
    graph: str | None  # the graph's name, e.g. "0_forward:call"
    reason: str
    source: str | None  # the user's source line, "path:line in function"
    count: int = 0

    def line(self) -> str:
        where = f" ({self.source})" if self.source else ""
        graph = f"`{self.graph}`{where}: " if self.graph else (where and where[2:-1] + ": ")
        return f"{self.kind.value}: {graph}{self.reason}"


counters: collections.Counter[str] = collections.Counter()
events: dict[tuple[EventKind, str | None, str], Event] = {}


def record_event(
    kind: EventKind,
    reason: str,
    graph: str | None = None,
    source: str | None = None,
    level: int | None = None,
) -> Event:
    """Count an event; log it the first time this graph has it for this reason (at ``level``,
    by default its kind's)."""
    key = (kind, graph, reason)
    event = events.get(key)
    if event is None:
        event = events[key] = Event(kind, graph, reason, source)
        log.log(level or _LOG_LEVELS[kind], "inductor_xpugraph: %s", event.line())
    event.count += 1
    return event


def warn_once(message: str) -> None:
    """Log a warning the first time this process says ``message`` (a setting with no effect
    here, a pool that could not reserve): never again, whatever resets run."""
    if message not in _said:
        _said.add(message)
        log.warning(message)


# Every message ``warn_once`` said.
_said: set[str] = set()


def record_skip(
    reason: str, graph: str | None = None, source: str | None = None, level: int | None = None
) -> None:
    """Count a graph that runs un-graphed; log each distinct reason once per process."""
    record_event(EventKind.SKIP, reason, graph, source, level)


def skip_reasons() -> dict[str, int]:
    reasons: collections.Counter[str] = collections.Counter()
    for event in events.values():
        if event.kind is EventKind.SKIP:
            reasons[event.reason] += event.count
    return dict(reasons)


def counts() -> dict[str, object]:
    """Every counter, and how many skips there were of each reason."""
    result: dict[str, object] = {name: counters[name] for name in COUNTER_NAMES}
    reasons = skip_reasons()
    result["skips"] = sum(reasons.values())
    result["skip_reasons"] = reasons
    return result


def clear() -> None:
    counters.clear()
    events.clear()
