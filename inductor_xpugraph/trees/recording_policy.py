"""When one compiled callable warms up, records, records again, or stops recording.

A ``GraphedCallable`` replays on its fast path without asking anything. Every other call
asks its ``RecordingPolicy``, which holds all of the callable's counting:

Settings. What the policy obeys is read once, on the thread that compiles, into a
``RecordingSettings`` that the generated ``graphify(...)`` call carries (``recording={...}``):
settings set in code are per thread on torch >= 2.13, and a backward or a serving thread would
read defaults. Upstream's settings keep upstream's meaning (``RecordingSettings.current``).

Sizes. Recordings are keyed by the callable's integer inputs (symbolic sizes). With upstream's
``triton.cudagraph_capture_sizes`` only the sizes listed are graphed, others run un-graphed
(upstream's key: no int input is None, one is that int, several a tuple). Each size is warmed
up ``warmup_runs`` times before it is recorded (``is_warmup``: none with upstream's
``triton.skip_cudagraph_warmup``, every call and never recorded with
``triton.force_cudagraphs_warmup``). A size never seen before is admitted (``size_refusal``) up
to ``size_limit`` sizes (upstream's ``triton.cudagraph_dynamic_shape_rerecord_limit``, else
``config.dynamic_shape_warn_limit`` with ``config.skip_dynamic_graphs``): past it new sizes run
un-graphed and the sizes seen keep replaying. Past ``warn_limit`` sizes a warning is logged
once. Code that runs inside a warmup (an autotuner that has not settled) may ask for one more
(``mark_warmup_incomplete``, upstream's ``torch.compiler.cudagraph_mark_warmup_incomplete``).

Re-records. A recording of the callable at a place in the tree where it is already recorded
for these sizes is a *re-record*:
- its static inputs (parameters, buffers, static-address inputs, outputs of earlier graphs)
  have an address set that no kept recording has: never seen before, or seen and dropped by
  the bound on variants (``config.static_input_variants``, least recently used first);
- or the recording went with a dropped variant of a graph before it (the graphs below a
  variant go with it).
Each costs a capture and pool memory, and pays off only if it replays. The thrash guard keeps
one clock of re-records per callable, whatever their kind (``note_rerecord``): more than
``rerecord_limit`` within ``rerecord_window`` generations, and the callable runs un-graphed
for good. So a callable whose inputs move at nearly every call, or cycle through more address
sets than are kept, or mix both, stops within ``rerecord_limit`` re-records, while one whose
inputs are re-created once per request (a KV cache per ``generate`` call) records once per
request and stays graphed. Where upstream's ``triton.cudagraph_unexpected_rerecord_limit`` is
set, it is the limit, with no window: upstream counts for the life of the process.

A static input the callable only reads whose memory moves under it (the same storage at a new
address: FSDP2's gathered parameters) is copied by recordings from then on (``inputs``): the
one record again that makes it replaces the recordings it covers, and is not on the clock.

Not re-records: a recording for new sizes (see Sizes), and a *liveness variant*, recorded
because an output whose memory a recording reuses is still referenced (bounded by
``static_input_variants`` at each place; past it the step runs un-graphed, ``tree``).

The policy answers once per call off the fast path (``answers``: a ``PolicyAnswers`` that
``decision.decide`` reads) and counts what the decision's preamble tells it (``count_sizes``,
``note_rerecord``, ``count_managed_moves``). It knows nothing of devices, trees or tensors
beyond the keys, places and generation numbers it is given;
``tests/trees/test_recording_policy.py`` pins it down.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from .. import config
from . import messages, stats
from .decision import PolicyAnswers
from .invalidation import can_copy_out_of_pool

log = logging.getLogger("inductor_xpugraph")

UPSTREAM = "torch._inductor.config.triton."

# Upstream's settings of its trees that have no effect here, and why: each is said once, on
# the first compile that sees it set (docs/upstream-settings.md).
NOT_APPLIED = {
    "cudagraph_trees_history_recording": (
        "a stale-output error here always names the graph that made the output, and its "
        "source line where Inductor kept one"
    ),
    "cudagraph_trees_objgraph": (
        "it dumps back-references inside upstream's trees; inductor_xpugraph.report() shows "
        "what holds graph memory here"
    ),
    "slow_path_cudagraph_asserts": (
        "the checks on the slow path here decide what records and always run"
    ),
}


# Upstream's settings of its trees read here, with upstream's meaning (``RecordingSettings``).
HONOURED = (
    "cudagraph_capture_sizes",
    "skip_cudagraph_warmup",
    "force_cudagraphs_warmup",
    "cudagraph_dynamic_shape_rerecord_limit",
    "cudagraph_dynamic_shape_warn_limit",
    "cudagraph_trees_generation_cloning",
    "cudagraph_initial_mempool_allocation_gb",
    "cudagraph_managed_input_rerecord_limit",
    "cudagraph_managed_input_rerecord_action",
    "cudagraph_unexpected_rerecord_limit",
    "cudagraph_or_error",
    "force_cudagraph_sync",
    "fast_path_cudagraph_asserts",
    "cudagraph_support_input_mutation",  # at code generation (codegen.eligibility)
)


def upstream_settings_set() -> list[str]:
    """Upstream's settings of its trees this thread has set to other than their default."""
    return [name for name in (*HONOURED, *NOT_APPLIED) if _upstream(name, None)[1]]


def _upstream(name: str, default: Any) -> tuple[Any, bool]:
    """Upstream's ``triton.<name>`` and whether the user set it to something other than its
    default; (default, False) on a torch without it. (``_is_default`` alone stays False
    after a ``config.patch`` of it has ended, on torch 2.13 and 2.15.)"""
    inductor_config = torch._inductor.config
    if not hasattr(inductor_config.triton, name):
        return default, False
    value = getattr(inductor_config.triton, name)
    entry = getattr(inductor_config, "_config", {}).get(f"triton.{name}")
    if entry is not None and value == entry.default:
        return value, False
    return value, not inductor_config._is_default(f"triton.{name}")


@dataclasses.dataclass(frozen=True)
class RecordingSettings:
    """What a policy obeys, resolved once (``current``) and baked into ``graphify(...)``."""

    warmup_runs: int = 1  # eager calls per size before it is recorded
    always_warm_up: bool = False  # every call is a warmup: never recorded
    capture_sizes: tuple | None = None  # only these sizes (upstream's keys) are graphed
    size_limit: int | None = None  # sizes graphed at most; later new sizes run un-graphed
    size_limit_upstream: bool = False  # the limit is upstream's (its wording in the message)
    warn_limit: int | None = 8  # past this many sizes, warn once (None: never)
    rerecord_limit: int = 8  # the thrash guard: re-records ...
    rerecord_window: int | None = 64  # ... within this many generations (None: ever)
    rerecord_limit_upstream: bool = False  # the limit is upstream's (its name in messages)
    # outputs still referenced when a generation ends are copied out of the pool (``handed_out``)
    clone_live_outputs: bool = False
    # bytes the device's pool reserves when it is made (``GraphTree.initial_pool_bytes``)
    initial_pool_bytes: int = 0
    # moves of an input another graph produced, at one place, before ``managed_action``
    managed_limit: int = 5  # 0: never
    managed_action: str = "copy"  # or "skip"
    # static inputs only read whose memory moves under them are copied (``inputs``)
    copy_moving_inputs: bool = True
    # a recording keeps its state's memory, for the next state to move in (``recorded_state``)
    keep_state_memory: bool = True
    # a graph that would run un-graphed raises instead (upstream's cudagraph_or_error)
    raise_on_skip: bool = False
    sync_after_call: bool = False  # synchronize the device after each call
    check_held_outputs: bool = False  # ``debug_checks`` around each call

    @classmethod
    def current(cls) -> RecordingSettings:
        """The settings as this thread sees them: ours, and upstream's where torch has them
        (``capture_sizes``, ``skip_cudagraph_warmup``, ``force_cudagraphs_warmup`` from 2.11;
        ``cudagraph_dynamic_shape_rerecord_limit``, ``cudagraph_trees_generation_cloning`` and
        ``cudagraph_initial_mempool_allocation_gb`` from 2.15). Upstream's limits replace
        ours where the user set them (None or 0: no limit, no warning);
        ``cudagraph_or_error``, ``force_cudagraph_sync`` and ``fast_path_cudagraph_asserts``
        switch on what they switch on upstream."""
        sizes, _ = _upstream("cudagraph_capture_sizes", None)
        skip_warmup, _ = _upstream("skip_cudagraph_warmup", False)
        force_warmup, _ = _upstream("force_cudagraphs_warmup", False)
        limit, limit_set = _upstream("cudagraph_dynamic_shape_rerecord_limit", None)
        warn, warn_set = _upstream("cudagraph_dynamic_shape_warn_limit", None)
        cloning, _ = _upstream("cudagraph_trees_generation_cloning", None)
        managed_limit, managed_limit_set = _upstream("cudagraph_managed_input_rerecord_limit", 5)
        if not managed_limit_set:
            managed_limit = config.managed_input_rerecord_limit
        managed_action, action_set = _upstream("cudagraph_managed_input_rerecord_action", "copy")
        if not action_set:
            managed_action = config.managed_input_rerecord_action
        pool_gb, pool_gb_set = _upstream("cudagraph_initial_mempool_allocation_gb", None)
        if not pool_gb_set:
            pool_gb = config.initial_pool_allocation_gb
        if not limit_set:
            limit = config.dynamic_shape_warn_limit if config.skip_dynamic_graphs else None
        rerecords, rerecords_set = _upstream("cudagraph_unexpected_rerecord_limit", None)
        or_error, _ = _upstream("cudagraph_or_error", False)
        sync, _ = _upstream("force_cudagraph_sync", False)
        fast_path_asserts, _ = _upstream("fast_path_cudagraph_asserts", False)
        for name, why in NOT_APPLIED.items():
            if _upstream(name, None)[1]:
                stats.warn_once(messages.upstream_setting_not_applied(name, why))
        clone = cloning == "user_visible" or config.generation_cloning
        if clone and not can_copy_out_of_pool():
            stats.warn_once(messages.CANNOT_CLONE_OUTPUTS)
            clone = False
        return cls(
            warmup_runs=0 if skip_warmup else config.warmup_runs,
            always_warm_up=bool(force_warmup),
            capture_sizes=None if sizes is None else tuple(sizes),
            size_limit=limit,
            size_limit_upstream=limit_set,
            warn_limit=(warn or None) if warn_set else config.dynamic_shape_warn_limit,
            rerecord_limit=rerecords if rerecords_set else config.rerecord_limit,
            rerecord_window=None if rerecords_set else config.rerecord_window,
            rerecord_limit_upstream=rerecords_set,
            clone_live_outputs=clone,
            initial_pool_bytes=int((pool_gb or 0) * 2**30),
            managed_limit=managed_limit or 0,
            managed_action=managed_action,
            copy_moving_inputs=bool(config.copy_moving_inputs),
            keep_state_memory=bool(config.keep_state_memory),
            raise_on_skip=bool(or_error),
            sync_after_call=bool(sync),
            check_held_outputs=bool(fast_path_asserts),
        )

    @classmethod
    def of(cls, recording: RecordingSettings | Mapping[str, Any] | None) -> RecordingSettings:
        """``graphify``'s ``recording``: as generated code gives it (a dict), or read now."""
        if recording is None:
            return cls.current()
        if isinstance(recording, Mapping):
            return cls(**recording)
        return recording

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def upstream_key(key: tuple[int, ...]) -> int | tuple[int, ...] | None:
    """Our size key as upstream's ``cudagraph_capture_sizes`` matches it: no int input is
    None (never in the list), one is that int, several the tuple."""
    if not key:
        return None
    return key[0] if len(key) == 1 else key


class RecordingPolicy:
    """The counting behind one callable's slow path (see the module docstring)."""

    def __init__(
        self, name: str, source: str | None, settings: RecordingSettings | None = None
    ) -> None:
        self.name, self.source = name, source
        self.settings = settings if settings is not None else RecordingSettings.current()
        # Eager runs so far per size (the callable's int inputs), for the sizes seen.
        self.warmups_done: dict[tuple[int, ...], int] = {}
        # Address sets of the static inputs of every recording made (``input_identity``).
        self.address_sets_seen: frozenset[tuple[int, ...]] = frozenset()
        # Generations of the latest ``rerecord_limit + 1`` re-records: the guard's clock.
        self.recent_rerecords: list[int] = []
        self.rerecords = 0  # re-records, in all
        self.stopped_because: str | None = None  # un-graphed for good, and why
        # Per place in the tree (the node a recording goes below): how often each input that
        # another graph produced moved there; those copied there from now on ("copy"); and
        # whether the callable runs un-graphed there ("skip").
        self.managed_moves: weakref.WeakKeyDictionary[Any, dict[int, int]] = (
            weakref.WeakKeyDictionary()
        )
        self.copied_at: weakref.WeakKeyDictionary[Any, frozenset[int]] = weakref.WeakKeyDictionary()
        self.ungraphed_at: weakref.WeakSet[Any] = weakref.WeakSet()

    @property
    def sizes_seen(self) -> int:
        return len(self.warmups_done)

    # -- what the policy says of a call -------------------------------------------------------

    def answers(self, key: tuple[int, ...], place: Any, generation: int) -> PolicyAnswers:
        """What this policy says of a call for sizes ``key`` at ``place`` (the node a
        recording would go below; None off the path) in generation ``generation``, once:
        ``decision.decide`` reads nothing else of the policy."""
        settings = self.settings
        warn_limit = settings.warn_limit
        on_path = place is not None
        return PolicyAnswers(
            size_refusal=self.size_refusal(key),
            warms_up=self.is_warmup(key),
            one_size_too_many=key not in self.warmups_done
            and warn_limit is not None
            and self.sizes_seen == warn_limit,
            ungraphed_here=on_path and place in self.ungraphed_at,
            copied_here=self.copied_at.get(place, frozenset()) if on_path else frozenset(),
            rerecord_stops=self.rerecord_stops(generation),
            rerecord_span=self.rerecord_span(generation),
            limits=self.limits,
            address_sets_seen=self.address_sets_seen,
            managed_limit=settings.managed_limit,
            managed_action=settings.managed_action,
            managed_counts=dict(self.managed_moves.get(place, {})) if on_path else {},
        )

    # -- sizes --------------------------------------------------------------------------------

    def size_refusal(self, key: tuple[int, ...]) -> tuple[str, int | None] | None:
        """Why a call with sizes ``key`` may not be graphed, and the log level to say it at
        (None: the skip's own), or None where it may (a size seen before always may)."""
        settings = self.settings
        if settings.capture_sizes is not None and upstream_key(key) not in settings.capture_sizes:
            # Upstream is silent here: counted, logged at debug level only.
            return messages.not_a_capture_size(settings.capture_sizes), logging.DEBUG
        if key in self.warmups_done:
            return None
        if settings.size_limit is not None and self.sizes_seen >= settings.size_limit:
            if settings.size_limit_upstream:
                return messages.dynamic_shape_rerecord_limit(settings.size_limit), None
            return messages.too_many_sizes_skipped(settings.size_limit), None
        return None

    def is_warmup(self, key: tuple[int, ...]) -> bool:
        """Whether a call for sizes ``key`` now would be a warmup rather than a record."""
        done = self.warmups_done.get(key, 0)
        return done < self.settings.warmup_runs or self.settings.always_warm_up

    def count_sizes(self, key: tuple[int, ...], warmup: bool) -> None:
        """Note sizes ``key`` seen, and one more warmup for them when ``warmup``."""
        done = self.warmups_done.setdefault(key, 0)
        if warmup:
            self.warmups_done[key] = done + 1

    def warn_of_sizes(self) -> None:
        """Sizes one too many (``warn_limit``): a warning."""
        log.warning(messages.MANY_SIZES, self.name, self.sizes_seen)

    @contextlib.contextmanager
    def warming_up(self, key: tuple[int, ...]) -> Iterator[None]:
        """Around a warmup's run: ``mark_warmup_incomplete`` called on this thread meanwhile
        takes the warmup back, so that the next call for ``key`` warms up again."""
        outer = getattr(_running, "warmup", None)
        _running.warmup = (self, key)
        try:
            yield
        finally:
            _running.warmup = outer

    def take_back_warmup(self, key: tuple[int, ...]) -> None:
        if self.warmups_done.get(key):
            self.warmups_done[key] -= 1

    def skip(self, reason: str, level: int | None = None) -> None:
        """Count a call that runs un-graphed, and say why once; with upstream's
        ``triton.cudagraph_or_error``, raise instead (unless said at debug level only, as
        upstream is silent there)."""
        stats.record_skip(reason, self.name, self.source, level=level)
        if level != logging.DEBUG:
            self.raise_if_asked(reason)

    def raise_if_asked(self, reason: str) -> None:
        """With upstream's ``triton.cudagraph_or_error``, raise why a call runs un-graphed
        (after a ``stop``, in this call only: later calls run un-graphed, as upstream's)."""
        if self.settings.raise_on_skip:
            raise RuntimeError(messages.skipped_with_or_error(reason))

    # -- re-records ---------------------------------------------------------------------------

    def note_recorded(self, address_set: tuple[int, ...]) -> None:
        self.address_sets_seen |= {address_set}

    def rerecord_stops(self, generation: int) -> bool:
        """Whether one more re-record at ``generation`` would be too many (``note_rerecord``)."""
        limit, window = self.settings.rerecord_limit, self.settings.rerecord_window
        recent = [*self.recent_rerecords, generation][-(limit + 1) :]
        return len(recent) > limit and (window is None or recent[-1] - recent[0] < window)

    def note_rerecord(self, generation: int) -> bool:
        """Count one re-record at ``generation``; True when it makes too many (the callable
        must stop recording; this one is then not counted in ``rerecords``)."""
        stops = self.rerecord_stops(generation)
        recent = self.recent_rerecords
        recent.append(generation)
        del recent[: -(self.settings.rerecord_limit + 1)]
        if not stops:
            self.rerecords += 1
        return stops

    def note_replacing_record(self) -> None:
        """Count a record again that replaces every recording it is made for (it copies the
        inputs whose memory moves under them): in ``rerecords``, never on the guard's clock,
        as it happens once per place."""
        self.rerecords += 1

    def count_managed_moves(
        self, place: Any, counted: Sequence[int], reached: Sequence[int]
    ) -> bool:
        """Count, at ``place``, one move of each input in ``counted`` that another graph
        produced (``PolicyAnswers.managed_moves``); those in ``reached`` are copied there from
        now on (the "copy" action: ``copied_at``), or the callable runs un-graphed there
        ("skip": ``ungraphed_at``). Returns whether inputs are copied from now on."""
        counts = self.managed_moves.setdefault(place, {})
        for i in counted:
            counts[i] = counts.get(i, 0) + 1
        if not reached:
            return False
        if self.settings.managed_action == "copy":
            self.copied_at[place] = self.copied_at.get(place, frozenset()) | frozenset(reached)
            return True
        self.ungraphed_at.add(place)
        return False

    @property
    def limits(self) -> tuple[int, str]:
        """The thrash guard's limit, and its limits named as the user sets them (messages)."""
        settings = self.settings
        if settings.rerecord_limit_upstream:
            words = f"{UPSTREAM}cudagraph_unexpected_rerecord_limit={settings.rerecord_limit}"
        else:
            words = (
                f"inductor_xpugraph.config.rerecord_limit={settings.rerecord_limit} re-records "
                f"within rerecord_window={settings.rerecord_window} generations"
            )
        return settings.rerecord_limit, words

    def rerecord_span(self, generation: int | None = None) -> int:
        """Generations from the oldest counted re-record to the latest, both included; with
        ``generation``, as they would be with one more re-record then (``rerecord_stops``)."""
        recent = self.recent_rerecords
        if generation is not None:
            recent = [*recent, generation][-(self.settings.rerecord_limit + 1) :]
        return recent[-1] - recent[0] + 1

    def stop(self, reason: str) -> None:
        """Un-graphed for good (the thrash guard, a capture the device refused)."""
        self.stopped_because = reason

    @property
    def stopped(self) -> bool:
        return self.stopped_because is not None


# The warmup running on each thread, as (policy, sizes): ``mark_warmup_incomplete``'s target.
_running = threading.local()


def mark_warmup_incomplete() -> None:
    """Ask for one more warmup of the callable warming up on this thread: its next call for
    the same sizes runs un-graphed again instead of recording. For code that runs inside the
    compiled code during a warmup (an autotuner that has not settled); anywhere else it does
    nothing. Upstream's ``torch.compiler.cudagraph_mark_warmup_incomplete()`` (torch >= 2.15)
    does the same here."""
    running = getattr(_running, "warmup", None)
    if running is not None:
        policy, key = running
        policy.take_back_warmup(key)


def _follow_upstreams_mark_warmup_incomplete() -> None:
    """Make upstream's call reach ours too, where torch has it (``torch.compiler`` looks the
    function up in ``cudagraph_trees`` at each call)."""
    from torch._inductor import cudagraph_trees

    upstream = getattr(cudagraph_trees, "mark_warmup_incomplete", None)
    if upstream is None or getattr(upstream, "_inductor_xpugraph_follows", False):
        return

    def mark_both() -> None:
        upstream()
        mark_warmup_incomplete()

    mark_both._inductor_xpugraph_follows = True  # type: ignore[attr-defined]
    mark_both.__doc__ = upstream.__doc__
    cudagraph_trees.mark_warmup_incomplete = mark_both


_follow_upstreams_mark_warmup_incomplete()
