"""Devices that something plays for a while: one record per device type, in one place.

A stand-in replaces, for its device type, everything the runtime and codegen ask of a device:
the graph backend that records and replays there (``backend_class``), the operators its graphs
cannot record, with why (``unrecordable_ops.listed_ops``), and, where its operators have other
names than those of the device it models, the operator each stands for (``config.
allow_capture_ops`` takes either name; the doctor's probe shows both). ``standing_in`` puts a
record in place for the length of a ``with`` block and takes it out after, whatever happens;
``inductor_xpugraph.sycl_rules.on_cpu`` puts the CPU under SYCL Graph's rules this way.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import GraphBackend


@dataclasses.dataclass(frozen=True)
class StandIn:
    """What a device type is while something stands in for it."""

    backend: type[GraphBackend]
    # Operator -> why the stand-in's graphs do not record it: the device's whole list.
    unrecordable_ops: Mapping[str, str]
    # Operator of the stand-in -> the operator of the modelled device it stands for, where
    # their names differ.
    stands_for: Mapping[str, str] = dataclasses.field(default_factory=dict)


_in_place: dict[str, StandIn] = {}


def stand_in(device_type: str) -> StandIn | None:
    """The stand-in in place for ``device_type``, or None: the device is itself."""
    return _in_place.get(device_type)


@contextlib.contextmanager
def standing_in(device_type: str, record: StandIn) -> Iterator[StandIn]:
    """``record`` is ``device_type`` inside the block. One stand-in per device type at a time:
    a second raises, and the first stays in place."""
    if device_type in _in_place:
        raise RuntimeError(
            f"something already stands in for {device_type!r}: leave its block first"
        )
    _in_place[device_type] = record
    try:
        yield record
    finally:
        del _in_place[device_type]
