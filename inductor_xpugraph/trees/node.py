"""A node of a graph tree: one recording of one callable at one place in the tree.

Its own module so that the tree (``tree``) and the memory strategies (``memory``), which both
read and write nodes, import it and not each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import torch

if TYPE_CHECKING:
    from .recording import OutputBlock, Recording


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
        from .recording import tensor_over

        return tensor_over(self.block.storage, self.offset, self.size, self.stride, self.dtype)


class GraphNode:
    """One recording of one callable at one place of the tree."""

    __slots__ = (
        "callable_id",
        "name",
        "phase",
        "parent",
        "children",
        "recording",
        "seq",
        "reused_outputs",
        "consumed_inputs",
    )

    def __init__(
        self,
        callable_id: int,
        name: str,
        phase: str,
        parent: GraphNode | None,
        recording: Recording | None,
        seq: int,
    ) -> None:
        self.callable_id = callable_id
        self.name = name
        self.phase = phase
        self.parent = parent
        self.children: dict[tuple[int, tuple[int, ...]], GraphNode] = {}
        self.recording = recording
        self.seq = seq  # capture order: every descendant has a larger one
        # Output blocks of earlier nodes of the path whose memory this node's capture may
        # have reused: it replays only while nothing but the runtime references them.
        self.reused_outputs: tuple[OutputBlock, ...] = ()
        # Inputs that were such outputs and that the capture consumed.
        self.consumed_inputs: tuple[ConsumedInput, ...] = ()

    def release_reused_memory(self, args: list[Any]) -> bool:
        """Drop ``args``' references to consumed inputs, then check nothing else references
        memory this node's capture reused. When something does, ``args`` is rebuilt."""
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

    def subtree(self) -> list[GraphNode]:
        nodes, stack = [], [self]
        while stack:
            node = stack.pop()
            nodes.append(node)
            stack.extend(node.children.values())
        return nodes
