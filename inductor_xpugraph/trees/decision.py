"""What one call of a graphed callable does, as a plain value: a ``Decision``.

``GraphedCallable.decide`` makes it from the tree's position and the call's inputs, changing
nothing; ``GraphedCallable`` then carries it out. Every way a call leaves the fast path ends in
one of these actions:

- ``REPLAY``: launch a recording of this place (one whose reused memory is free now; where
  none is, ``otherwise`` says what to do instead), after moving the call's new state into
  its memory when ``adopts_state`` (Note [State moved into a recording's memory]);
- ``RECORD``: capture a new child of the current node; ``kind`` says why there is none to
  replay, and so what the recording replaces and whether the thrash guard counts it;
- ``WARM_UP``: run un-graphed before recording (in the pool where the tree can);
- ``RUN_EAGERLY``: run un-graphed inside the tree's generation: the outputs go stale with it,
  as replayed ones do (``leave`` takes the rest of the generation off the tree first);
- ``RUN_PLAIN``: run the callable as without graphs (a skip, said once; a capture under way);
- ``FALL_BACK``: the thrash guard stops this callable's recording for good.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .node import GraphNode


class Action(enum.Enum):
    REPLAY = "replay"
    RECORD = "record"
    WARM_UP = "warm up"
    RUN_EAGERLY = "run eagerly"
    RUN_PLAIN = "run plain"
    FALL_BACK = "fall back"


class RecordKind(enum.Enum):
    """Why a recording is made, which decides what it replaces and who counts it."""

    FIRST = "first"  # nothing recorded here for these sizes
    LIVENESS = "liveness"  # recorded here, but every recording reuses memory still referenced
    STATE_DIED = "state died"  # the recordings here read state that is gone
    MOVING_MEMORY = "moving memory"  # static inputs whose memory moves: copied from now on
    VARIANT = "variant"  # static inputs at addresses no recording here has


class Leave(enum.Enum):
    """Why the rest of the generation leaves the tree before an eager run."""

    LIVE_MEMORY = "live memory"  # every recording here reuses memory still referenced
    LENT_MEMORY = "lent memory"  # a capture here could land in memory lent to another branch
    PENDING_BACKWARD = "pending backward"  # the tree may not grow further below this callable


@dataclasses.dataclass(frozen=True)
class Decision:
    action: Action
    # REPLAY: the recordings that match, of which the first whose reused memory is free
    # replays; ``otherwise`` is what to do when none can.
    candidates: tuple[GraphNode, ...] = ()
    otherwise: Decision | None = None
    adopts_state: bool = False  # REPLAY: the call's state moves into the recording's memory
    # The words of a skip (RUN_PLAIN, said once), a re-record (RECORD) or a fallback, and a
    # skip's log level (None: the skip's own).
    reason: str | None = None
    level: int | None = None
    counted: bool = False  # WARM_UP: one of the warmups; RECORD: counted by the guard already
    leave: Leave | None = None  # RUN_EAGERLY: why the rest of the generation leaves the tree
    # What comes before: the recordings a new one replaces (dropped), the variant the bound
    # on variants pushes out, inputs that another graph produced and that moved here once
    # more (``RecordingPolicy.note_managed_moves``), a re-record counted by the guard.
    kind: RecordKind | None = None
    replaces: tuple[GraphNode, ...] = ()
    evicts: GraphNode | None = None
    managed_moves: tuple[int, ...] = ()
    counts_rerecord: bool = False
    # The capture would be admitted here (memory, the guard's count of evicted recordings,
    # a step that cannot end): set on RECORD and on what stops one after admission.
    admitted: bool = False


PLAIN = Decision(Action.RUN_PLAIN)
EAGERLY = Decision(Action.RUN_EAGERLY)
