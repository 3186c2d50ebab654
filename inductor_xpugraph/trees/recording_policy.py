"""When one compiled callable warms up, records, records again, or stops recording.

A ``GraphedCallable`` replays on its fast path without asking anything. Every other call
asks its ``RecordingPolicy``, which holds all of the callable's counting:

Sizes. Recordings are keyed by the callable's integer inputs (symbolic sizes). Each size is
warmed up ``config.warmup_runs`` times before it is recorded (``warm_up``). A size never seen
before is admitted (``admit_size``); past ``config.dynamic_shape_warn_limit`` sizes a warning
is logged once, and with ``config.skip_dynamic_graphs`` further new sizes run un-graphed.

Re-records. A recording of the callable at a place in the tree where it is already recorded
for these sizes is a *re-record*:
- its static inputs (parameters, buffers, static-address inputs, outputs of earlier graphs)
  have an address set that no kept recording has: never seen before, or seen and dropped by
  the bound on variants (``config.static_input_variants``, least recently used first);
- or the recording went with a dropped variant of a graph before it (the graphs below a
  variant go with it).
Each costs a capture and pool memory, and pays off only if it replays. The thrash guard keeps
one clock of re-records per callable, whatever their kind (``note_rerecord``): more than
``config.rerecord_limit`` within ``config.rerecord_window`` generations, and the callable
runs un-graphed for good. So a callable whose inputs move at nearly every call, or cycle
through more address sets than are kept, or mix both, stops within ``rerecord_limit``
re-records, while one whose inputs are re-created once per request (a KV cache per
``generate`` call) records once per request and stays graphed.

Not re-records: a recording for new sizes (see Sizes), and a *liveness variant*, recorded
because an output whose memory a recording reuses is still referenced (bounded by
``static_input_variants`` at each place; past it the step runs un-graphed, ``tree``).

A policy knows nothing of devices, trees or tensors beyond the keys and generation numbers
it is given; ``tests/test_recording_policy.py`` pins it down.
"""

from __future__ import annotations

import logging

from .. import config
from . import messages, stats

log = logging.getLogger("inductor_xpugraph")


class RecordingPolicy:
    """The counting behind one callable's slow path (see the module docstring)."""

    def __init__(self, name: str, source: str | None) -> None:
        self.name, self.source = name, source
        # Eager runs so far per size (the callable's int inputs), for the sizes seen.
        self.warmups_done: dict[tuple[int, ...], int] = {}
        # Address sets of the static inputs of every recording made (``input_identity``).
        self.address_sets_seen: set[tuple[int, ...]] = set()
        # Generations of the latest ``rerecord_limit + 1`` re-records: the guard's clock.
        self.recent_rerecords: list[int] = []
        self.rerecords = 0  # re-records, in all
        self.stopped_because: str | None = None  # un-graphed for good, and why

    @property
    def sizes_seen(self) -> int:
        return len(self.warmups_done)

    # -- sizes --------------------------------------------------------------------------------

    def admit_size(self, key: tuple[int, ...]) -> bool:
        """Whether a call with sizes ``key`` may be graphed (a size seen before always is)."""
        if not key or key in self.warmups_done:
            return True
        if self.sizes_seen < config.dynamic_shape_warn_limit:
            return True
        if config.skip_dynamic_graphs:
            stats.record_skip(messages.too_many_sizes_skipped(), self.name, self.source)
            return False
        if self.sizes_seen == config.dynamic_shape_warn_limit:
            log.warning(messages.MANY_SIZES, self.name, self.sizes_seen)
        return True

    def warm_up(self, key: tuple[int, ...]) -> bool:
        """Whether this call for sizes ``key`` is a warmup (counted) rather than a record."""
        done = self.warmups_done.get(key, 0)
        if done >= config.warmup_runs:
            return False
        self.warmups_done[key] = done + 1
        return True

    # -- re-records ---------------------------------------------------------------------------

    def seen_before(self, address_set: tuple[int, ...]) -> bool:
        return address_set in self.address_sets_seen

    def note_recorded(self, address_set: tuple[int, ...]) -> None:
        self.address_sets_seen.add(address_set)

    def note_rerecord(self, generation: int) -> bool:
        """Count one re-record at ``generation``; True when it makes too many (the callable
        must stop recording; this one is then not counted in ``rerecords``)."""
        recent = self.recent_rerecords
        recent.append(generation)
        del recent[: -(config.rerecord_limit + 1)]
        if len(recent) > config.rerecord_limit and recent[-1] - recent[0] < config.rerecord_window:
            return True
        self.rerecords += 1
        return False

    def rerecord_span(self) -> int:
        """Generations from the oldest counted re-record to the latest, both included."""
        return self.recent_rerecords[-1] - self.recent_rerecords[0] + 1

    def stop(self, reason: str) -> None:
        """Un-graphed for good (the thrash guard, a capture the device refused)."""
        self.stopped_because = reason

    @property
    def stopped(self) -> bool:
        return self.stopped_because is not None
