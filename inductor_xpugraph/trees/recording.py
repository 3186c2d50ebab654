"""One captured graph of one compiled callable, its replay fast path, and its output memory.

A ``Recording`` is made once, at record time, and then only replays. Everything that can be
decided once is decided in ``__init__``: which inputs are copied and into which static
buffers, which static inputs must keep their address, and how each output is rebuilt. A
replay is then: compare static-input addresses, one batched copy of the other inputs, one
graph launch (``launch``: all that precedes the device's work), and then, while the device
runs, one cheap tensor per output aliasing the graph's memory (``hand_out``).

Output memory: each storage the capture allocated for the outputs is an ``OutputBlock``.
Every replay hands out tensors over the same memory, and the next replay overwrites their
contents. All tensors over a block share one storage object (``OutputBlock.storage``),
whatever made them: this recording's aliases, the outputs handed to the caller, the caller's
views of them, ``.data``, ``detach()``, the ``.grad`` autograd stole from a gradient, a later
recording's output in the same memory. That is what lets the tree see, with one reference
count, whether the caller still uses a block, and act on every tensor over it at once
(``OutputBlock.retire_stale``, ``hand_over``).

Output objects: a replay of a forward or inference graph hands out the *same* tensor object
as the replay before at each position (as upstream's trees do; building them costs more
than the rest of the replay for a training step's ~100 forward outputs), unless someone else
still holds that object: a Python reference (the caller kept it), or a C++ one (autograd
saved it, a view's base, a parameter's ``.grad``). Such an object leaves with its holder,
and the position gets a new one; so does one with autograd history (hooks a caller
attached must not carry over). A held object is therefore never handed out again, and the
tree's stale-output rules apply to it as to any output. The outputs autograd takes into the
caller's graph (a training forward's differentiable outputs) are never reused: after the
first generation that replayed it, the tree has the recording find them
(``find_outputs_autograd_took``); from then on each replay hands out a new object there and
the recording holds it only weakly, for the stale-output rules. Otherwise the recording
would keep, through the object's ``grad_fn``, that step's autograd graph alive, and with it
the parameters and the compiled code (Note [What keeps a graph alive] in
``lifetime``). Each position's kept object is always one of the recording's own
references to its block (counted in ``own_refs``), so a block is dead when its storage has
no other reference *and* no object of a recording over it is held (``OutputBlock.is_dead``).
A backward graph's outputs are gradients, which autograd keeps as a parameter's ``.grad``
without a copy only when nothing else references them: its replays hand out new objects and
keep none.

The replay's two steps are chosen once, when the recording is made, so that no replay asks
what kind of recording it is: ``launch`` is a ``Launch``, or a ``LaunchWritingBack`` for a
graph that writes inputs which are new tensors at every call; ``hand_out`` hands out the
kept objects, or new ones for gradients; and a recording with outputs over parameters whose
memory moves (FSDP2's) wraps both in ``OverCallersTensors``. Each is one bound method, called
directly by the fast path: no step adds a call level. A recording that copies such parameters
also has its copy watched (``inputs.SettlingWatch``); once their memory settles, it matches no
call (``static_inputs_match`` is replaced), and the tree records one that reads them in place.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from . import messages
from .backends import Graph
from .inputs import (
    SETTLE_REPLAYS,
    MovingStorages,
    SettlingWatch,
    StaticInput,
    input_copier,
    input_identity,
    writable_view,
)
from .invalidation import StorageInvalidator, copy_out_of_pool
from .recorded_state import RecordedState
from .storages import tensor_over, unowned

# torch's C++ loop over input addresses (CUDA builds); elsewhere the Python loop.
_data_ptrs_at_indices_equal = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)

_use_count = torch._C._storage_Use_Count

# Where an output lies: (block, storage offset, size, stride, dtype).
Layout = tuple["OutputBlock", int, torch.Size, tuple[int, ...], torch.dtype]


class OutputBlock:
    """Graph memory one or more outputs lie in: a storage the capture allocated.

    ``storage`` never owns the memory; ``owner`` keeps it allocated, or nothing does (the
    memory strategy decides: ``trees.memory``). ``own_refs`` counts the runtime's own
    references to ``storage``: the object itself and each alias a recording builds over it.
    Any reference beyond those is the caller's.
    """

    __slots__ = ("address", "nbytes", "owner", "storage", "own_refs", "aliased_by")

    def __init__(self, owner: torch.UntypedStorage) -> None:
        self.address = owner.data_ptr()
        self.nbytes = owner.nbytes()
        self.owner: torch.UntypedStorage | None = owner
        self.storage = unowned(owner)
        self.own_refs = 1
        # Recordings with aliases over this memory: its producer, and later graphs of the
        # path whose outputs lie in it.
        self.aliased_by: list[Recording] = []

    def is_dead(self) -> bool:
        """True when nothing but the runtime references this memory."""
        return self.storage_unreferenced() and not any(
            recording.holds_output_in(self) for recording in self.aliased_by
        )

    def storage_unreferenced(self) -> bool:
        """True when no tensor but the runtime's own points at this memory (the output
        objects the recordings hand out are their own: see ``Recording.held_positions``)."""
        return _use_count(self.storage._cdata) == self.own_refs

    def new_unowned_storage(self) -> torch.UntypedStorage:
        """A fresh storage over this memory that does not own it (to be made its owner)."""
        return unowned(self.storage)

    # Retiring (``retire_stale``, ``hand_over``): the old storage object leaves with the
    # caller's tensors, and the runtime continues with a new one over the same memory. Each
    # recording in ``aliased_by`` must then ``rebuild_aliases()`` before it replays (once for
    # all the blocks retired at once).

    def retire_stale(self, invalidate: StorageInvalidator, message: str) -> None:
        """The caller's tensors over this memory raise ``message`` from now on."""
        stale, self.storage = self.storage, unowned(self.storage)
        invalidate(stale, message)


def hand_over(blocks: Sequence[OutputBlock]) -> None:
    """The caller's tensors over these blocks keep their values, in copies outside the pool
    (one batched device copy); the graphs keep their memory."""
    for block, storage in zip(blocks, copy_out_of_pool([block.storage for block in blocks])):
        block.storage = storage


class Recording:
    def __init__(
        self,
        graph: Graph,
        *,
        static_inputs: Sequence[StaticInput],
        copied_inputs: Sequence[int],
        input_buffers: Sequence[torch.Tensor],
        captured_outputs: Any,
        path_blocks: Mapping[int, OutputBlock] | None = None,
        consumed_inputs: frozenset[int] = frozenset(),
        reuse_output_objects: bool = True,
        object_inputs: Sequence[tuple[int, Any]] = (),
        state_inputs: Sequence[tuple[int, torch.Tensor]] = (),
        keep_state_memory: bool = True,
        written_back: Sequence[tuple[int, torch.Tensor]] = (),
        moving_inputs: Sequence[int] = (),
        moving_buffers: Mapping[int, int] | None = None,
        watch_settling: MovingStorages | None = None,
    ) -> None:
        """``static_inputs``: every tensor input that is not copied, as it was at capture:
        parameters and buffers, and outputs of earlier graphs on the tree path, whose blocks
        ``path_blocks`` holds by address.
        ``object_inputs``: (input index, object) of the inputs that are neither tensors nor
        sizes (a ``torch.Generator``, a ``DeviceMesh`` or process group that DTensor passes):
        the graph baked them in, so a replay needs the same objects.
        ``state_inputs``: (input index, tensor) of the static inputs that are state the caller
        keeps and the graph writes (a cache's tensors): held weakly, their memory kept, so
        that new state can move in once they died (``recorded_state``), unless not
        ``keep_state_memory``.
        ``written_back``: (input index, the recording's own tensor the graph writes there) for
        inputs the graph writes that are new tensors at every call (a cache that beam search
        reorders into new tensors at each step): a replay copies each into its tensor before
        the launch and back after it, two device copies where a static input needs none.
        ``moving_inputs``: the copied inputs that are parameters whose memory moves under them
        (FSDP2's: ``inputs.MovingStorages``). An output that is one of them, or a view of
        one (a forward saves its weight for the backward), is handed out over the caller's
        tensor, as without graphs, not over the copy: the copy is scratch, and the gathered
        parameters are not kept in the pool until the backward. ``moving_buffers``: which
        outputs those are: the storage objects (``_cdata``) of their buffers that the capture's
        outputs still reference -> input index (``InputBuffers.still_referenced``).
        ``watch_settling``: where replays note that ``moving_inputs`` settled
        (``inputs.SettlingWatch``); None: they are not watched.
        ``consumed_inputs``: storage addresses of inputs that the capture freed after their
        last use; what lies there now is the capture's own allocation.
        ``reuse_output_objects``: whether replays hand out the objects of the replay before
        (see the module docstring); not for gradients."""
        self.static_input_ptrs = tuple((s.index, s.address) for s in static_inputs)
        # The same, as torch's C++ check wants them (a model has hundreds of parameters).
        self._static_indices = [i for i, _ in self.static_input_ptrs]
        self._ptr_by_index: list[int | None] = [None] * (max(self._static_indices, default=-1) + 1)
        for i, ptr in self.static_input_ptrs:
            self._ptr_by_index[i] = ptr
        self.object_inputs = tuple(object_inputs)
        self.state = RecordedState(state_inputs, keep_state_memory)
        self.copied_inputs = tuple(copied_inputs)
        self.input_buffers = list(input_buffers)
        # Copy targets: the static buffers, narrowed where an input is expanded (stride 0),
        # so that a copy never writes one memory location twice.
        self._copy_targets = [writable_view(buffer) for buffer in self.input_buffers]
        self._expanded = [t is not b for t, b in zip(self._copy_targets, self.input_buffers)]
        copy_inputs = input_copier(self.copied_inputs, self._copy_targets, self._expanded)
        self.moving_inputs = tuple(moving_inputs)
        self.copies_settled = False  # the moving inputs settled: matches no call
        self._kept_copying: str | None = None  # they settled, but copy for good: why
        self._watch: SettlingWatch | None = None
        if watch_settling is not None and self.moving_inputs:
            self._watch = SettlingWatch(self.moving_inputs, watch_settling, self._stop_matching)
            copy_inputs = _watched(self._watch, copy_inputs)
        self._output_is_tuple = isinstance(captured_outputs, tuple)
        outputs = (
            captured_outputs if isinstance(captured_outputs, (tuple, list)) else [captured_outputs]
        )
        input_storages = {s.storage_address for s in static_inputs} - consumed_inputs
        dtypes = dict(zip(self.copied_inputs, (buffer.dtype for buffer in self.input_buffers)))
        moving_buffers = {storage: (i, dtypes[i]) for storage, i in (moving_buffers or {}).items()}
        self._layouts, self._constants, self.blocks, callers_aliases = _output_layouts(
            outputs, input_storages, path_blocks or {}, moving_buffers
        )
        # The memory the blocks span, a quick test of whether a tensor lies in one.
        self._span = (
            (
                min(block.address for block in self.blocks),
                max(block.address + block.nbytes for block in self.blocks),
            )
            if self.blocks
            else (1, 0)
        )
        self._reuses_outputs = reuse_output_objects
        # Output positions over each block this recording builds tensors over. Each position
        # holds its alias over the block, and the object it hands out when reused.
        positions = tuple(i for i, layout in enumerate(self._layouts) if layout is not None)
        self._reused_positions = positions if reuse_output_objects else ()
        # Positions handed out as a new object at every replay (see the module docstring),
        # whether the tree has had them found yet, and what the last replay handed out there
        # (held weakly: it may carry the caller's autograd graph).
        self._fresh_positions: tuple[int, ...] = ()
        self._fresh_handed_out: dict[int, weakref.ref] = {}
        self.autograd_outputs_found = not reuse_output_objects
        self._positions_in: dict[OutputBlock, tuple[int, ...]] = {}
        for i in positions:
            block = self._layouts[i][0]
            self._positions_in[block] = (*self._positions_in.get(block, ()), i)
        self._refs_per_position = 2 if reuse_output_objects else 1
        for block, in_block in self._positions_in.items():
            block.aliased_by.append(self)
            block.own_refs += self._refs_per_position * len(in_block)
        self.rebuild_aliases()
        # The replay's two steps (see the module docstring), chosen here once.
        launcher = (
            LaunchWritingBack(graph, copy_inputs, written_back)
            if written_back
            else Launch(graph, copy_inputs)
        )
        self.launch: Callable[[list[Any]], None] = launcher.launch
        self.hand_out: Callable[[], Any] = (
            self._hand_out_kept_objects if reuse_output_objects else self._hand_out_new_objects
        )
        if callers_aliases:
            over_callers = OverCallersTensors(
                self.launch, self.hand_out, callers_aliases, self._output_is_tuple
            )
            self.launch, self.hand_out = over_callers.launch, over_callers.hand_out

    def rebuild_aliases(self) -> None:
        """Build each position's alias and output object over its block's current storage."""
        self._output_aliases = [
            tensor_over(layout[0].storage, *layout[1:]) if layout is not None else constant
            for layout, constant in zip(self._layouts, self._constants)
        ]
        self._output_objects = self.outputs() if self._reuses_outputs else []

    def release(self) -> None:
        """This recording is dropped: its tensors no longer count as the runtime's
        references to any block (earlier graphs' blocks live on), and the reference cycles
        between it and the blocks are broken, so that its graph is destroyed now."""
        for block, in_block in self._positions_in.items():
            block.aliased_by.remove(self)
            block.own_refs -= self._refs_per_position * len(in_block)
        self._positions_in = {}
        self._reused_positions = self._fresh_positions = ()
        self._fresh_handed_out = {}
        self._output_aliases = []
        self._output_objects = []
        self.launch = self.hand_out = _released

    # -- output objects (see the module docstring) -------------------------------------------

    def memory_referenced(self) -> bool:
        """Whether anything outside the runtime still reaches this recording's outputs: an
        output object held, or their memory referenced otherwise (views, saved tensors)."""
        return bool(self.held_positions()) or not all(
            block.storage_unreferenced() for block in self.blocks
        )

    def held_positions(self) -> list[int]:
        """Positions whose output object someone other than this recording holds."""
        held = _held_positions(self._output_objects, self._reused_positions)
        for i, handed_out in self._fresh_handed_out.items():
            if handed_out() is not None:
                held.append(i)
        return held

    def objects_only_kept_here(self) -> list[torch.Tensor]:
        """The output objects kept to be handed out again that nobody else holds now: no one
        can read them, so later graphs of the step may reuse their memory."""
        held = set(_held_positions(self._output_objects, self._reused_positions))
        return [self._output_objects[i] for i in self._reused_positions if i not in held]

    def holds_output_in(self, block: OutputBlock) -> bool:
        """Whether someone holds a reused output object this recording built over ``block``."""
        return self._reuses_outputs and bool(
            _held_positions(self._output_objects, self._positions_in[block])
        )

    def find_outputs_autograd_took(self) -> None:
        """Once, after a generation that replayed this recording: the positions whose object
        has autograd history are handed out as new objects from now on; the objects there
        now are replaced, and held weakly like those later replays hand out."""
        objects = self._output_objects
        fresh = tuple(i for i in self._reused_positions if objects[i].requires_grad)
        self.autograd_outputs_found = True
        if not fresh:
            return
        for i in fresh:  # what the last replay handed out there, and a new object to keep
            self._fresh_handed_out[i] = weakref.ref(objects[i])
            objects[i] = self._output_aliases[i].detach()
        self._fresh_positions = fresh
        self._reused_positions = tuple(i for i in self._reused_positions if i not in fresh)

    def output_object(self, position: int) -> torch.Tensor:
        """The object at ``position`` that the caller was handed (while it is held)."""
        handed_out = self._fresh_handed_out.get(position)
        return handed_out() if handed_out is not None else self._output_objects[position]

    def blocks_at(self, positions: Sequence[int]) -> set[OutputBlock]:
        return {self._layouts[i][0] for i in positions}

    def renew_outputs(self, positions: Sequence[int]) -> None:
        """Give these positions new output objects (their held ones leave with the holder)."""
        for i in positions:
            if self._fresh_handed_out.pop(i, None) is None:
                self._output_objects[i] = self._output_aliases[i].detach()

    def static_inputs_match(self, args: Sequence[Any]) -> bool:
        """True when every non-copied input is what it was at capture: each static tensor at
        its address, each object input the same object."""
        if _data_ptrs_at_indices_equal is not None and self.static_input_ptrs:
            if not _data_ptrs_at_indices_equal(args, self._ptr_by_index, self._static_indices):
                return False
        else:
            for index, ptr in self.static_input_ptrs:
                if args[index].data_ptr() != ptr:
                    return False
        for index, obj in self.object_inputs:
            if args[index] is not obj:
                return False
        return True

    def _stop_matching(self) -> None:
        """The moving inputs this recording copies settled (``SettlingWatch``): from now on it
        matches no call, so the next call records one that reads them where they lie. The
        fast path calls ``static_inputs_match`` as it is: no flag is tested on a replay."""
        self.copies_settled = True
        self.static_inputs_match = _matches_no_call  # type: ignore[method-assign]

    def keep_copying(self, why: str) -> None:
        """Match calls again, copying the inputs that settled, for good: ``why`` (no capture
        could replace this recording where it is, or they moved again first)."""
        self.copies_settled, self._kept_copying = False, why
        del self.static_inputs_match  # the method again

    def why_copied(self) -> str | None:
        """Why this recording copies its ``moving_inputs`` (None: it copies none)."""
        if not self.moving_inputs:
            return None
        if self._kept_copying is not None:
            return self._kept_copying
        if self._watch is None:
            return messages.MOVED_AFTER_SETTLING
        if self._watch.moved:
            return messages.MOVED_AFTER_RECORD
        return messages.copies_until_settled(SETTLE_REPLAYS)

    def matches_at(self, args: Sequence[Any], positions: Sequence[int]) -> bool:
        """Whether this recording takes each of ``positions`` where it lies, at the address it
        has in ``args``, and ``args``' object inputs are its own: a recording of ``args`` that
        takes exactly those where they lie replays every call this one replays."""
        ptrs = self._ptr_by_index
        for i in positions:
            if i >= len(ptrs) or ptrs[i] != args[i].data_ptr():
                return False
        return all(args[index] is obj for index, obj in self.object_inputs)

    def moving_input_bytes(self) -> int:
        """Bytes each replay copies of the inputs whose memory moves (``moving_inputs``)."""
        return sum(
            buffer.untyped_storage().nbytes()
            for i, buffer in zip(self.copied_inputs, self.input_buffers)
            if i in self.moving_inputs
        )

    def state_died(self) -> bool:
        """Whether the caller dropped state this recording writes (a cache that ``generate``
        made for one request): it replays again once new state moves in (``adopt_state``)."""
        return self.state.died()

    def can_adopt_state(self, args: Sequence[Any]) -> bool:
        """Whether the call's state can move into this recording's memory, after which it
        replays the call (Note [State moved into a recording's memory] in
        ``recorded_state``): its state died, and the call's inputs differ from the
        recording's only by new state laid out as the dead state was."""
        moved, replaced = self.changed_inputs(args)
        return not replaced and self.state.adoptable(args, moved)

    def adopt_state(self, args: Sequence[Any]) -> None:
        """Move the call's state into this recording's memory (``can_adopt_state``)."""
        self.state.adopt(args)

    def changed_inputs(self, args: Sequence[Any]) -> tuple[list[int], list[int]]:
        """The non-copied inputs that are not what they were at capture: the static tensors
        at new addresses, and the object inputs that are other objects."""
        moved = [i for i, ptr in self.static_input_ptrs if args[i].data_ptr() != ptr]
        return moved, [i for i, obj in self.object_inputs if args[i] is not obj]

    def input_identity(self, args: Sequence[Any]) -> tuple[int, ...]:
        """What tells one set of non-copied inputs from another (``input_identity``)."""
        return input_identity(args, self._static_indices, [i for i, _ in self.object_inputs])

    def replay(self, args: list[Any]) -> Any:
        """``launch``, then ``hand_out``: the replay off the fast path (which calls the two
        itself, retiring a generation in between). ``args`` is consumed."""
        self.launch(args)
        return self.hand_out()

    def may_hold(self, address: int) -> bool:
        """Whether ``address`` (a tensor's ``data_ptr()``) lies in one of the blocks, or
        just past its end (a tensor with no elements there: counted, to err on the safe side)."""
        low, high = self._span
        if not low <= address <= high:
            return False
        for block in self.blocks:
            if block.address <= address <= block.address + block.nbytes:
                return True
        return False

    def _hand_out_kept_objects(self) -> Any:
        """``hand_out`` of a forward or inference recording (host work only, while the
        device runs): the kept objects, a new one at each position whose object someone
        holds or that has autograd history, new objects at the positions autograd takes."""
        objects = self._output_objects
        for i in _held_positions(objects, self._reused_positions, with_history=True):
            objects[i] = self._output_aliases[i].detach()
        if self._fresh_positions:
            objects = list(objects)
            for i in self._fresh_positions:
                objects[i] = self._output_aliases[i].detach()
                self._fresh_handed_out[i] = weakref.ref(objects[i])
        return tuple(objects) if self._output_is_tuple else list(objects)

    def _hand_out_new_objects(self) -> Any:
        """``hand_out`` of a backward recording: new objects at every replay (gradients)."""
        outputs = self.outputs()
        return tuple(outputs) if self._output_is_tuple else outputs

    def outputs(self) -> list[Any]:
        """New tensor objects over the output memory (~0.4 µs each: ``detach()`` of the
        aliases, against ~2.6 µs for ``empty(0).set_(storage, ...)``)."""
        return [
            alias.detach() if layout is not None else alias
            for layout, alias in zip(self._layouts, self._output_aliases)
        ]


class Launch:
    """A replay's ``launch``: all that must come before the device starts, the copy of the
    copied inputs into the static buffers and the graph launch. ``args`` is consumed."""

    __slots__ = ("_graph", "_copy_inputs")

    def __init__(self, graph: Graph, copy_inputs: Callable[[list[Any]], None]) -> None:
        self._graph = graph
        self._copy_inputs = copy_inputs

    def launch(self, args: list[Any]) -> None:
        self._copy_inputs(args)
        args.clear()
        self._graph.replay()


class LaunchWritingBack(Launch):
    """``Launch``, for a graph that writes inputs which are new tensors at every call (a
    cache that beam search reorders into new tensors at each step): the caller's tensors are
    copied into the recording's own before the launch, and back after it (queued on the same
    stream, so the copy back follows the graph)."""

    __slots__ = ("_positions", "_buffers")

    def __init__(
        self,
        graph: Graph,
        copy_inputs: Callable[[list[Any]], None],
        written_back: Sequence[tuple[int, torch.Tensor]],
    ) -> None:
        super().__init__(graph, copy_inputs)
        self._positions = tuple(i for i, _ in written_back)
        self._buffers = [buffer for _, buffer in written_back]

    def launch(self, args: list[Any]) -> None:
        callers = [args[i] for i in self._positions]
        torch._foreach_copy_(self._buffers, callers)
        self._copy_inputs(args)
        args.clear()
        self._graph.replay()
        torch._foreach_copy_(callers, self._buffers)


class OverCallersTensors:
    """A recording's ``launch`` and ``hand_out``, for outputs over parameters whose memory
    moves (FSDP2's): the launch keeps the caller's tensors there, and the hand-out builds
    those outputs over them, as they would be without graphs, not over the recording's
    scratch copy."""

    __slots__ = ("_launch", "_hand_out", "_aliases", "_output_is_tuple", "_callers")

    def __init__(
        self,
        launch: Callable[[list[Any]], None],
        hand_out: Callable[[], Any],
        aliases: Sequence[tuple[int, int, int, torch.Size, tuple[int, ...]]],
        output_is_tuple: bool,
    ) -> None:
        """``aliases``: (output position, input index, storage offset, size, stride) of each
        output over a moving input."""
        self._launch = launch
        self._hand_out = hand_out
        self._aliases = tuple(aliases)
        self._output_is_tuple = output_is_tuple
        self._callers: list[torch.Tensor] = []

    def launch(self, args: list[Any]) -> None:
        self._callers = [args[i] for _, i, *_ in self._aliases]
        self._launch(args)

    def hand_out(self) -> Any:
        outputs = list(self._hand_out())
        for (position, _, offset, size, stride), caller in zip(self._aliases, self._callers):
            outputs[position] = caller.detach().as_strided(
                size, stride, caller.storage_offset() + offset
            )
        self._callers = []
        return tuple(outputs) if self._output_is_tuple else outputs


def _watched(watch: SettlingWatch, copy_inputs: Callable[[list[Any]], Any]) -> Callable:
    """``copy_inputs``, after ``watch`` saw where the moving inputs lie."""

    def watch_then_copy(args: list[Any]) -> None:
        watch(args)
        copy_inputs(args)

    return watch_then_copy


def _matches_no_call(args: Sequence[Any]) -> bool:
    return False


def _output_layouts(
    outputs: Sequence[Any],
    input_storages: set[int],
    path_blocks: Mapping[int, OutputBlock],
    moving_buffers: Mapping[int, tuple[int, torch.dtype]],
) -> tuple[list[Layout | None], list[Any], list[OutputBlock], list[tuple]]:
    """Where each captured output lies, and the blocks of memory the capture allocated.

    An output in the memory of a static input is either in an earlier graph's block (it is
    rebuilt over that block's storage, so that holding it counts as a use of that memory) or
    in a parameter or buffer (kept as a constant alias). Any other output lies in memory the
    capture allocated (its input buffers included: a forward returns its input batch, saved
    for the backward). Non-tensor outputs (None, sizes) are constants. An output over the
    buffer of a moving input (``moving_buffers``: its storage object -> input index and
    dtype) is rebuilt over the caller's tensor at each replay.
    Returns (layout or None, constant or None) per output, the new blocks, and
    (position, input index, storage offset, size, stride) per output over a moving input.
    """
    layouts: list[Layout | None] = []
    constants: list[Any] = []
    blocks: dict[int, OutputBlock] = {}
    callers_aliases: list[tuple] = []
    for position, out in enumerate(outputs):
        if not isinstance(out, torch.Tensor):
            layouts.append(None)
            constants.append(out)
            continue
        storage = out.untyped_storage()
        address = storage.data_ptr()
        moving = moving_buffers.get(storage._cdata)
        if moving is not None and moving[1] == out.dtype:
            layouts.append(None)
            constants.append(None)
            callers_aliases.append(
                (position, moving[0], out.storage_offset(), out.size(), out.stride())
            )
            continue
        if address in input_storages:
            block = path_blocks.get(address)
            if block is None:  # a parameter or buffer returned (or viewed)
                layouts.append(None)
                # detach(): a new tensor over the same storage, offset, sizes and strides,
                # with no autograd history and not an autograd view.
                constants.append(out.detach())
                continue
        else:
            block = blocks.get(address)
            if block is None:
                block = blocks[address] = OutputBlock(storage)
        layouts.append((block, out.storage_offset(), out.size(), out.stride(), out.dtype))
        constants.append(None)
    return layouts, constants, list(blocks.values()), callers_aliases


def _held_positions(
    objects: list[Any], positions: Sequence[int], with_history: bool = False
) -> list[int]:
    """The positions whose object someone besides ``objects`` holds: a Python reference or
    a C++ one (a use count above one); ``with_history``: or that has autograd history
    (``requires_grad``), which is never handed out again either, so that hooks and
    ``retain_grad()`` a caller attached never carry over to a later step.
    ``_OWN_REFS`` is what ``sys.getrefcount`` reads here for an object that only ``objects``
    holds, measured once at import on this very function."""
    held = []
    for i in positions:
        obj = objects[i]
        if (
            getrefcount(obj) > _OWN_REFS
            or obj._use_count() > 1
            or (with_history and obj.requires_grad)
        ):
            held.append(i)
    return held


getrefcount = sys.getrefcount
_OWN_REFS = 0  # until measured: every object counts as held, none is handed out twice


def _measure_own_refs() -> int:
    """The reference count ``_held_positions`` reads for an object only its list holds (it
    depends on the interpreter): the smallest at which a probe nobody holds is free, checked
    to see the probe as held once a variable holds it too. 0 (never hand an object out
    twice) if that check fails, which costs speed only."""
    global _OWN_REFS
    objects = [torch.empty(1)]
    for refs in range(1, 8):
        _OWN_REFS = refs
        if not _held_positions(objects, (0,)):
            holder = objects[0]
            seen_as_held = _held_positions(objects, (0,)) == [0]
            del holder
            return refs if seen_as_held else 0
    return 0


_OWN_REFS = _measure_own_refs()


def _released(*args: Any) -> Any:
    raise RuntimeError("inductor_xpugraph internal error: replay of a dropped recording")
