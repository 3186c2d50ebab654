"""What the scripted device modules of the backend tests share: a log, streams that write to it,
a default generator, and the caching allocator's view of private pools.

``tests/trees/backends/test_device_graph_backend.py`` scripts ``torch.cuda``/``torch.xpu``
(``DeviceGraphBackend``); ``tests/trees/backends/test_accelerator_graph_backend.py`` scripts
``torch.accelerator`` (``AcceleratorGraphBackend``). Their graphs differ, as torch's do; what
is here is the same in both.
"""

from __future__ import annotations


class ScriptedDeviceBase:
    """A log, the capture state and the allocator's view of pools: which pool a capture routes
    its allocations into, and how many holds each pool has (it is freed at 0)."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.capturing_on: ScriptedStream | None = None
        self.fail: str | None = None  # the next capture fails: "begin", "end", "instantiate"
        self.keep_failing = False  # ... and every capture after it
        self.generator_capturing = False  # the default generator's capture mode
        self.generator = ScriptedGenerator(self)
        self.routing: list[object] = []
        self.holds: dict[object, int] = {}

    def begin_allocate_to_pool(self, pool) -> None:
        self.routing.append(pool)
        self.holds[pool] = self.holds.get(pool, 0) + 1

    def end_allocate_to_pool(self, device_index: int, pool) -> None:
        if pool not in self.routing:
            raise RuntimeError("endAllocatePool: not currently recording to mempool_id")
        self.routing.remove(pool)

    def release_pool(self, device_index: int, pool) -> None:
        self.holds[pool] -= 1  # below the graphs that use it: freed while in use


class ScriptedStream:
    def __init__(self, owner: ScriptedDeviceBase, name: str, device=None) -> None:
        self.owner = owner
        self.name = name
        self.device = device
        self.device_index = 0 if device is None else device.index or 0

    def wait_stream(self, other: ScriptedStream) -> None:
        self.owner.log.append(f"{self.name} waits for {other.name}")

    def synchronize(self) -> None:
        self.owner.log.append(f"host waits for {self.name}")

    def is_capturing(self) -> bool:
        return self.owner.capturing_on is self


class ScriptedGenerator:
    """A default generator: ``clone_state`` gives a state outside capture mode, and
    ``graphsafe_set_state`` makes it the generator's (torch's generator states)."""

    def __init__(self, owner: ScriptedDeviceBase) -> None:
        self.owner = owner

    def clone_state(self) -> str:
        return "a cloned state"

    def graphsafe_set_state(self, state: str) -> None:
        self.owner.log.append(f"the generator takes {state}")
        self.owner.generator_capturing = False
