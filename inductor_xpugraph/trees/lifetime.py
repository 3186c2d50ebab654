"""What keeps the recordings of a graphed callable alive, and what lets them go.

Note [What keeps a graph alive]
-------------------------------
The recordings of a callable (graphs, output memory in the pool) live in the device tree, and
the tree drops them when the compiled graph that runs the callable is freed. Inductor keeps
every generated wrapper module for the life of the process (``PyCodeCache``,
``sys.modules``), so the module cannot be what keeps them: its compiled graph
(``CompiledFxGraph``) is, and when that is freed it deletes the module's
``runner.partitions`` (``CompiledFxGraph.__del__``). Graphed partitions are that list's
items, so they are freed with it. A graphed ``call``, which the module itself holds, puts a
``ReleaseHandle`` there instead (in a module generated without partitions, a
``PartitionlessRunner`` is that ``runner``); when it is freed, the module gets back the
names Inductor bound. Either way the tree forgets the callable (``GraphTree.forget_callable``)
and drops its nodes at its next generation or slow path, never inside a capture. A compiled
graph is freed when nothing runs it any more: the model's compiled code deleted,
``torch._dynamo.reset()`` (which drops Dynamo's caches), a loaded artifact released.
"""

from __future__ import annotations

from typing import Any

from .per_thread import all_trees


class ReleaseHandle:
    """Held where Inductor frees it with the compiled graph; see
    ``GraphedCallable.release_handle``."""

    __slots__ = ("__weakref__",)


class PartitionlessRunner:
    """Stands in for Inductor's ``Runner`` in a module generated without graph partitions
    (``graph_partition`` off): ``CompiledFxGraph`` keeps the module's ``runner`` and deletes
    its ``partitions`` when it is freed."""

    recursively_apply_fns = None  # read by CompiledFxGraph; only partitions have any

    def __init__(self, *partitions: Any) -> None:
        self.partitions = list(partitions)


def release(graphed: Any, module_globals: dict[str, Any]) -> None:
    """The compiled graph of ``graphed`` (a module's ``call``) was freed."""
    forget_callable(graphed.id)
    if module_globals.get("call") is graphed:
        module_globals["call"] = graphed.fn
    if isinstance(module_globals.get("runner"), PartitionlessRunner):
        del module_globals["runner"]


def forget_callable(callable_id: int) -> None:
    for tree in all_trees():
        tree.forget_callable(callable_id)
