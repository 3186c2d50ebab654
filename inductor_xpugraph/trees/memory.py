"""Which graph outputs hold memory in a device's pool, and how a new capture finds room.

Every node of a tree captures into one pool. Its captured outputs are pool memory that later
replays write again; a new capture must never be placed over the outputs of the nodes that run
before it in a generation (its ancestors), or a replay of the path would overwrite them. The
runtime's safety argument (``tree``) needs exactly that, and nothing more: a node's outputs
are only valid in a generation whose path runs through it, and older generations' outputs are
invalidated. Two strategies give it:

``OwnedOutputs`` (portable, the only one on xpu; cuda with
``config.allocator_checkpointing=False``): every node keeps its output storages allocated for
as long as it exists. The allocator's view of the pool is then always true, no allocator
support is needed, and a capture can only use memory no node holds. Cost: outputs of sibling
branches (another shape, eval after train, another graph-break path) never share memory.

``CheckpointedPool`` (cuda, default there): only the nodes of one path, the *pool path*, own
their output memory; outputs of other nodes are unowned storages over memory the allocator
sees as free. Before a capture below node N, the pool path moves to root..N: owners of nodes
leaving it are freed, and the allocator's bookkeeping is restored to the checkpoint taken
right after N's own capture (``_cuda_setCheckpointPoolState``), which re-allocates the
outputs of the nodes joining it, with fresh owners. Siblings therefore share memory, which
is safe because two siblings never run in one generation. Within a path, outputs of the step
that nothing references any more when a node is captured (the logits, once the loss is
computed) are freed first, so the capture may reuse their memory; that node then replays only
while those outputs are still unreferenced (``GraphNode.reused_outputs``, checked before each
replay). If one is alive, the rest of the generation runs un-graphed
(``stats()["liveness_fallbacks"]``).

Inputs a capture consumes: a backward receives the forward's saved activations (outputs of
its path) and drops each after its last use; without graphs, and in upstream's trees, that
memory then serves the rest of the backward. When nothing but the call's arguments references
such an output, the strategy *lends* its owner to the capture (``lend_inputs``): the capture
receives tensors over the owning storage, and the strategy lets go of it, so the block returns
to the pool exactly when the captured code drops it. An owner that dies during the capture is
an output the node reused (its replay drops the caller's references first, then checks they
were the last: ``GraphNode.release_reused_memory``); one that survives is owned again.

After each capture the strategy checks that the pool holds exactly the pool path's live
outputs; anything else (an output that is not pool memory, a capture that kept an allocation)
makes the rest of that generation run un-graphed and the tree start again from the next one
with ``OwnedOutputs``, with a warning (``GraphTree._fall_back_to_owned_outputs``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .. import config

if TYPE_CHECKING:
    from .backends import GraphBackend
    from .tree import GraphNode


class OwnedOutputs:
    """Each node owns its outputs for its whole life (portable; needs no allocator support)."""

    name = "owned_outputs"

    def prepare_capture(self, parent: GraphNode, pool: Any) -> None:
        pass

    def lend_inputs(self, args: list[Any]) -> None:
        pass  # an owner never lets go: every output stays allocated while its node exists

    def settle_loans(self) -> frozenset[int]:
        return frozenset()

    def adopt(self, node: GraphNode, pool: Any) -> bool:
        node.recording.output_owners = list(node.recording.output_storages)
        return True

    def forget(self, nodes: list[GraphNode]) -> None:
        pass  # the owners die with the nodes

    def held_bytes(self, nodes: list[GraphNode]) -> int:
        return sum(node.recording.output_bytes() for node in nodes)


class CheckpointedPool:
    """Only the pool path owns memory; the allocator is restored to a checkpoint to move it."""

    name = "allocator_checkpointing"

    def __init__(self, backend: GraphBackend) -> None:
        self.backend = backend
        # Nodes, root first, whose live outputs are allocated in the pool: their recordings'
        # ``output_owners`` hold an owning storage per output (None once freed as dead).
        # Every other node's outputs are unowned.
        self.pool_path: list[GraphNode] = []
        # The allocator's bookkeeping of the pool right after each node's capture, and which
        # outputs, as (node, output index), it has allocated.
        self.checkpoints: dict[GraphNode, Any] = {}
        self.allocated_at: dict[GraphNode, frozenset[tuple[GraphNode, int]]] = {}
        # Outputs freed as dead for the capture being prepared, or by it (loans that died).
        self._freed_for_capture: list[tuple[GraphNode, int]] = []
        # Owners lent to the capture in progress: (node, output index, weak reference).
        self._loans: list[tuple[GraphNode, int, StorageWeakRef]] = []
        # Arguments of the capture that were lent outputs which it consumed, with the layout
        # to rebuild them: (argument index, output storage, offset, size, stride, dtype).
        self._consumed_args: list[tuple[Any, ...]] = []

    def prepare_capture(self, parent: GraphNode, pool: Any) -> None:
        """Allocate exactly the live outputs of root..parent; free everything else."""
        self._loans, self._consumed_args = [], []
        wanted = self.allocated_at.get(parent, frozenset())
        held = set(self._held())
        for node, index in held - wanted:
            self._free(node, index)
        missing = _in_capture_order(wanted - held)
        if missing:
            owners = [node.recording.new_unowned_output_storage(index) for node, index in missing]
            self.backend.restore_pool(pool, self.checkpoints[parent], owners)
            for (node, index), owner in zip(missing, owners):
                node.recording.output_owners[index] = owner
        self.pool_path = parent.path_from_root()
        # Outputs of this step that nothing references any more: the capture may reuse
        # their memory. The new node records them; it replays only while they stay dead.
        self._freed_for_capture = [
            (node, index)
            for node, index in _in_capture_order(wanted)
            if node.recording.output_is_dead(index)
        ]
        for node, index in self._freed_for_capture:
            self._free(node, index)

    def lend_inputs(self, args: list[Any]) -> None:
        """Hand the capture the owners of path outputs that only ``args`` reference.

        Each such argument is replaced by a tensor over its output's owning storage, and the
        strategy drops its own reference: the memory is freed when the captured code drops
        the argument. The caller must hold no other reference to ``args``' tensors.
        """
        held_by_ptr = {
            node.recording.output_storages[index].data_ptr(): (node, index)
            for node, index in self._held()
        }
        # Taken out of ``args``: our references must not count as uses.
        layouts = _take_arguments_in(held_by_ptr, args)
        for (node, index), arg_layouts in layouts.items():
            recording = node.recording
            lend = recording.output_is_dead(index)
            storage = recording.output_owners[index] if lend else recording.output_storages[index]
            for arg_index, *layout in arg_layouts:
                args[arg_index] = _tensor_over(storage, *layout)
            if lend:
                self._loans.append((node, index, StorageWeakRef(storage)))
                recording.output_owners[index] = None
                self._consumed_args.extend(
                    (arg_index, recording.output_storages[index], *layout)
                    for arg_index, *layout in arg_layouts
                )

    def settle_loans(self) -> frozenset[int]:
        """After the capture: an owner it dropped was reused, one still alive is ours again.

        Returns the addresses of the outputs it consumed: the capture may have put its own
        allocations (its outputs among them) there.
        """
        consumed = set()
        for node, index, loan in self._loans:
            owner = torch.UntypedStorage._new_with_weak_ptr(loan.cdata)
            if owner is None:
                self._freed_for_capture.append((node, index))
                consumed.add(node.recording.output_storages[index].data_ptr())
            else:
                node.recording.output_owners[index] = owner
        self._loans = []
        self._consumed_args = [
            entry for entry in self._consumed_args if entry[1].data_ptr() in consumed
        ]
        return frozenset(consumed)

    def adopt(self, node: GraphNode, pool: Any) -> bool:
        recording = node.recording
        held = self._held()
        expected = [n.recording.output_owners[i] for n, i in held] + recording.output_storages
        if not self.backend.pool_holds_exactly(pool, expected):
            return False
        recording.output_owners = recording.take_output_ownership()
        self.checkpoints[node] = self.backend.checkpoint_pool(pool)
        outputs = {(node, index) for index in range(len(recording.output_storages))}
        self.allocated_at[node] = frozenset(held) | outputs
        node.reused_outputs = tuple(
            (n.recording.output_storages[i], n.recording.output_own_refs[i])
            for n, i in self._freed_for_capture
        )
        node.consumed_inputs = tuple(self._consumed_args)
        self._freed_for_capture = []
        self._consumed_args = []
        self.pool_path.append(node)
        return True

    def forget(self, nodes: list[GraphNode]) -> None:
        dropped = set(nodes)
        for index, node in enumerate(self.pool_path):
            if node in dropped:
                for leaving in self.pool_path[index:]:
                    for output_index in range(len(leaving.recording.output_owners)):
                        self._free(leaving, output_index)
                del self.pool_path[index:]
                break
        for node in nodes:
            self.checkpoints.pop(node, None)
            self.allocated_at.pop(node, None)

    def held_bytes(self, nodes: list[GraphNode]) -> int:
        return sum(
            owner.nbytes()
            for node in self.pool_path
            for owner in node.recording.output_owners
            if owner is not None
        )

    def _held(self) -> list[tuple[GraphNode, int]]:
        """The outputs, as (node, output index), that own pool memory now."""
        return [
            (node, index)
            for node in self.pool_path
            for index, owner in enumerate(node.recording.output_owners)
            if owner is not None
        ]

    def _free(self, node: GraphNode, index: int) -> None:
        owner = node.recording.output_owners[index]
        if owner is not None:
            self.backend.free_storages([owner])
            node.recording.output_owners[index] = None


def _in_capture_order(outputs) -> list[tuple[GraphNode, int]]:
    return sorted(outputs, key=lambda output: (output[0].seq, output[1]))


def _take_arguments_in(outputs_by_ptr: dict[int, Any], args: list[Any]) -> dict[Any, list]:
    """Remove the tensors of ``args`` in the memory of these outputs; return their layouts
    (argument index, offset, size, stride, dtype), by output."""
    layouts: dict[Any, list[tuple[Any, ...]]] = {}
    for arg_index, arg in enumerate(args):
        if isinstance(arg, torch.Tensor):
            output = outputs_by_ptr.get(arg.untyped_storage().data_ptr())
            if output is not None:
                layout = (arg_index, arg.storage_offset(), arg.size(), arg.stride(), arg.dtype)
                layouts.setdefault(output, []).append(layout)
                args[arg_index] = None
    return layouts


def _tensor_over(storage: torch.UntypedStorage, offset, size, stride, dtype) -> torch.Tensor:
    return torch.empty((0,), dtype=dtype, device=storage.device).set_(storage, offset, size, stride)


def memory_strategy(backend: GraphBackend) -> OwnedOutputs | CheckpointedPool:
    if config.allocator_checkpointing and backend.supports_pool_checkpoints:
        return CheckpointedPool(backend)
    return OwnedOutputs()
