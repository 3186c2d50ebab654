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

After each capture the strategy checks that the pool holds exactly the pool path's live
outputs; anything else (an output that is not pool memory, a capture that kept an allocation)
makes the rest of that generation run un-graphed and the tree start again from the next one
with ``OwnedOutputs``, with a warning (``GraphTree._fall_back_to_owned_outputs``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import config

if TYPE_CHECKING:
    from .backends import GraphBackend
    from .tree import GraphNode


class OwnedOutputs:
    """Each node owns its outputs for its whole life (portable; needs no allocator support)."""

    name = "owned_outputs"

    def prepare_capture(self, parent: GraphNode, pool: Any) -> None:
        pass

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
        # Outputs freed as dead for the capture being prepared.
        self._freed_for_capture: list[tuple[GraphNode, int]] = []

    def prepare_capture(self, parent: GraphNode, pool: Any) -> None:
        """Allocate exactly the live outputs of root..parent; free everything else."""
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
        self._freed_for_capture = []
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


def memory_strategy(backend: GraphBackend) -> OwnedOutputs | CheckpointedPool:
    if config.allocator_checkpointing and backend.supports_pool_checkpoints:
        return CheckpointedPool(backend)
    return OwnedOutputs()
