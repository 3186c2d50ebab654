"""The operators a compile keeps out of a device's graphs: the device's list in force, and
the user's settings over it.

A capture that meets an operator its device's graphs cannot record fails at run time. Listed
for the device (``devices.Device.unrecordable_ops``; xpu's list and its sources are in
``xpu_unrecordable_ops``), the operator is partitioned out at compile time instead: the
wrapper codegen adds the list of the graph's device to Inductor's
``custom_should_partition_ops`` (``codegen.not_captured_ops``), so the rest of the model is
still graphed, and the generated code, the log and the report name the operator, why, and the
user's source line.

The list a compile uses is that of the installed torch and the device's recording mode
(``listed_ops``). On the CPU under SYCL Graph's rules (``inductor_xpugraph.sycl_rules.on_cpu``)
it is the xpu list of the release the rules are for, named by the CPU operators that stand for
the xpu ones (the stand-in's ``Device.stands_for``).

``config.allow_capture_ops`` takes operators off a device's list (where a newer runtime records
them); ``config.never_capture_ops`` adds operators on every device. An operator a capture failed
in, in this process (``note_capture_failed_in``: the line of the generated module the device's
error passed through named it), is partitioned out of every graph compiled after, until
``reset()``: a model's later compiles (a new shape, its backward, another function) keep their
graphs around it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ... import config
from .device_recording import device_recording
from .devices import device, torch_release
from .xpu_recording import COMMAND_BUFFER, RECORDING_MODES
from .xpu_unrecordable_ops import LibraryVersion, Listed, installed_library_version


def listed_ops(
    device_type: str,
    release: tuple[int, int] | None = None,
    recording: str | None = None,
    library_version: LibraryVersion = installed_library_version,
) -> dict[str, str]:
    """The operators graphs on ``device_type`` do not record under torch ``release`` (the
    installed one by default) and ``recording`` mode (by default that of device 0 of this
    process: ``config.xpu_recording``, else as found there, ``device_recording.device_recording``;
    asked only where an entry depends on it), with the libraries installed here
    (``library_version``), with why."""
    entries = device(device_type).unrecordable_ops
    if not entries:
        return {}
    release = release or torch_release()
    if recording is None:
        depends = any(
            isinstance(entry, Listed) and set(entry.recordings) != set(RECORDING_MODES)
            for entry in entries.values()
        )
        # Where no entry depends on it, any mode gives the same list: none is looked for.
        recording = device_recording(release).mode if depends else COMMAND_BUFFER
    listed = {}
    for op, entry in entries.items():
        entry = entry if isinstance(entry, Listed) else Listed(entry)
        if entry.holds_for(release, recording, library_version):
            listed[op] = entry.reason
    return listed


def stood_for(device_type: str) -> Mapping[str, str]:
    """Operator of what stands in for ``device_type`` -> the operator of the modelled device
    it stands for, where the names differ; empty where the device is itself."""
    return device(device_type).stands_for


#: device type -> operator a capture failed in, in this process -> the device's error.
_failed_in: dict[str, dict[str, str]] = {}


def note_capture_failed_in(device_type: str, op: str, error: str) -> None:
    """A capture on ``device_type`` failed in ``op`` with ``error``: graphs compiled from now on
    partition it out."""
    _failed_in.setdefault(device_type, {}).setdefault(op, error)


def forget_capture_failures() -> None:
    """``reset()``: compiles from now on partition out only what the list and settings say."""
    _failed_in.clear()


def ops_not_to_capture(device_type: str) -> tuple[str, ...]:
    """The operators to partition out of graphs on ``device_type``: the device's list, less
    ``config.allow_capture_ops``, plus ``config.never_capture_ops``, plus those a capture failed
    in, in this process."""
    allowed = set(config.allow_capture_ops)
    stands_for = stood_for(device_type)
    listed = [
        op
        for op in listed_ops(device_type)
        if op not in allowed and stands_for.get(op, op) not in allowed
    ]
    failed_in = _failed_in.get(device_type, {})
    return tuple(dict.fromkeys([*listed, *config.never_capture_ops, *failed_in]))


def listed_name(op: Any, listed: tuple[str, ...]) -> str | None:
    """The entry of ``listed`` that names the operator overload ``op`` (as
    ``aten::mm`` or ``aten::mm.out``), or None."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return None
    overload = getattr(op, "_overloadname", None)
    for candidate in (schema.name, f"{schema.name}.{overload}"):
        if candidate in listed:
            return candidate
    return None


def why_not_captured(device_type: str, op: str) -> str:
    """Why ``op`` is not captured on ``device_type``, for reports and logs."""
    failed_with = _failed_in.get(device_type, {}).get(op)
    if failed_with is not None and op not in config.never_capture_ops:
        return (
            f"{op} is not captured on {device_type}: a capture failed in it in this process "
            f"({failed_with})"
        )
    reason = listed_ops(device_type).get(op)
    allowed = config.allow_capture_ops
    if (
        reason is not None
        and op not in allowed
        and stood_for(device_type).get(op, op) not in allowed
    ):
        return f"{op} is not captured on {device_type}: {reason}"
    return f"{op} is not captured: listed in inductor_xpugraph.config.never_capture_ops"
