"""One captured graph of one compiled callable, and its replay fast path.

A ``Recording`` is made once, at record time, and then only replays. Everything that can be
decided once is decided in ``__init__``: which inputs are copied and into which static
buffers, which static inputs must keep their address, and how each output is rebuilt. A
replay is then: compare static-input addresses, one batched copy of the other inputs, one
graph launch, and one cheap tensor per output aliasing the graph's memory.

Output memory: ``output_storages`` are the storages the capture allocated for the outputs;
each replay hands out fresh tensor objects over them, and like upstream's trees the next
replay overwrites their contents. ``output_owners`` holds whatever keeps that memory
allocated: the storages themselves for as long as the recording exists ("owned outputs"), or,
under allocator checkpointing, owners that the tree frees and re-creates (``memory``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .backends import Graph

# torch's C++ loop over input addresses (CUDA builds); elsewhere the Python loop.
_data_ptrs_at_indices_equal = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)


class Recording:
    def __init__(
        self,
        graph: Graph,
        *,
        static_inputs: Sequence[tuple[int, int, int]],
        copied_inputs: Sequence[int],
        input_buffers: Sequence[torch.Tensor],
        captured_outputs: Any,
        path_storages: Mapping[int, torch.UntypedStorage] | None = None,
        consumed_inputs: frozenset[int] = frozenset(),
    ) -> None:
        """``static_inputs``: (input index, address, storage address) at capture of every
        tensor input that is not copied: parameters and buffers, and outputs of earlier
        graphs on the tree path, whose storages ``path_storages`` holds by address.
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
        # The recording holds its own aliases, never the captured objects: an output may be a
        # caller's tensor (an input returned as is), which can later be invalidated as stale.
        # An output in the memory of an earlier graph's output is rebuilt over that output's
        # storage, so that it counts as a use of it (the capture may have seen a lent owner).
        input_storages = {storage_ptr for _, _, storage_ptr in static_inputs} - consumed_inputs
        path_inputs = {
            ptr: storage for ptr, storage in (path_storages or {}).items() if ptr in input_storages
        }
        self._set_output_aliases([_alias(out, path_inputs) for out in outputs])
        # Memory the capture allocated for the outputs (input buffers included: a forward
        # returns its input batch, saved for the backward), not that of a static input.
        self.output_storages = [
            s for s in _unique_storages(outputs) if s.data_ptr() not in input_storages
        ]
        # Per output storage: what keeps it allocated (None: nothing, see trees.memory).
        self.output_owners: list[torch.UntypedStorage | None] = []
        # Per output storage: the references this recording itself holds to it.
        self.output_own_refs: list[int] = []

    def _set_output_aliases(self, aliases: list[Any]) -> None:
        """What each replay's outputs are built from, and the builder, specialised once."""
        self._output_aliases = aliases
        self._output_factories = [_output_factory(out) for out in aliases]
        self._build_outputs = _outputs_builder(self._output_factories, self._output_is_tuple)

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

    def take_output_ownership(self) -> list[torch.UntypedStorage]:
        """Rebuild the outputs over unowned storages of the same memory; return the owners.

        Afterwards nothing in this recording keeps its output memory allocated: the caller
        holds the returned storages for as long as the memory must stay allocated.
        """
        owners = self.output_storages
        unowned = {s.data_ptr(): _unowned(s) for s in owners}
        self._set_output_aliases(
            [
                _alias_over(alias, unowned[alias.untyped_storage().data_ptr()])
                if isinstance(alias, torch.Tensor) and alias.untyped_storage().data_ptr() in unowned
                else alias
                for alias in self._output_aliases
            ]
        )
        self.output_storages = list(unowned.values())
        # Our references to each storage: the storage object and each alias over it.
        self.output_own_refs = [
            torch._C._storage_Use_Count(storage._cdata) for storage in self.output_storages
        ]
        return list(owners)

    def output_is_dead(self, index: int) -> bool:
        """True when nothing but this recording references output storage ``index``."""
        storage = self.output_storages[index]
        return torch._C._storage_Use_Count(storage._cdata) == self.output_own_refs[index]

    def new_unowned_output_storage(self, index: int) -> torch.UntypedStorage:
        """A fresh unowned storage over output memory ``index`` (to be made its owner)."""
        return _unowned(self.output_storages[index])


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
            self.views.append(_alias_over(buffer, _unowned(buffer.untyped_storage())))
            args[i] = buffer


def _alias(output: Any, path_storages: Mapping[int, torch.UntypedStorage]) -> Any:
    if not isinstance(output, torch.Tensor):
        return output
    storage = path_storages.get(output.untyped_storage().data_ptr())
    if storage is not None:
        return _alias_over(output, storage)
    # detach(): a new tensor over the same storage, offset, sizes and strides, with no
    # autograd history and not an autograd view.
    return output.detach()


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


def _outputs_builder(
    factories: list[Callable[[], Any]], as_tuple: bool
) -> Callable[[], tuple[Any, ...] | list[Any]]:
    if as_tuple and len(factories) == 1:
        (make,) = factories
        return lambda: (make(),)
    if as_tuple:
        return lambda: tuple([make() for make in factories])
    return lambda: [make() for make in factories]


def _unowned(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """A storage over the same memory that does not free it when it dies."""
    return torch._C._construct_storage_from_data_pointer(
        storage.data_ptr(), storage.device, storage.nbytes()
    )


def tensor_over(storage: torch.UntypedStorage, offset, size, stride, dtype) -> torch.Tensor:
    """A new tensor over ``storage`` with this layout."""
    return torch.empty((0,), dtype=dtype, device=storage.device).set_(storage, offset, size, stride)


def _alias_over(t: torch.Tensor, storage: torch.UntypedStorage) -> torch.Tensor:
    return tensor_over(storage, t.storage_offset(), t.size(), t.stride(), t.dtype)


def writable_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` narrowed to one element along each expanded (stride 0) dimension."""
    for dim, (size, stride) in enumerate(zip(t.size(), t.stride())):
        if stride == 0 and size > 1:
            t = t.narrow(dim, 0, 1)
    return t


def _unique_storages(tensors: Sequence[Any]) -> list[torch.UntypedStorage]:
    seen: dict[int, torch.UntypedStorage] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            seen.setdefault(storage.data_ptr(), storage)
    return list(seen.values())
