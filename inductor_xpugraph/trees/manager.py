"""One ``GraphManager`` per device: its backend, its memory pool, its graphed callables.

Every callable graphed on a device records into the device's single pool, so graphs share
memory the way upstream's trees do. ``reset()`` drops every recording and starts a new pool.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from .backends import GraphBackend, backend_class


class GraphManager:
    def __init__(self, device: str) -> None:
        device_type, _, index = device.partition(":")
        self.device = device
        self.backend: GraphBackend = backend_class(device_type)(int(index or 0))
        self.callables: weakref.WeakSet[Any] = weakref.WeakSet()
        self._pool: Any = None

    @property
    def pool(self) -> Any:
        if self._pool is None:
            self._pool = self.backend.new_pool()
        return self._pool

    def reset(self) -> None:
        for graphed in list(self.callables):
            graphed.reset()
        self._pool = None

    def owned_bytes(self) -> int:
        return sum(
            recording.owned_bytes()
            for graphed in list(self.callables)
            for recording in graphed.recordings.values()
        )


_managers: dict[str, GraphManager] = {}
_managers_lock = threading.Lock()


def manager_for(device: str) -> GraphManager:
    manager = _managers.get(device)
    if manager is None:
        with _managers_lock:
            manager = _managers.get(device)
            if manager is None:
                manager = _managers[device] = GraphManager(device)
    return manager


def all_managers() -> list[GraphManager]:
    return list(_managers.values())
