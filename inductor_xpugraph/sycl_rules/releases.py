"""What torch's XPU runtime does differently from one release to the next, as rule sets.

A ``Release`` holds the facts of one torch release's XPU runtime that decide what a graph
capture does there (read from PyTorch's and torch-xpu-ops' sources and issue threads; no
Intel GPU was run by this project): whether ``XPUGraph.capture_begin`` routes the host
(pinned) allocator into the graph's pool, whether ``torch.accelerator.Graph`` exists, whether
the allocator latches pool ids, and how its ``XPUGraph`` records on a device (command buffers
or natively, ``trees.backends.xpu_recording``). What SYCL Graph refuses under a release and a
recording mode is the package's xpu do-not-capture list (``refused_ops``, from
``trees.backends.unrecordable_ops``), so the stand-in refuses exactly what the package
partitions out on an Intel GPU. The stand-in device (``torch_xpu``) follows one release under
one recording mode.

The stand-in runs Inductor's CPU code, so an xpu operator is refused through the CPU
operator that does its work there (``CPU_STAND_INS``): the CPU's attention forward stands for
oneDNN's (the kernel xpu picks when no input needs a gradient), its backward for the
sycl-tla flash backward (what training runs); oneMKL's linear algebra and FFT, and the
collectives, have the same operators on both devices.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from ..trees.backends import unrecordable_ops
from ..trees.backends.devices import torch_release
from ..trees.backends.xpu_recording import (
    FIRST_NATIVE_RELEASE,
    NATIVE,
    RECORDING_MODES,
    recording_mode,
    why_recording_mode,
)
from ..trees.backends.xpu_unrecordable_ops import HOST_WAITING_OPS, no_library

#: The xpu operator each CPU operator stands for on the stand-in, where the names differ:
#: the CPU's attention forward stands for oneDNN's (the kernel xpu picks when no input needs
#: a gradient), its backward for the sycl-tla flash backward (what training runs).
CPU_STAND_INS: dict[str, str] = {
    "aten::_scaled_dot_product_fused_attention_overrideable": (
        "aten::_scaled_dot_product_flash_attention_for_cpu"
    ),
    "aten::_scaled_dot_product_flash_attention_backward": (
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward"
    ),
}


@dataclasses.dataclass(frozen=True)
class Release:
    """The XPU runtime of one torch release, as far as graph capture goes."""

    #: "2.11", "2.13", "2.14" or "2.15".
    version: str
    #: ``XPUGraph::capture_begin`` also routes the host caching allocator (pinned memory) into
    #: the pool, with a filter that refers to the graph; only a successful ``capture_end``
    #: ends that routing, and no Python call can (PyTorch's aten/src/ATen/xpu/XPUGraph.cpp).
    routes_host_allocator: bool
    #: ``torch.accelerator.Graph`` exists (without ``register_generator_state``).
    has_accelerator_graph: bool
    #: The caching allocator parks a pool whose holds all went and never erases it, so a
    #: capture into the same pool id trips ``TORCH_INTERNAL_ASSERT(use_count > 0)`` in
    #: ``create_or_incref_pool`` (c10/xpu/XPUCachingAllocator.cpp); a fresh
    #: ``graph_pool_handle()`` avoids it (seen on torch 2.13 on an Arc B70:
    #: riceharvest/b70-vllm-lab ``capsules/014_pool_id_latch.py``).
    latches_pool_ids: bool = False

    @property
    def number(self) -> tuple[int, int]:
        """``version`` as (major, minor)."""
        major, minor = self.version.split(".")
        return int(major), int(minor)

    def recording_mode(
        self, *, data_center_max: bool = False, environ: Mapping[str, str] = os.environ
    ) -> str:
        """How this release's ``XPUGraph`` records on a device (``xpu_recording``)."""
        return recording_mode(self.number, data_center_max=data_center_max, environ=environ)


def refused_ops(release: Release, recording: str) -> dict[str, str]:
    """The xpu operators SYCL Graph refuses to record under ``release`` and ``recording``,
    with why, named by the CPU operators that stand for them on the stand-in: the package's
    xpu do-not-capture list (``unrecordable_ops``), the one record of what each refuses, for a
    runtime known by its release alone (no oneCCL version)."""
    listed = unrecordable_ops.listed_ops(
        "xpu", release.number, recording, library_version=no_library
    )
    return {CPU_STAND_INS.get(op, op): why for op, why in listed.items()}


def host_waiting_ops(release: Release, recording: str) -> frozenset[str]:
    """The operators whose kernels wait on the host under ``release`` and ``recording``: inside
    a recording their wait throws SYCL's wait text (not the text of an outside dependency).
    With ``aten::item``: what a dispatch mode sees of an ``.item()`` in an operator's body."""
    waiting = {
        op
        for op, entry in HOST_WAITING_OPS.items()
        if entry.holds_for(release.number, recording, no_library)
    }
    return frozenset({*waiting, "aten::item"})


RELEASES: dict[str, Release] = {
    "2.11": Release("2.11", routes_host_allocator=False, has_accelerator_graph=False),
    "2.13": Release(
        "2.13", routes_host_allocator=True, has_accelerator_graph=True, latches_pool_ids=True
    ),
    "2.14": Release("2.14", routes_host_allocator=True, has_accelerator_graph=True),
    "2.15": Release("2.15", routes_host_allocator=True, has_accelerator_graph=True),
}


def release_of(version: str | None = None) -> Release:
    """The rule set of ``version`` ("2.13"), or of the installed torch: the newest release
    listed that is not newer than it."""
    if version is not None:
        if version not in RELEASES:
            raise ValueError(
                f"inductor_xpugraph.sycl_rules has no rule set for torch {version!r}: "
                f"choose one of {sorted(RELEASES)}"
            )
        return RELEASES[version]
    known = [release for release in RELEASES.values() if release.number <= torch_release()]
    return max(known, key=lambda release: release.number) if known else RELEASES["2.11"]


def check_recording(recording: str | None, release: Release) -> None:
    """Raise for a recording mode that is neither None nor one of ``RECORDING_MODES``, or that
    ``release``'s runtime does not have (native recording needs torch >= 2.14's oneAPI)."""
    if recording is not None and recording not in RECORDING_MODES:
        raise ValueError(
            f"recording must be one of {', '.join(map(repr, RECORDING_MODES))} (or None: as "
            f"torch chooses), got {recording!r}"
        )
    if recording == NATIVE and release.number < FIRST_NATIVE_RELEASE:
        raise ValueError(f"torch {release.version} records through command buffers only")


def rule_set(spec: str) -> tuple[Release, str | None]:
    """``"RELEASE[:MODE]"`` ("2.13", "2.14:command-buffer") as (release, recording mode, None
    for the one torch chooses); ValueError naming what exists."""
    version, _, mode = spec.partition(":")
    release = release_of(version)
    recording = mode or None
    check_recording(recording, release)
    return release, recording


def rule_set_name(release: Release, recording: str) -> str:
    """The canonical spec of a stand-in's rules: the release, and its recording mode where the
    release has two ("2.13", "2.14:native")."""
    if release.number < FIRST_NATIVE_RELEASE:
        return release.version
    return f"{release.version}:{recording}"


def why_rules_record_so(release: Release, recording: str | None) -> str:
    """Which recording mode a stand-in of these rules uses, and why, in words."""
    if recording is not None:
        return f"{recording}: chosen with --sycl-rules {release.version}:{recording}"
    return why_recording_mode(release.number)
