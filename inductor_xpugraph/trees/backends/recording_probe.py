"""Which mode torch's ``XPUGraph`` records with on a device, found by trying it once.

No property of torch's ``XPUGraph`` says whether it records through SYCL Graph's command
buffers or natively through Level Zero (``xpu_recording``), and where a build settles neither
(torch >= 2.14), the two modes answer a host wait inside a capture differently: SYCL's
``queue::wait`` refuses it on a queue that records to a command buffer with ``errc::invalid``,
"wait cannot be called for a queue which is recording to a command graph." (SYCL's own check,
made only when the queue records to a command buffer); under native recording that check does
not apply and the wait reaches Level Zero (``urQueueFinish``), whose refusal comes back as
``errc::runtime``, "<backend> backend failed with error: <N> (UR_RESULT_ERROR_...)"
(intel/llvm ``sycl/test-e2e/Graph/RecordReplay/Inputs/exception_recording_queue_wait.cpp``,
which expects ``errc::runtime`` natively and ``errc::invalid`` otherwise).

``probe_recording_mode(module, device_index)``: on a side stream of the device module, a
throw-away ``XPUGraph`` begins capturing into a pool of its own, the stream synchronizes
inside the capture, and the capture ends and the graph is reset whatever happened. The error
of the wait says the mode; anything else (no error, another text, a call that raised) leaves
the mode untold, with why, and the caller falls back to its assumption. It never raises. A
probe capture that fails to begin or end is recovered from as the package's own captures are
(``_recover``): where torch is left in a state no call undoes, no graph records on the device
in this process, said once, as after any failed capture there.

It never runs while a capture is open on the device: not while the current stream records
(a compile inside a capture), nor while one of this package's captures or warmups in a pool
runs on the device (``device_graphs._CAPTURES``), nor on a stream whose queue records (xpu
hands out the same 32 queues per priority round-robin: the side stream is taken from the
low-priority pool, which the package and most programs leave alone, and never one that
records). The device module is a parameter, so the same probe runs against torch's
``torch.xpu`` and against the stand-in of ``sycl_rules`` (``torch_xpu.StandInXpu``) in either
mode. ``recording_probed`` probes once per process per device and keeps what it found.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import traceback
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from .. import messages
from ..messages import first_line
from .capture_streams import STREAMS_TRIED, stream_records
from .device_graphs import _CAPTURES, _DEVICES_THAT_CANNOT_RECORD
from .xpu_recording import COMMAND_BUFFER, NATIVE

log = logging.getLogger("inductor_xpugraph")

#: SYCL's text for a host wait on a queue that records to a command graph (``errc::invalid``).
COMMAND_BUFFER_WAIT = "wait cannot be called for a queue which is recording to a command graph"
#: What a Level Zero failure says once SYCL turns it into ``errc::runtime``
#: (``ur_failed_throw_exception``): "<backend> backend failed with error: <N> (UR_RESULT_...)".
NATIVE_WAIT_TEXTS = ("backend failed with error", "UR_RESULT_ERROR_")
#: The stream priority the side stream is taken from: the low-priority pool.
LOW_PRIORITY = 1


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """What one probe found: ``mode`` ("command-buffer", "native", or None where the probe
    could not tell), why, in words, and how long it took."""

    mode: str | None
    why: str
    seconds: float = 0.0
    #: False where the probe did not run (a capture was open): it may run later.
    ran: bool = True


def classify_wait_error(error: BaseException | None) -> tuple[str | None, str]:
    """The recording mode a host wait's error inside a capture says, and why; (None, why)
    for no error or an error neither mode is known to give."""
    if error is None:
        return None, "the host wait inside the capture did not raise, as neither mode does"
    text = str(error)
    if COMMAND_BUFFER_WAIT in text:
        return COMMAND_BUFFER, (
            "a host wait inside a capture raised SYCL's command-buffer refusal "
            f'("{COMMAND_BUFFER_WAIT}.")'
        )
    if any(marker in text for marker in NATIVE_WAIT_TEXTS):
        return NATIVE, (
            "a host wait inside a capture reached Level Zero, whose refusal came back as "
            f'errc::runtime ("{_first_text(error)}"): native recording only'
        )
    return None, (
        "the host wait inside the capture raised an error neither mode is known to give: "
        f"{first_line(error)}"
    )


def _first_text(error: BaseException) -> str:
    return (str(error).splitlines() or [""])[0][:160]


def probe_recording_mode(
    module: Any,
    device_index: int = 0,
    *,
    captures_key: str | None = None,
    end_allocate_to_pool: Callable[[int, Any], None] | None = None,
    failure_leaves_host_routing: bool | None = None,
) -> ProbeResult:
    """Which mode ``module``'s ``XPUGraph`` records with on device ``device_index``, found with
    a throw-away capture (module docstring). Never raises. ``captures_key``: the device as this
    package's captures name it ("xpu:0" by default). Used only where the probe's capture failed
    to begin or end (``_recover``): ``end_allocate_to_pool``, the allocator's call that stops
    routing into a pool (by default the module's own, where it has one);
    ``failure_leaves_host_routing``, whether such a failure leaves torch's host allocator
    routing into the pool (by default: as the stand-in's release says, else yes)."""
    start = time.perf_counter()
    key = captures_key or f"xpu:{device_index}"
    if failure_leaves_host_routing is None:
        release = getattr(module, "release", None)
        failure_leaves_host_routing = getattr(release, "routes_host_allocator", True)
    recovery = _Recovery(
        module, device_index, key, end_allocate_to_pool, failure_leaves_host_routing
    )
    found: list[ProbeResult] = []
    try:
        _CAPTURES.when_none_running(key, lambda: found.append(_probe(recovery)))
        if not found:
            found.append(
                ProbeResult(None, f"a capture of this package is under way on {key}", ran=False)
            )
    except Exception as error:  # never fails the call that asked
        found = [ProbeResult(None, f"the probe raised {first_line(error)}")]
    result = found[0]
    return dataclasses.replace(result, seconds=time.perf_counter() - start)


@dataclasses.dataclass
class _Recovery:
    """What undoing a failed probe capture needs (``_recover``)."""

    module: Any
    device_index: int
    key: str
    end_allocate_to_pool: Any
    failure_leaves_host_routing: bool


def _probe(recovery: _Recovery) -> ProbeResult:
    module, device_index = recovery.module, recovery.device_index
    stopped = _DEVICES_THAT_CANNOT_RECORD.get(module, {}).get(recovery.key)
    if stopped is not None:
        return ProbeResult(None, f"no graph records on {recovery.key} in this process: {stopped}")
    with module.device(device_index):
        if module.is_current_stream_capturing():
            return ProbeResult(None, "the current stream is being captured", ran=False)
        stream = _side_stream(module, device_index)
        if stream is None:
            return ProbeResult(
                None, f"the {STREAMS_TRIED} side streams tried all record", ran=False
            )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "the graph is empty"
            return _capture_and_wait(recovery, stream)


def _side_stream(module: Any, device_index: int) -> Any:
    for _ in range(STREAMS_TRIED):
        stream = module.Stream(device=device_index, priority=LOW_PRIORITY)
        if not stream_records(module, stream):
            return stream
    return None


def _capture_and_wait(recovery: _Recovery, stream: Any) -> ProbeResult:
    module = recovery.module
    box = [module.XPUGraph()]  # the only reference to the graph: _recover destroys it
    pool = module.graph_pool_handle()
    wait_error: BaseException | None = None
    failed: str | None = None
    try:
        with module.stream(stream):
            try:
                box[0].capture_begin(pool=pool)
            except Exception as error:
                failed = f"capture_begin raised {first_line(error)}"
            else:
                try:
                    stream.synchronize()
                except Exception as error:
                    wait_error = error
                try:
                    box[0].capture_end()
                except Exception as error:
                    failed = f"capture_end raised {first_line(error)}"
    finally:
        if failed is not None:
            _recover(recovery, box, pool, stream, failed)
        else:
            box[0].reset()
            box.clear()
    if wait_error is not None and wait_error.__traceback__ is not None:
        traceback.clear_frames(wait_error.__traceback__)
    mode, why = classify_wait_error(wait_error)
    if failed is not None and failed.startswith("capture_begin"):
        return ProbeResult(None, f"the probe's {failed}")
    if failed is not None:
        why += f" (then the probe's {failed})"
    return ProbeResult(mode, why)


def _recover(recovery: _Recovery, box: list[Any], pool: Any, stream: Any, failed: str) -> None:
    """After the probe's capture failed to begin or end, what ``DeviceGraphBackend`` does
    after a failed capture (Note [Recovering from a failed capture]): stop the allocator's
    routing into the pool, destroy the graph; where that leaves a queue recording, or the
    host allocator routing into the pool, no graph records on the device in this process
    (marked, said once, the generator given a fresh state); else an empty capture takes the
    generator out of capture mode. Each step as far as it goes."""
    module, device_index = recovery.module, recovery.device_index
    end = recovery.end_allocate_to_pool or getattr(module, "end_allocate_to_pool", None)
    routing_was_left = False
    if end is not None:
        try:
            end(device_index, pool)
            routing_was_left = True
        except Exception:  # the routing had ended
            pass
    box.clear()  # destroys the graph: a queue still recording into it executes again
    if stream_records(module, stream):
        _stop_recording(recovery, messages.queue_left_recording(recovery.key), failed)
    elif recovery.failure_leaves_host_routing and routing_was_left:
        _stop_recording(recovery, messages.HOST_ROUTING_LEFT, failed)
    else:
        try:
            other = _side_stream(module, device_index)
            empty = module.XPUGraph()
            with module.stream(other):
                empty.capture_begin(pool=module.graph_pool_handle())
                empty.capture_end()
            empty.reset()
        except Exception:  # the device's own captures will say what is wrong
            pass


def _stop_recording(recovery: _Recovery, reason: str, failed: str) -> None:
    """As ``DeviceGraphBackend._stop_recording``: no graph records on the device any more."""
    marks = _DEVICES_THAT_CANNOT_RECORD.setdefault(recovery.module, {})
    if recovery.key not in marks:
        marks[recovery.key] = reason
        log.warning(
            messages.device_cannot_record(recovery.key, reason, f"recording-mode probe ({failed})")
        )
    try:
        generator = recovery.module.default_generators[recovery.device_index]
        generator.graphsafe_set_state(generator.clone_state())
    except Exception as error:
        log.error(messages.generator_left_capturing(recovery.key, error))


# -- once per process per device --------------------------------------------------------------

_lock = threading.Lock()
_found: weakref.WeakKeyDictionary[Any, dict[int, ProbeResult]] = weakref.WeakKeyDictionary()


def recording_probed(module: Any, device_index: int = 0, **kwargs: Any) -> ProbeResult:
    """``probe_recording_mode``'s result for the device, probed once per process (a probe
    that could not run yet, because a capture was open, is tried again next time)."""
    with _lock:
        known = _found.get(module, {}).get(device_index)
        if known is not None:
            return known
        result = probe_recording_mode(module, device_index, **kwargs)
        if result.ran:
            _found.setdefault(module, {})[device_index] = result
        return result


def forget_probes() -> None:
    """Forget what the probes found (tests)."""
    with _lock:
        _found.clear()
