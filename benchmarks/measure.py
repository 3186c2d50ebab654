"""How every suite measures: one module, so that a number means the same in every table.

- **A variant per process** (``in_fresh_process``): each variant (``Variant``: eager, Inductor,
  upstream's CUDA Graph Trees, ours with either memory strategy) runs in a fresh process with
  an Inductor cache of its own, so no variant's pools, caches or cuBLAS workspaces change
  another's numbers, and each compiles and autotunes as a first run does.
- **Two timing modes** (``per_call_us``): *pipelined*, calls back to back and one synchronize
  (throughput, whose floor is the device's busy time); *synchronized*, one after each call, as
  a caller that reads each result (latency: all the host does before the launch counts).
- **Memory** (``DeviceMemory``): peak allocated and reserved above the start, which holds no
  cuBLAS workspace; **graph launches** (``graph_launches``): the profiler's on a GPU,
  ``stats()["replays"]`` on the CPU emulator; **graph counters** (``Variant.counters``).
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUR_COUNTERS = ("warmups", "records", "replays", "rerecords", "fallbacks", "handovers", "skips")
# Every implementation a suite may compare; a suite offers those that make sense for it.
VARIANTS = ("eager", "inductor", "upstream", "ours", "ours_portable")


def default_device() -> str:
    if torch.cuda.is_available():
        return "cuda"
    return "xpu" if hasattr(torch, "xpu") and torch.xpu.is_available() else "cpu"


def synchronize(device: str) -> None:
    if device != "cpu":
        torch.get_device_module(device).synchronize()


def device_name(device: str) -> str:
    if device == "cpu":
        return "cpu (emulator)"
    return torch.get_device_module(device).get_device_name()


def git_commit() -> str:
    """HEAD, with "+changes" where the tracked files differ from it (a copied working tree)."""

    def git(*argv: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *argv], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def header(title: str, device: str) -> str:
    """A table's first line: what, on which device, torch, commit and date."""
    where = f"{device_name(device)}, torch {torch.__version__}, commit {git_commit()}"
    return f"## {title} — {where}, {datetime.date.today().isoformat()}"


@dataclass
class Variant:
    """One implementation in this process: ``select()`` it first, then ``compile``."""

    name: str
    device: str
    _ours_before_resets: Counter = field(default_factory=Counter)
    _upstream: Counter = field(default_factory=Counter)

    @property
    def graphs(self) -> bool:
        return self.name not in ("eager", "inductor")

    @property
    def ours(self) -> bool:
        return self.name.startswith("ours")

    def select(self) -> Variant:
        """Switch this package on or off for the device; ours' memory strategy is read when
        the device's tree is made, so there is one per process."""
        import inductor_xpugraph

        if self.ours:
            inductor_xpugraph.enable(self.device)
            inductor_xpugraph.config.allocator_checkpointing = self.name == "ours"
        else:
            inductor_xpugraph.disable(self.device)
        if self.name == "upstream":
            self._count_upstream_nodes()
        return self

    def compile(self, fn: Callable, **options: Any) -> Callable:
        if self.name == "eager":
            return fn
        return torch.compile(fn, mode="reduce-overhead" if self.graphs else None, **options)

    def reset_graphs(self) -> None:
        """What a user of this variant calls to drop every graph (nothing without graphs)."""
        import inductor_xpugraph

        if self.ours:
            self._ours_before_resets.update(self._ours_now())
            inductor_xpugraph.reset()
        elif self.name == "upstream":
            from torch._inductor import cudagraph_trees

            cudagraph_trees.reset_cudagraph_trees()

    def counters(self) -> dict[str, int] | None:
        """Graphs made and run so far in this process (None without graphs)."""
        if self.ours:
            total = self._ours_before_resets + Counter(self._ours_now())
            return {key: total[key] for key in OUR_COUNTERS}
        if self.name == "upstream":
            return {"records": self._upstream["records"], "replays": self._upstream["replays"]}
        return None

    @staticmethod
    def _ours_now() -> dict[str, int]:
        import inductor_xpugraph

        return {
            key: value for key, value in inductor_xpugraph.stats().items() if key in OUR_COUNTERS
        }

    def _count_upstream_nodes(self) -> None:
        from torch._inductor import cudagraph_trees

        node = cudagraph_trees.CUDAGraphNode
        for method, key in (("__init__", "records"), ("run", "replays")):
            original = getattr(node, method)

            def counted(*args, _original=original, _key=key, **kwargs):
                self._upstream[_key] += 1
                return _original(*args, **kwargs)

            setattr(node, method, counted)


def per_call_us(
    call: Callable[[], Any], calls: int, repeats: int, device: str, synchronized: bool
) -> float:
    """µs per call: the median over ``repeats`` of ``calls`` calls, pipelined (one synchronize
    at the end) or synchronized (one after each call)."""
    samples = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            call()
            if synchronized:
                synchronize(device)
        synchronize(device)
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def median_range(values: list[float], digits: int = 1) -> str:
    """The median, and the range (min–max) when there is more than one value."""
    middle = f"{statistics.median(values):.{digits}f}"
    if len(values) == 1:
        return middle
    return f"{middle} ({min(values):.{digits}f}–{max(values):.{digits}f})"


class DeviceMemory:
    """Peak allocated and reserved memory, in MiB above what there was at ``start()``."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.module = None if device == "cpu" else torch.get_device_module(device)

    def start(self) -> DeviceMemory:
        if self.module is None:
            return self
        synchronize(self.device)
        if self.device == "cuda":
            # The caller's earlier cuBLAS workspaces go: each variant starts without any and
            # makes those it needs (upstream's trees free them at their first warmup, ours
            # never do; left here, they would count in ours and not in upstream's).
            torch._C._cuda_clearCublasWorkspaces()
        self.module.empty_cache()
        self.module.reset_peak_memory_stats()
        self.allocated, self.reserved = (
            self.module.memory_allocated(),
            self.module.memory_reserved(),
        )
        return self

    def mib(self) -> dict[str, float]:
        """``peak_mib``, ``peak_reserved_mib``, ``after_mib`` (allocated now); {} on the CPU."""
        if self.module is None:
            return {}
        synchronize(self.device)
        m = self.module
        return {
            "peak_mib": round((m.max_memory_allocated() - self.allocated) / 2**20, 1),
            "peak_reserved_mib": round((m.max_memory_reserved() - self.reserved) / 2**20, 1),
            "after_mib": round((m.memory_allocated() - self.allocated) / 2**20, 1),
        }


def block_ratios(theirs: list[float], mine: list[float], block: int) -> list[float]:
    """Two interleaved series' median ratio (``theirs`` over ``mine``) over each full block of
    ``block`` calls: a paired comparison's spread."""
    return [
        statistics.median(theirs[i : i + block]) / statistics.median(mine[i : i + block])
        for i in range(0, min(len(theirs), len(mine)) - block + 1, block)
    ]


def graph_launches(run_once: Callable[[], Any], device: str) -> tuple[int, str, list[str]]:
    """Graph launches during one call: (count, how it was counted, the event names counted)."""
    import inductor_xpugraph

    if device == "cpu":
        before = inductor_xpugraph.stats()["replays"]
        run_once()
        count = inductor_xpugraph.stats()["replays"] - before
        return count, "stats()['replays'] (CPU emulator: not seen by the profiler)", []
    from torch.profiler import ProfilerActivity, profile

    activity = ProfilerActivity.CUDA if device == "cuda" else ProfilerActivity.XPU
    with profile(activities=[ProfilerActivity.CPU, activity]) as prof:
        run_once()
        synchronize(device)
    names = Counter(event.name for event in prof.events())
    launches = ("graphlaunch",) if device == "cuda" else (
        "graphlaunch", "commandbufferenqueue", "executegraph",
    )  # fmt: skip
    counted = {n: k for n, k in names.items() if any(word in n.lower() for word in launches)}
    return sum(counted.values()), "profiler", sorted(counted)


def in_fresh_process(argv: list[str]) -> dict[str, Any]:
    """Run ``python argv`` with an empty Inductor cache of its own; the JSON of its last line
    that starts with ``{``, or ``{"error": ...}`` with the last line of its stderr."""
    with tempfile.TemporaryDirectory(prefix="inductor-cache-") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
        done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env)
    rows = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode == 0 and rows:
        return json.loads(rows[-1])
    tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"error": f"exit {done.returncode}: {tail[:300]}"}


def write_json(path: str | None, data: Any) -> None:
    """Write ``data`` to ``path`` (``--out``), if one was given: after every row, so that a run
    cut short keeps what it measured."""
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=1)
