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
is safe because two siblings never run in one generation. Within a path this is as
conservative as ``OwnedOutputs``: outputs stay allocated until the generation ends, so a
replay never needs upstream's liveness checks.

After each capture the strategy checks that the pool holds exactly the pool path's outputs;
anything else (an output that is not pool memory, a capture that kept an allocation) makes
the tree fall back to ``OwnedOutputs`` for good, with a warning.
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
        # Nodes, root first, whose outputs are allocated in the pool (their recordings hold
        # the owning storages); every other node's outputs are unowned.
        self.pool_path: list[GraphNode] = []
        # The allocator's bookkeeping of the pool right after each node's capture.
        self.checkpoints: dict[GraphNode, Any] = {}

    def prepare_capture(self, parent: GraphNode, pool: Any) -> None:
        target = parent.path_from_root()
        shared = 0
        for held, wanted in zip(self.pool_path, target):
            if held is not wanted:
                break
            shared += 1
        for node in self.pool_path[shared:]:
            self._release(node)
        joining = target[shared:]
        if joining:
            owners = {node: node.recording.new_unowned_output_storages() for node in joining}
            all_owners = [storage for storages in owners.values() for storage in storages]
            self.backend.restore_pool(pool, self.checkpoints[target[-1]], all_owners)
            for node, storages in owners.items():
                node.recording.output_owners = storages
        self.pool_path = target

    def adopt(self, node: GraphNode, pool: Any) -> bool:
        recording = node.recording
        expected = [s for held in self.pool_path for s in held.recording.output_owners]
        expected += recording.output_storages
        if not self.backend.pool_holds_exactly(pool, expected):
            return False
        recording.output_owners = recording.take_output_ownership()
        self.checkpoints[node] = self.backend.checkpoint_pool(pool)
        self.pool_path.append(node)
        return True

    def forget(self, nodes: list[GraphNode]) -> None:
        dropped = set(nodes)
        for index, node in enumerate(self.pool_path):
            if node in dropped:
                for leaving in self.pool_path[index:]:
                    self._release(leaving)
                del self.pool_path[index:]
                break
        for node in nodes:
            self.checkpoints.pop(node, None)

    def held_bytes(self, nodes: list[GraphNode]) -> int:
        return sum(node.recording.output_bytes() for node in self.pool_path)

    def _release(self, node: GraphNode) -> None:
        self.backend.free_storages(node.recording.output_owners)
        node.recording.output_owners = []


def memory_strategy(backend: GraphBackend) -> OwnedOutputs | CheckpointedPool:
    if config.allocator_checkpointing and backend.supports_pool_checkpoints:
        return CheckpointedPool(backend)
    return OwnedOutputs()
