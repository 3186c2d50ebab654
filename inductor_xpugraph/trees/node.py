"""A node of a graph tree: one recording of one callable at one place in the tree.

Its own module so that the tree (``tree``) and the memory strategies (``memory``), which both
read and write nodes, import it and not each other.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from .storages import tensor_over

if TYPE_CHECKING:
    from .recording import OutputBlock, Recording


class Phase(str, enum.Enum):
    """What a compiled graph computes. A ``str`` so that generated code, reports and
    exported artifacts carry the plain name (``phase="forward"``)."""

    INFERENCE = "inference"
    FORWARD = "forward"  # a backward will follow: the generation stays open for it
    BACKWARD = "backward"  # gradients: handed over (copied) when held, never made stale

    def __str__(self) -> str:
        return self.value


class CallableIdentity(NamedTuple):
    """One graphed callable, as its nodes and handed-out outputs name it: the tree's key and,
    for messages and reports, its graph's name, phase and the user's source line."""

    id: int
    name: str  # e.g. "0_forward:call"
    phase: Phase
    source: str | None = None  # "path:line in function", when Inductor kept it
    # Outputs still referenced when a generation ends are copied out of the pool and stay
    # valid, instead of going stale (``RecordingSettings.clone_live_outputs``).
    clones_live_outputs: bool = False


class ConsumedInput(NamedTuple):
    """An argument of a capture that was an earlier output of the path, which the capture
    freed after its last use: each replay rebuilds it over the block's current storage."""

    index: int  # argument position
    block: OutputBlock
    offset: int
    size: torch.Size
    stride: tuple[int, ...]
    dtype: torch.dtype

    def tensor(self) -> torch.Tensor:
        return tensor_over(self.block.storage, self.offset, self.size, self.stride, self.dtype)


class GraphNode:
    """One recording of one callable at one place of the tree; or, with no recording, one of
    a tree's two markers (``GraphNode.marker``): the root every generation starts from, and
    where a generation that left the tree is."""

    __slots__ = (
        "callable_id",
        "name",
        "phase",
        "parent",
        "children",
        "other_variants",
        "recording",
        "seq",
        "reused_outputs",
        "consumed_inputs",
        "sizes",
        "source",
        "clones_live_outputs",
        "replays",
        "__weakref__",  # places a callable's policy counts moved inputs at
    )

    def __init__(
        self,
        identity: CallableIdentity | None,
        parent: GraphNode | None,
        recording: Recording | None,
        seq: int,
    ) -> None:
        # The identity's fields, read often (retiring, reports); None on a marker.
        self.callable_id = identity.id if identity else None
        self.name = identity.name if identity else ""
        self.phase = identity.phase if identity else None
        self.source = identity.source if identity else None
        self.clones_live_outputs = identity.clones_live_outputs if identity else False
        self.parent = parent
        # Per (callable id, sizes): the recording used last here (the replay fast path looks
        # it up), and the others, for other addresses of the static inputs, most recent first.
        self.children: dict[tuple[int, tuple[int, ...]], GraphNode] = {}
        self.other_variants: dict[tuple[int, tuple[int, ...]], list[GraphNode]] = {}
        self.recording = recording
        self.seq = seq  # capture order: every descendant has a larger one
        # Output blocks of earlier nodes of the path whose memory this node's capture may
        # have reused: it replays only while nothing but the runtime references them.
        self.reused_outputs: tuple[OutputBlock, ...] = ()
        # Inputs that were such outputs and that the capture consumed.
        self.consumed_inputs: tuple[ConsumedInput, ...] = ()
        # For reports: the integer inputs it was recorded for, and how often it replayed (its
        # recording's first run is not a replay).
        self.sizes: tuple[int, ...] = ()
        self.replays = 0

    @classmethod
    def marker(cls, name: str) -> GraphNode:
        """A node no callable has: no parent, no recording, no phase."""
        node = cls(None, None, None, 0)
        node.name = name
        return node

    def try_release_reused_memory(self, args: list[Any]) -> bool:
        """Make the memory this node's capture reused free for its replay, or fail whole.

        Drops ``args``' references to the consumed inputs, then checks that nothing else
        references that memory. When something does, returns False with ``args`` as they
        were: the replay would overwrite what that reference reads."""
        for consumed in self.consumed_inputs:
            args[consumed.index] = None
        for block in self.reused_outputs:
            if not block.is_dead():
                for consumed in self.consumed_inputs:
                    args[consumed.index] = consumed.tensor()
                return False
        return True

    def path_from_root(self) -> list[GraphNode]:
        path, node = [], self
        while node is not None and node.recording is not None:
            path.append(node)
            node = node.parent
        return path[::-1]

    def path_blocks(self) -> dict[int, OutputBlock]:
        """Memory of the outputs of the nodes on the path to this one (not copied as inputs),
        by address."""
        return {
            block.address: block
            for node in self.path_from_root()
            for block in node.recording.blocks
        }

    def child_nodes(self) -> list[GraphNode]:
        """Every child, each variant included."""
        return [
            *self.children.values(),
            *(n for group in self.other_variants.values() for n in group),
        ]

    def variants(self, key: tuple[int, tuple[int, ...]]) -> list[GraphNode]:
        """The recordings of one callable and sizes here, the one used last first."""
        current = self.children.get(key)
        return [current, *self.other_variants.get(key, ())] if current is not None else []

    def use_variant(self, key: tuple[int, tuple[int, ...]], node: GraphNode) -> None:
        """Make ``node`` (a new or existing variant for ``key``) the one used last."""
        self._set_variants(key, [node, *(v for v in self.variants(key) if v is not node)])

    def remove_child(self, node: GraphNode) -> None:
        keys = [k for k, v in self.children.items() if v is node]
        keys += [k for k, group in self.other_variants.items() if node in group]
        for key in keys:
            self._set_variants(key, [v for v in self.variants(key) if v is not node])

    def _set_variants(self, key: tuple[int, tuple[int, ...]], ordered: list[GraphNode]) -> None:
        """The variants for ``key``, the one used last first (none: the key goes)."""
        self.children.pop(key, None)
        self.other_variants.pop(key, None)
        if ordered:
            self.children[key] = ordered[0]
        if ordered[1:]:
            self.other_variants[key] = ordered[1:]

    def subtree(self) -> list[GraphNode]:
        nodes, stack = [], [self]
        while stack:
            node = stack.pop()
            nodes.append(node)
            stack.extend(node.child_nodes())
        return nodes


def unlink(nodes: list[GraphNode]) -> None:
    """Break the parent/children cycles of dropped nodes.

    Their graphs are then destroyed now, by reference counting, and never later by Python's
    cycle collector, which may run in the middle of a capture, where destroying a graph is
    not permitted and invalidates the capture.
    """
    for node in nodes:
        node.parent = None
        node.children = {}
        node.other_variants = {}
        node.recording.release()
