"""One captured graph of one compiled callable, its replay fast path, and its output memory.

A ``Recording`` is made once, at record time, and then only replays. Everything that can be
decided once is decided in ``__init__``: which inputs are copied and into which static
buffers, which static inputs must keep their address, and how each output is rebuilt. A
replay is then: compare static-input addresses, one batched copy of the other inputs, one
graph launch, and one cheap tensor per output aliasing the graph's memory.

Output memory: each storage the capture allocated for the outputs is an ``OutputBlock``.
Like upstream's trees, every replay hands out fresh tensor objects over the same memory and
the next replay overwrites their contents. All tensors over a block share one storage object
(``OutputBlock.storage``), whatever made them: this recording's aliases, the outputs handed
to the caller, the caller's views of them, ``.data``, ``detach()``, the ``.grad`` autograd
stole from a gradient, a later recording's output in the same memory. That is what lets the
tree see, with one reference count, whether the caller still uses a block, and act on every
tensor over it at once (``OutputBlock.retire_stale``, ``hand_over``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .backends import Graph
from .invalidation import StorageInvalidator, copy_out_of_pool
from .storages import alias_over, tensor_over, unowned

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

    __slots__ = ("address", "owner", "storage", "own_refs", "aliased_by")

    def __init__(self, owner: torch.UntypedStorage) -> None:
        self.address = owner.data_ptr()
        self.owner: torch.UntypedStorage | None = owner
        self.storage = unowned(owner)
        self.own_refs = 1
        # Recordings with aliases over this memory: its producer, and later graphs of the
        # path whose outputs lie in it.
        self.aliased_by: list[Recording] = []

    def is_dead(self) -> bool:
        """True when nothing but the runtime references this memory."""
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
        static_inputs: Sequence[tuple[int, int, int]],
        copied_inputs: Sequence[int],
        input_buffers: Sequence[torch.Tensor],
        captured_outputs: Any,
        path_blocks: Mapping[int, OutputBlock] | None = None,
        consumed_inputs: frozenset[int] = frozenset(),
    ) -> None:
        """``static_inputs``: (input index, address, storage address) at capture of every
        tensor input that is not copied: parameters and buffers, and outputs of earlier
        graphs on the tree path, whose blocks ``path_blocks`` holds by address.
        ``consumed_inputs``: storage addresses of inputs that the capture freed after their
        last use; what lies there now is the capture's own allocation."""
        self.graph = graph
        self.static_input_ptrs = tuple((i, ptr) for i, ptr, _ in static_inputs)
        # The same, as torch's C++ check wants them (a model has hundreds of parameters).
        self._static_indices = [i for i, _ in self.static_input_ptrs]
        self._ptr_by_index: list[int | None] = [None] * (max(self._static_indices, default=-1) + 1)
        for i, ptr in self.static_input_ptrs:
            self._ptr_by_index[i] = ptr
        self.copied_inputs = tuple(copied_inputs)
        self.input_buffers = list(input_buffers)
        # Copy targets: the static buffers, narrowed where an input is expanded (stride 0),
        # so that a copy never writes one memory location twice.
        self._copy_targets = [writable_view(buffer) for buffer in self.input_buffers]
        self._expanded = [t is not b for t, b in zip(self._copy_targets, self.input_buffers)]
        self._copy_inputs = _input_copier(self.copied_inputs, self._copy_targets, self._expanded)
        self._output_is_tuple = isinstance(captured_outputs, tuple)
        outputs = (
            captured_outputs if isinstance(captured_outputs, (tuple, list)) else [captured_outputs]
        )
        input_storages = {storage_ptr for _, _, storage_ptr in static_inputs} - consumed_inputs
        self._layouts, self._constants, self.blocks = _output_layouts(
            outputs, input_storages, path_blocks or {}
        )
        # Every block this recording builds aliases over, with how many: its references.
        self._alias_counts: dict[OutputBlock, int] = {}
        for layout in self._layouts:
            if layout is not None:
                self._alias_counts[layout[0]] = self._alias_counts.get(layout[0], 0) + 1
        for block, count in self._alias_counts.items():
            block.aliased_by.append(self)
            block.own_refs += count
        self.rebuild_aliases()

    def rebuild_aliases(self) -> None:
        """Build what each replay's outputs are made from over the blocks' current storages,
        and specialise the builder once."""
        self._output_aliases = [
            tensor_over(layout[0].storage, *layout[1:]) if layout is not None else constant
            for layout, constant in zip(self._layouts, self._constants)
        ]
        self._output_factories = [_output_factory(out) for out in self._output_aliases]
        self._build_outputs = _outputs_builder(self._output_factories, self._output_is_tuple)

    def release(self) -> None:
        """This recording is dropped: its aliases no longer count as the runtime's
        references to any block (earlier graphs' blocks live on), and the reference cycles
        between it and the blocks are broken, so that its graph is destroyed now."""
        for block, count in self._alias_counts.items():
            block.aliased_by.remove(self)
            block.own_refs -= count
        self._alias_counts = {}
        self._output_aliases = []
        self._output_factories = []
        self._build_outputs = _released

    def static_inputs_match(self, args: Sequence[Any]) -> bool:
        """True when every non-copied input still has its address at capture."""
        if _data_ptrs_at_indices_equal is not None and self.static_input_ptrs:
            return _data_ptrs_at_indices_equal(args, self._ptr_by_index, self._static_indices)
        for index, ptr in self.static_input_ptrs:
            if args[index].data_ptr() != ptr:
                return False
        return True

    def replay(self, args: list[Any]) -> Any:
        self._copy_inputs(args)
        args.clear()
        self.graph.replay()
        return self._build_outputs()

    def outputs(self) -> Any:
        """New tensor objects over the output memory (see ``_outputs_builder``)."""
        return self._build_outputs()


def _output_layouts(
    outputs: Sequence[Any],
    input_storages: set[int],
    path_blocks: Mapping[int, OutputBlock],
) -> tuple[list[Layout | None], list[Any], list[OutputBlock]]:
    """Where each captured output lies, and the blocks of memory the capture allocated.

    An output in the memory of a static input is either in an earlier graph's block (it is
    rebuilt over that block's storage, so that holding it counts as a use of that memory) or
    in a parameter or buffer (kept as a constant alias). Any other output lies in memory the
    capture allocated (its input buffers included: a forward returns its input batch, saved
    for the backward). Non-tensor outputs (None, sizes) are constants.
    Returns (layout or None, constant or None) per output, and the new blocks.
    """
    layouts: list[Layout | None] = []
    constants: list[Any] = []
    blocks: dict[int, OutputBlock] = {}
    for out in outputs:
        if not isinstance(out, torch.Tensor):
            layouts.append(None)
            constants.append(out)
            continue
        storage = out.untyped_storage()
        address = storage.data_ptr()
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
    return layouts, constants, list(blocks.values())


class InputBuffers:
    """Places a capture's copied inputs in its pool: the static buffers replays copy into.

    Called inside the capture, before the captured callable (``GraphBackend.capture``): each
    copied input in ``args`` is replaced by a new tensor of its layout, allocated where the
    capture allocates. The graph then owns that memory like its scratch: the captured code
    frees it after its last use, unless an output keeps it (a forward returns its input
    batch, saved for the backward; the backward may consume it). ``views`` are tensors over
    the buffers that do not keep them allocated, in the order of ``indices``.

    ``copy_values``: a real capture executes nothing (a copy would be captured into the
    graph); the CPU emulator's runs the callable, which must not read garbage.
    """

    def __init__(self, indices: Sequence[int], copy_values: bool) -> None:
        self.indices = indices
        self.copy_values = copy_values
        self.views: list[torch.Tensor] = []

    def __call__(self, args: list[Any]) -> None:
        for i in self.indices:
            arg = args[i]
            buffer = torch.empty_strided(
                arg.size(), arg.stride(), dtype=arg.dtype, device=arg.device
            )
            if self.copy_values:
                writable_view(buffer).copy_(writable_view(arg))
            self.views.append(alias_over(buffer, unowned(buffer.untyped_storage())))
            args[i] = buffer


def _output_factory(alias: Any) -> Callable[[], Any]:
    """A function returning a new object equal to ``alias`` for each replay."""
    if not isinstance(alias, torch.Tensor):
        return lambda: alias  # None, ints (sizes) and other constants of this recording
    # ~0.4 µs per output, against ~2.6 µs for empty(0).set_(storage, ...). Each replay's
    # outputs are distinct objects, so autograd metadata attached to one never leaks into
    # another.
    return alias.detach


# The two per-replay steps are specialised once, at record time, for what the graph has:
# most graphs have zero or one copied input and one output, and a replay of ``x + 1`` is
# dominated by this Python (measured by benchmarks/replay_path.py).


def _input_copier(
    indices: tuple[int, ...], targets: list[torch.Tensor], expanded: list[bool]
) -> Callable[[Sequence[Any]], Any]:
    if not indices:
        return _no_inputs_to_copy
    if len(indices) == 1 and not expanded[0]:
        (index,), (target,) = indices, targets
        return lambda args: target.copy_(args[index])
    if not any(expanded):
        return lambda args: torch._foreach_copy_(targets, [args[i] for i in indices])

    def copy_expanded(args: Sequence[Any]) -> None:
        sources = [
            writable_view(args[i]) if is_expanded else args[i]
            for i, is_expanded in zip(indices, expanded)
        ]
        torch._foreach_copy_(targets, sources)  # one batched launch for all inputs

    return copy_expanded


def _no_inputs_to_copy(args: Sequence[Any]) -> None:
    pass


def _released() -> Any:
    raise RuntimeError("inductor_xpugraph internal error: replay of a dropped recording")


def _outputs_builder(
    factories: list[Callable[[], Any]], as_tuple: bool
) -> Callable[[], tuple[Any, ...] | list[Any]]:
    if as_tuple and len(factories) == 1:
        (make,) = factories
        return lambda: (make(),)
    if as_tuple:
        return lambda: tuple([make() for make in factories])
    return lambda: [make() for make in factories]


def writable_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` narrowed to one element along each expanded (stride 0) dimension."""
    for dim, (size, stride) in enumerate(zip(t.size(), t.stride())):
        if stride == 0 and size > 1:
            t = t.narrow(dim, 0, 1)
    return t
