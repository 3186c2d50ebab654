"""Backend for accelerators with a stream-capture graph API (``torch.xpu``, ``torch.cuda``).

Both device modules expose the same shape of API: a graph class with
``capture_begin(pool=...)``/``capture_end()``/``replay()``, ``graph_pool_handle()``, streams,
``is_current_stream_capturing()``. The xpu and cuda backends are this class with their device
module plugged in; the tree runtime never sees which one it talks to.

Note [The capture stream waits for the caller first]
----------------------------------------------------
Warmups, captures and the empty captures that keep pools alive run on a capture stream of
our own, while the caller's stream reads what they leave (warmup outputs) and the graphs
replay there. The caching allocator hands a block freed on the capture stream to the next
allocation on that stream at once, with no regard for reads the caller's stream still has
queued. Torch itself allocates there: ``capture_begin`` of the first graph of a process (or
after all were destroyed) allocates the random generator's seed and offset tensors on the
current stream and fills them. Found on an H200: ``state = step(state)`` cloned its warmup
output on the caller's stream, retiring freed it, and a new pool's keeper capture put the
generator's seed there and filled it before the clone ran (elements 0 and 1 wrong in 10-60%
of fresh runs). So every use of the capture stream (``on_capture_stream``) first makes it
wait for the caller's stream, then makes the caller's stream wait for it: whatever the
caller queued on memory the capture stream may reuse is done first, and whatever the capture
stream wrote is done before the caller reads it.

Note [Recovering from a failed capture]
---------------------------------------
``capture_begin`` and ``capture_end`` can raise part-way and leave torch in capture mode. The
graph class puts the device's default generator into capture mode first thing in
``capture_begin`` and takes it out only when ``capture_end`` succeeds (not even destroying the
graph does): a generator left there makes every later random op raise "Offset increment outside
graph capture" (seen on the H100, torch 2.11). The allocator routes into the pool until
``capture_end``. XPU's ``capture_end`` ends the SYCL recording first and raises from there
(torch's XPUGraph.cpp), with the queue still recording, and what a recording queue does is what
SYCL Graph says (measured with Intel's SYCL runtime on the CPU,
tests/sycl_rules/test_sycl_rules_differential.py): a host wait on it throws (so do
``synchronize`` and ``empty_cache``, which wait on every queue of the device), and a queue that
waits for an event recorded there *joins* the recording, silently: its later work is recorded,
never run. Its queue is not ours alone: xpu hands out the same 32 queues per priority
round-robin, so a "new" stream is an old queue, and the one a failed capture left recording goes
to whoever takes a stream 32 streams later. So, after such a failure:

1. the allocator's routing into the pool is stopped (``_undo_pool_routing``);
2. the failed graph is destroyed: it is held in one place only (``capture``'s box, cleared,
   and no traceback frame keeps it), and destroying a SYCL graph's last handle returns the
   queues recording into it to executing, their recorded work dropped;
3. nothing waits on the capture stream while it records (``on_capture_stream``): the
   caller's stream would join the recording. If it still records after the graph was
   destroyed, someone else holds the graph: captures stop on the device (``_stop_recording``),
   a capture stream is never looked for among queues that record (``capture_streams``);
4. on torch's XPUGraph from 2.13, the host (pinned memory) allocator routes into the pool
   too, with a filter that refers to the graph just destroyed, until ``capture_end`` gets
   past ending the recording (it ends the device routing, then the host's); no Python call
   ends it, and it is evaluated at every pinned allocation while a queue records. Where the
   device routing was still in place, so is the host's: captures stop on the device for the
   process, said once (``failure_leaves_host_routing``). A ``capture_end`` that raised later,
   in ``finalize``, left neither;
5. otherwise an empty graph is captured, from the caller's stream, which takes the generator
   out of capture mode; when even that fails, the device cannot record (``_stop_recording``,
   which gives the generator a fresh state outside capture mode).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import threading
import traceback
import warnings
import weakref
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, NamedTuple

import torch

from .. import messages
from .base import GraphBackend
from .capture_streams import capture_stream, is_capturing_on, stream_records

log = logging.getLogger("inductor_xpugraph")


class DevicePool(NamedTuple):
    handle: Any  # what graph_pool_handle() returned
    keeper: Any  # an empty graph captured into the pool: the pool lives while it does


class DeviceGraphBackend(GraphBackend):
    #: ``torch.xpu`` or ``torch.cuda``.
    device_module: ModuleType
    #: Extra keyword arguments of ``capture_begin`` (cuda: ``capture_error_mode``).
    capture_begin_kwargs: dict[str, Any] = {}
    #: The allocator's ``(device_index, pool handle)`` calls that stop routing allocations
    #: into a pool and give back a capture's hold on it (``_undo_pool_routing``).
    end_allocate_to_pool: Callable[[int, Any], None]
    release_pool: Callable[[int, Any], None]
    #: ``(device_index, pool handle)``: route this thread's allocations into the pool, with a
    #: hold on it, until ``end_allocate_to_pool`` (``warmup_in_pool``); None where torch has
    #: no such call for the device (warmups then run outside the pool).
    begin_allocate_to_pool: Callable[[int, Any], None] | None = None

    #: Give cached memory back to the device (``empty_cache``) after a pool is dropped
    #: (``release_dropped_pools``): xpu's caching allocator (every release to 2.15) frees
    #: pools that no graph holds inside its out-of-memory retry, with a device
    #: synchronization, even while a capture is under way; none must be left for it to find.
    empty_cache_after_pool_drop: bool = False

    #: Whether the graph class can register a ``torch.Generator`` the code draws from
    #: (``reason_not_to_capture``).
    graphs_register_generators: bool = True
    #: Whether a failed ``capture_begin``/``capture_end`` leaves torch's host (pinned memory)
    #: allocator routing into the pool, with a filter that refers to the destroyed graph:
    #: XPUGraph from torch 2.13, which no Python call undoes (Note [Recovering from a failed
    #: capture]).
    failure_leaves_host_routing: bool = False

    def new_graph(self) -> Any:
        raise NotImplementedError

    def synchronize(self) -> None:
        self.device_module.synchronize(self.device_index)

    def __init__(self, device_index: int) -> None:
        super().__init__(device_index)
        module = self.device_module
        if not module.is_available():
            raise RuntimeError(
                f"inductor_xpugraph: this code was compiled for {self.device}, but "
                f"torch.{self.device_type}.is_available() is False in this process"
            )
        if device_index >= module.device_count():
            raise RuntimeError(
                f"inductor_xpugraph: this code was compiled for {self.device}, but this "
                f"process sees {module.device_count()} {self.device_type} device(s)"
            )
        # Captures run on a dedicated stream, as upstream's trees do: the user's current
        # stream is never put into capture mode. One per device and thread (a thread's tree
        # captures there; two threads capturing at once need two streams), kept for the
        # process and shared by the trees that follow one another across resets: libraries
        # keep per-stream state (cuBLAS a workspace per thread and stream) that a new stream
        # would add to.
        self.capture_stream = capture_stream(module, device_index)
        self.is_capturing = is_capturing_on(module, device_index)
        self.wait_for_other_captures = functools.partial(
            _CAPTURES.wait_for_other_threads, self.device
        )
        self.warms_up_in_pool = self.begin_allocate_to_pool is not None
        #: Captures that failed on this backend: at ``capture_begin``, in the captured code
        #: (an operator the device refused to record) or at ``capture_end``.
        self.failed_captures = 0

    def new_pool(self) -> DevicePool:
        """A private pool, kept alive by an empty graph captured into it.

        A device pool lives only while some graph captured into it does: once the tree had
        dropped its last graph (a model deleted, ``torch._dynamo.reset()``, re-records), the
        next capture into the same handle failed inside ``capture_begin``, after the RNG had
        entered capture mode, which poisoned the process. Upstream's trees keep theirs alive
        the same way. The pool and its memory go when the tree lets go of the ``DevicePool``.
        """
        handle = self.device_module.graph_pool_handle()
        return DevicePool(handle, keeper=self.capture_empty_graph(pool_handle=handle))

    def capture_empty_graph(self, pool_handle: Any = None) -> Any:
        """Capture nothing on the capture stream (into ``pool_handle``, else a pool of its own)
        and return the graph. Besides keeping a pool alive, a capture that succeeds takes the
        device's random number generator into capture mode and out of it again.

        When even this capture fails, the device cannot record here (a driver or device
        without graph support): ``_stop_recording`` says so once, and the error is raised."""
        box = [self.new_graph()]
        handle = self.device_module.graph_pool_handle() if pool_handle is None else pool_handle
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "the graph is empty"
            try:
                with self.on_capture_stream():
                    box[0].capture_begin(pool=handle, **self.capture_begin_kwargs)
                    box[0].capture_end()
            except BaseException as error:
                if error.__traceback__ is not None:
                    traceback.clear_frames(error.__traceback__)
                self._undo_pool_routing(handle)
                box.clear()
                if stream_records(self.device_module, self.capture_stream):
                    self._replace_capture_stream()
                self._stop_recording(error)
                raise
        return box[0]

    @contextlib.contextmanager
    def on_capture_stream(self) -> Iterator[None]:
        """Run the block on the capture stream, after everything the caller's stream has
        queued; the caller's stream then waits for the block's work. Every use of the capture
        stream goes through here (Note [The capture stream waits for the caller first])."""
        caller_stream = self.device_module.current_stream(self.device_index)
        capture_stream = self._untaken_capture_stream()
        capture_stream.wait_stream(caller_stream)
        try:
            with self.device_module.device(self.device_index):
                with self.device_module.stream(capture_stream):
                    yield
        finally:
            # Never after a failed capture that left the stream recording: the caller's
            # stream would join the recording (Note [Recovering from a failed capture]).
            if not stream_records(self.device_module, capture_stream):
                caller_stream.wait_stream(capture_stream)

    def reason_not_to_capture(self, args: list[Any]) -> str | None:
        """A ``torch.Generator`` of the device among ``args`` needs a graph class that can
        register it (``torch.accelerator.Graph`` of torch 2.13-2.15 cannot): decided before
        the capture, so that the callable runs un-graphed and the tree keeps its graphs."""
        if self.graphs_register_generators:
            return None
        for arg in args:
            if isinstance(arg, torch.Generator) and arg.device.type == self.device_type:
                return messages.GENERATOR_NOT_REGISTERED
        return None

    def capture(
        self,
        fn: Callable[[list[Any]], Any],
        args: list[Any],
        pool: Any,
        place_inputs: Callable[[list[Any]], None],
    ) -> tuple[Any, Any]:
        # The graph is held here only, in a box: after a failure, dropping it must destroy
        # it (Note [Recovering from a failed capture]), and no frame of the error's
        # traceback may hold it meanwhile.
        box = [self.new_graph()]
        # A torch.Generator the code draws from gets fresh numbers at each replay only when
        # the graph knows it (the device's default generator it registers itself).
        for arg in args:
            if isinstance(arg, torch.Generator) and arg.device.type == self.device_type:
                box[0].register_generator_state(arg)
        self._untaken_capture_stream()
        # Work queued before the capture (warmup runs, input copies) must be complete. Only
        # this thread's two streams are waited for, never the device: another thread may be
        # capturing, and a device-wide synchronization would break its capture ("operation
        # not permitted when stream is capturing").
        self.device_module.current_stream(self.device_index).synchronize()
        self.capture_stream.synchronize()
        self.release_cached_memory()
        self.prepare_capture_stream()
        # No cycle collection during the capture: it could destroy some unrelated graph,
        # which is not permitted while a stream captures and would invalidate this capture.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        failed_at: str | None = None
        try:
            with self.on_capture_stream(), _CAPTURES.running(self.device):
                failed_at = "capture_begin"
                box[0].capture_begin(pool=pool.handle, **self.capture_begin_kwargs)
                failed_at = None
                try:
                    place_inputs(args)
                    outputs = self.run_captured(box[0], fn, args)
                except BaseException:
                    # The captured code raised, and its error is the one the caller sees.
                    if not self._ended(box):
                        failed_at = "capture_end"
                    raise
                failed_at = "capture_end"
                box[0].capture_end()
                failed_at = None
        except BaseException as error:
            if error.__traceback__ is not None:
                traceback.clear_frames(error.__traceback__)
            self.failed_captures += 1
            if failed_at is not None:
                self._recover_from_failed_capture(box, pool, failed_at)
            box.clear()
            raise
        finally:
            if gc_was_enabled:
                gc.enable()
        return box[0], outputs

    def run_captured(self, graph: Any, fn: Callable[[list[Any]], Any], args: list[Any]) -> Any:
        """Run ``fn(args)`` between ``capture_begin`` and ``capture_end``: the device records
        what it submits. (A stand-in device that cannot record CPU kernels records ``fn``.)"""
        return fn(args)

    @staticmethod
    def _ended(box: list[Any]) -> bool:
        """End the capture of a graph whose captured code raised; whether it ended."""
        try:
            box[0].capture_end()
        except BaseException:
            return False
        return True

    def _recover_from_failed_capture(self, box: list[Any], pool: DevicePool, step: str) -> None:
        """After ``capture_begin`` or ``capture_end`` raised (``step``): Note [Recovering from
        a failed capture]. ``box`` holds the failed graph, the only reference to it."""
        routing_was_left = self._undo_pool_routing(pool.handle)
        box.clear()  # destroys the graph: a queue still recording into it executes again
        if stream_records(self.device_module, self.capture_stream):
            # Someone else holds the graph: its queue records for good, and comes back to
            # whoever takes a stream 32 streams later. Captures stop here.
            self._replace_capture_stream()
            self._stop_recording(messages.queue_left_recording(self.device), step)
            return
        if self.failure_leaves_host_routing and routing_was_left:
            self._stop_recording(messages.HOST_ROUTING_LEFT, step)
            return
        try:
            self.capture_empty_graph()  # takes the generator out of capture mode
        except Exception:  # said by _stop_recording; the capture's own error is raised
            pass

    def _untaken_capture_stream(self) -> Any:
        """The capture stream, replaced first (and said) when its queue records into someone
        else's graph: xpu's pools hand the same queues out round-robin, and waiting for it,
        or on it, would join their recording."""
        if stream_records(self.device_module, self.capture_stream):
            log.warning(messages.capture_stream_taken(self.device))
            self._replace_capture_stream()
        return self.capture_stream

    def _replace_capture_stream(self) -> None:
        """A new capture stream: the next stream of the device's pool that does not record."""
        self.capture_stream = capture_stream(self.device_module, self.device_index, fresh=True)

    def _stop_recording(self, error: BaseException | str, step: str | None = None) -> None:
        """No graph is recorded on this device any more in this process (``cannot_record``):
        not even an empty graph records, or a failed capture left torch in a state no call
        can undo. Said once; every callable on it runs un-graphed. The default generator,
        left in capture mode by the failed capture, is given a state of its own with the
        same seed and offset, outside capture mode (a generator's state is what enters
        capture mode; ``graphsafe_set_state`` swaps it)."""
        marks = _DEVICES_THAT_CANNOT_RECORD.setdefault(self.device_module, {})
        if self.device not in marks:
            reason = error if isinstance(error, str) else messages.first_line(error)
            marks[self.device] = reason
            log.warning(messages.device_cannot_record(self.device, reason, step))
        generator = self.device_module.default_generators[self.device_index]
        try:
            generator.graphsafe_set_state(generator.clone_state())
        except Exception as restore_error:
            log.error(messages.generator_left_capturing(self.device, restore_error))

    @property
    def cannot_record(self) -> str | None:
        return _DEVICES_THAT_CANNOT_RECORD.get(self.device_module, {}).get(self.device)

    def _undo_pool_routing(self, pool_handle: Any) -> bool:
        """After ``capture_begin`` or ``capture_end`` raised: what torch left undone.

        ``capture_begin`` makes the allocator route the capture's allocations into the pool
        and take a hold on it; ``capture_end`` stops the routing and, once the capture has
        ended, the graph gives the hold back when destroyed. When ``cudaStreamEndCapture``
        fails (a capture another thread broke), or XPU's ``end_recording`` does, torch
        raises before either: the allocator would keep checking every later allocation
        against a capture that no longer exists, and the pool could never be freed. So: when
        the allocator still routes into the pool, the routing is stopped and the hold given
        back, once, as torch's own ``use_mem_pool`` pairs them. When it no longer routes,
        torch got past that point and nothing is undone: giving the hold back twice would
        free a pool that graphs still use. Returns whether the routing was still in place.
        """
        try:
            self.end_allocate_to_pool(self.device_index, pool_handle)
        except RuntimeError:  # "not currently recording to mempool_id"
            return False
        self.release_pool(self.device_index, pool_handle)
        return True

    def release_cached_memory(self) -> None:
        _CAPTURES.when_none_running(self.device, self._empty_cache)

    def release_dropped_pools(self) -> None:
        if self.empty_cache_after_pool_drop:
            _CAPTURES.when_none_running(self.device, self._empty_cache)

    def _empty_cache(self) -> None:
        """``empty_cache``, unless it raises because a capture we do not know of is under
        way; the memory then stays cached, as it would without us. CUDA's allocator refuses
        with an internal assert, raised before it changes anything. XPU's has no such assert:
        it synchronizes every queue of the device first, which SYCL refuses while one records
        ("wait cannot be called for a queue which is recording to a command graph."), also
        before it frees anything. (XPU's out-of-memory retry frees pools no graph holds
        with no such check on any release: ``empty_cache_after_pool_drop``.)"""
        try:
            self.device_module.empty_cache()
        except RuntimeError as error:
            log.debug("%s: the cache was not emptied: %s", self.device, error)

    def prepare_capture_stream(self) -> None:
        """Runs before each capture, once the capture stream has caught up with the caller."""

    def warmup(self, fn: Callable[[list[Any]], Any], args: list[Any]) -> Any:
        """Run ``fn(args)`` on the capture stream, where its capture will run.

        Libraries keep state per stream (cuBLAS a workspace per thread and stream, 32 MiB on
        an H100): warmed up on the caller's stream, graphed code would give that stream state
        that only the capture stream needs, held for the life of the process. Upstream's
        trees warm up on their capture stream too. The caller's stream waits for the run, as
        if it had run there: its outputs, and the inputs it read, are safe to use and free
        (Note [The capture stream waits for the caller first]).
        """
        with self.on_capture_stream():
            return fn(args)

    def warmup_in_pool(self, fn: Callable[[list[Any]], Any], args: list[Any], pool: Any) -> Any:
        """``warmup``, with this thread's allocations routed into ``pool`` as a capture's
        are, as upstream's trees warm up (``_use_cuda_memory_pool_manager``): the capture
        that follows finds the warmup's freed memory in the pool (``trees.memory``)."""
        self.prepare_warmup_in_pool()
        try:
            with self._allocating_in(pool):
                return fn(args)
        finally:
            self.after_warmup_in_pool()

    def reserve_in_pool(self, pool: Any, nbytes: int) -> bool:
        """The allocation routed into the pool as a warmup's are; freed at once, its segment
        stays cached in the pool, which its keeper graph holds (upstream primes its pool the
        same way, with an allocation inside an empty capture)."""
        if not self.warms_up_in_pool:
            return False
        with self._allocating_in(pool):
            torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return True

    @contextlib.contextmanager
    def _allocating_in(self, pool: Any) -> Iterator[None]:
        """This thread's allocations on the capture stream go into ``pool`` meanwhile.
        Routing into a pool counts as a capture to the allocator: no emptying its cache."""
        with self.on_capture_stream(), _CAPTURES.running(self.device):
            self.begin_allocate_to_pool(self.device_index, pool.handle)
            try:
                yield
            finally:
                self.end_allocate_to_pool(self.device_index, pool.handle)
                self.release_pool(self.device_index, pool.handle)

    def prepare_warmup_in_pool(self) -> None:
        """Runs before each warmup in the pool, outside it."""

    def after_warmup_in_pool(self) -> None:
        """Runs after each warmup in the pool, outside it."""


#: How long a replay waits for another thread's capture on its device before it goes ahead.
OTHER_CAPTURE_WAIT_S = 10.0


class _CapturesInFlight:
    """Our captures and warmups in a pool under way in this process, per device and thread: a
    device's cache is emptied only while none is, and a replay in one thread waits for the
    captures of the others (``GraphBackend.wait_for_other_captures``)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        #: device -> thread id -> how many of that thread's are under way.
        self._running: dict[str, dict[int, int]] = {}

    @contextlib.contextmanager
    def running(self, device: str) -> Iterator[None]:
        thread = threading.get_ident()
        with self._changed:
            threads = self._running.setdefault(device, {})
            threads[thread] = threads.get(thread, 0) + 1
        try:
            yield
        finally:
            with self._changed:
                threads = self._running[device]
                threads[thread] -= 1
                if not threads[thread]:
                    del threads[thread]
                self._changed.notify_all()

    def when_none_running(self, device: str, fn: Callable[[], None]) -> None:
        """Run ``fn`` now if no capture on ``device`` is under way, else not at all."""
        with self._changed:
            if not self._running.get(device):
                fn()

    def wait_for_other_threads(self, device: str) -> None:
        """Return once no thread but this one has a capture on ``device`` under way, or after
        ``OTHER_CAPTURE_WAIT_S``: a capture whose code waits for this thread must not wait
        forever (the replay may then fail, as it would without the wait)."""
        if not self._running.get(device):  # a replay's path: no lock when none runs
            return
        thread = threading.get_ident()
        with self._changed:
            ended = self._changed.wait_for(
                lambda: not any(t != thread for t in self._running.get(device, ())),
                timeout=OTHER_CAPTURE_WAIT_S,
            )
        if not ended:
            log.warning(messages.other_capture_still_running(device, OTHER_CAPTURE_WAIT_S))


_CAPTURES = _CapturesInFlight()

# Devices on which not even an empty graph records, or which a failed capture left in a state
# no call undoes, with the reason, per device module: the state is torch's, for the life of
# the process (every tree and thread on the device runs un-graphed; ``_stop_recording``), and
# ``reset()`` does not undo it. A stand-in device module (``sycl_rules.on_cpu``) takes its
# marks with it.
_DEVICES_THAT_CANNOT_RECORD: weakref.WeakKeyDictionary[Any, dict[str, str]] = (
    weakref.WeakKeyDictionary()
)
