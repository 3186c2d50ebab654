"""The capture streams of the device backends, and whether a stream is being captured.

Warmups and captures run on a stream of their own per device and thread
(``DeviceGraphBackend.on_capture_stream``), kept for the process and shared by the trees that
follow one another across resets: libraries keep per-stream state (cuBLAS a workspace per
thread and stream) that a new stream would add to. On xpu a "new" stream is one of the same 32
queues per priority handed out round-robin (c10/xpu/XPUStream.cpp), so a queue someone else
is recording into can come back: a stream made after a failed capture is never one that
records (``capture_stream(..., fresh=True)``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

_capture_streams: dict[tuple[str, int, int], Any] = {}


def is_capturing_on(module: ModuleType, device_index: int) -> Callable[[], bool]:
    """``() -> bool``: whether the current stream *of this device* is being captured. The
    device module's own call asks of the current device, which the caller may have set to
    another one; with one device they are the same, and its call is bound as it is."""
    if module.device_count() <= 1:
        return module.is_current_stream_capturing

    def is_capturing() -> bool:
        if module.current_device() == device_index:
            return bool(module.is_current_stream_capturing())
        with module.device(device_index):
            return bool(module.is_current_stream_capturing())

    return is_capturing


def stream_records(module: ModuleType, stream: Any) -> bool:
    """Whether ``stream`` is being captured (its queue records)."""
    with module.stream(stream):
        return bool(module.is_current_stream_capturing())


def capture_stream(module: ModuleType, device_index: int, fresh: bool = False) -> Any:
    """This thread's capture stream on the device (``fresh``: a new one from now on, never
    one whose queue records: xpu hands out the same 32 queues of a pool round-robin)."""
    key = (module.__name__, device_index, threading.get_ident())
    if fresh or key not in _capture_streams:
        stream = module.Stream(device=device_index)
        for _ in range(STREAMS_TRIED if fresh else 0):
            if not stream_records(module, stream):
                break
            stream = module.Stream(device=device_index)
        _capture_streams[key] = stream
    return _capture_streams[key]


def forget_capture_streams(module: ModuleType) -> None:
    """Drop every thread's capture stream of ``module`` (a stand-in device going away)."""
    for key in [key for key in _capture_streams if key[0] == module.__name__]:
        del _capture_streams[key]


# Streams a fresh capture stream is looked for among (one xpu pool and one more).
STREAMS_TRIED = 33
