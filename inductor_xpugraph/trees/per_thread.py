"""Which tree a call uses: one per thread and device, as upstream's.

Two threads serving the same compiled model never invalidate each other's outputs or share
static buffers. Autograd runs a backward on a thread of its own, so each thread's table of
trees is stashed in torch's TLS, which autograd propagates to the thread that runs the
backward: the backward finds the tree of the thread that ran its forward. One autograd
device thread runs the backwards of every thread that trains on the device, each under its
caller's TLS, so there the table is read from the TLS at every call and never remembered;
``_local`` caches only a table a thread made for itself outside a backward (the fast path:
one attribute read).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from .tree import GraphTree

_TLS_KEY = "inductor_xpugraph_trees"
_local = threading.local()
_registry: weakref.WeakSet[GraphTree] = weakref.WeakSet()
_registry_lock = threading.Lock()


def thread_trees() -> dict[str, GraphTree]:
    """This thread's trees by device: its own, or in a backward the caller's."""
    trees = getattr(_local, "trees", None)
    if trees is not None:
        return trees
    if torch._C._is_key_in_tls(_TLS_KEY):
        return torch._C._get_obj_in_tls(_TLS_KEY)  # a caller's, propagated: not ours to keep
    trees = {}
    torch._C._stash_obj_in_tls(_TLS_KEY, trees)
    if torch._C._current_graph_task_id() == -1:  # not inside a backward
        _local.trees = trees
    return trees


def tree_for(device: str) -> GraphTree:
    """This thread's tree of ``device``, made on first use."""
    trees = thread_trees()
    tree = trees.get(device)
    if tree is None:
        tree = trees[device] = GraphTree(device)
        with _registry_lock:
            _registry.add(tree)
    return tree


def all_trees() -> list[GraphTree]:
    """Every live tree, of every thread."""
    with _registry_lock:
        return list(_registry)


class WrittenLater(threading.local):
    """Per thread, while a partitioned graph's ``call`` runs: its first partition, and the
    inputs its later partitions write (``trees.keep_state_written_later``). Per thread, as
    two threads may run one compiled graph at once."""

    first_partition: Any = None
    tensors: Sequence[torch.Tensor] = ()

    def told(self, partition: Any) -> Sequence[torch.Tensor]:
        """What ``partition`` is told, if it is the first partition of the call in progress."""
        return self.tensors if self.first_partition is partition else ()


written_later = WrittenLater()
