"""Warmup -> record -> replay for one compiled callable.

The wrapper Inductor generates calls ``graphify(call, ...)`` (or ``graphify(partition_N, ...)``)
once at load; the returned ``GraphedCallable`` replaces the callable. Each call goes through:

1. **warmup** — the first ``config.warmup_runs`` calls for a given set of sizes run the plain
   callable: Triton autotuning, lazy kernel loading and library handle creation happen here,
   never inside a capture.
2. **record** — the next call copies the non-static tensor inputs into static buffers,
   captures the callable reading those buffers, replays the graph once to compute the
   result, and keeps a ``Recording``.
3. **replay** — every later call with the same sizes replays that recording, provided each
   static input (parameter, buffer) still has the address seen at capture. When one moved,
   the callable is re-recorded; past ``config.rerecord_limit`` re-records it falls back to
   running un-graphed for good.

Recordings are keyed by the callable's integer inputs (Inductor passes symbolic sizes as
ints), so a dynamic-shape graph gets one recording per distinct size; see
``config.dynamic_shape_warn_limit`` and ``config.skip_dynamic_graphs``.
Calls made while the current stream is already being captured (by anyone) run the plain
callable: a capture is never nested inside another.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from .. import config
from . import stats
from .recording import Recording

if TYPE_CHECKING:
    from .manager import GraphManager

log = logging.getLogger("inductor_xpugraph")


class GraphedCallable:
    def __init__(
        self,
        fn: Callable[[list[Any]], Any],
        manager: GraphManager,
        *,
        static_inputs: Sequence[int],
        mutated_inputs: Sequence[int],
        phase: str,
        name: str,
    ) -> None:
        self.fn = fn
        self.manager = manager
        self.static_inputs = frozenset(static_inputs)
        self.mutated_inputs = tuple(mutated_inputs)
        self.phase = phase
        self.name = name
        self._is_capturing = manager.backend.is_capturing
        self.reset()

    def reset(self) -> None:
        """Forget every recording (their graph memory is released) and start over."""
        self.recordings: dict[tuple[int, ...], Recording] = {}
        self._calls_before_record: dict[tuple[int, ...], int] = {}
        self._size_inputs: tuple[int, ...] | None = None  # positions of int inputs, or None
        # before the first call
        self.rerecords = 0
        self.fallen_back = False

    def __call__(self, args: list[Any]) -> Any:
        # The replay fast path: one dict lookup, address checks, replay.
        size_inputs = self._size_inputs
        key = tuple([args[i] for i in size_inputs]) if size_inputs else ()
        recording = self.recordings.get(key)
        if (
            recording is not None
            and recording.static_inputs_match(args)
            and not self._is_capturing()
        ):
            stats.counters["replays"] += 1
            return recording.replay(args)
        return self._slow_path(key, args)

    # -- slow paths ---------------------------------------------------------------------------

    def _slow_path(self, key: tuple[int, ...], args: list[Any]) -> Any:
        if self.fallen_back or self._is_capturing():
            # Un-graphed for good, or someone else is capturing: run inside their capture.
            return self.fn(args)
        if self._size_inputs is None:  # first call: find the size (int) inputs once
            self._size_inputs = tuple(i for i, arg in enumerate(args) if isinstance(arg, int))
            key = tuple([args[i] for i in self._size_inputs])
        if key in self.recordings:  # recorded, but a static input moved
            return self._rerecord(key, args)
        return self._warmup_or_record(key, args)

    def _warmup_or_record(self, key: tuple[int, ...], args: list[Any]) -> Any:
        calls = self._calls_before_record.get(key, 0)
        if calls == 0 and key and not self._accept_new_size(key):
            return self.fn(args)
        if calls < config.warmup_runs:
            self._calls_before_record[key] = calls + 1
            stats.counters["warmups"] += 1
            return self.fn(args)
        stats.counters["records"] += 1
        return self._record(key, args)

    def _accept_new_size(self, key: tuple[int, ...]) -> bool:
        sizes_seen = len(self._calls_before_record)
        if sizes_seen < config.dynamic_shape_warn_limit:
            return True
        if config.skip_dynamic_graphs:
            stats.record_skip(
                f"{self.name}: more than {config.dynamic_shape_warn_limit} distinct sizes "
                f"and config.skip_dynamic_graphs=True; new sizes run un-graphed"
            )
            return False
        if sizes_seen == config.dynamic_shape_warn_limit:
            log.warning(
                "inductor_xpugraph: %s has been recorded for %d distinct sizes; each keeps "
                "its own graph and memory. Mark the sizes static, pad inputs, or set "
                "inductor_xpugraph.config.skip_dynamic_graphs=True.",
                self.name,
                sizes_seen,
            )
        return True

    def _rerecord(self, key: tuple[int, ...], args: list[Any]) -> Any:
        self.rerecords += 1
        del self.recordings[key]  # release its graph and memory before capturing again
        if self.rerecords > config.rerecord_limit:
            self.fallen_back = True
            self.recordings.clear()
            stats.counters["fallbacks"] += 1
            log.warning(
                "inductor_xpugraph: %s re-recorded %d times because static inputs "
                "(parameters/buffers) keep changing address; running it un-graphed from "
                "now on (limit: inductor_xpugraph.config.rerecord_limit=%d)",
                self.name,
                self.rerecords - 1,
                config.rerecord_limit,
            )
            return self.fn(args)
        stats.counters["rerecords"] += 1
        return self._record(key, args)

    def _record(self, key: tuple[int, ...], args: list[Any]) -> Any:
        tensor_inputs = [i for i, arg in enumerate(args) if isinstance(arg, torch.Tensor)]
        copied = [i for i in tensor_inputs if i not in self.static_inputs]
        static = [i for i in tensor_inputs if i in self.static_inputs]
        buffers = [_empty_like_strided(args[i]) for i in copied]
        capture_args = list(args)
        for i, buffer in zip(copied, buffers):
            capture_args[i] = buffer
        recording_args = list(args)
        args.clear()

        manager = self.manager
        graph, captured_outputs = manager.backend.capture(self.fn, capture_args, manager.pool)
        recording = Recording(
            graph,
            static_input_ptrs=[(i, recording_args[i].data_ptr()) for i in static],
            copied_inputs=copied,
            input_buffers=buffers,
            captured_outputs=captured_outputs,
        )
        del captured_outputs, capture_args
        self.recordings[key] = recording
        log.debug("inductor_xpugraph: recorded %s for sizes %s", self.name, key)
        # The capture computed nothing on a real device: this replay produces the result.
        return recording.replay(recording_args)


def _empty_like_strided(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
