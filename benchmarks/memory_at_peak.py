"""What is allocated at the peak of a training workload: ours against upstream's trees.

    PYTHONPATH=. python3 benchmarks/memory_at_peak.py --workload train_gpt2 --variant ours

Runs 8 steps of a ``compare.py`` training workload with the CUDA allocator's history
recording on, and prints the peak allocated memory of each step (as ``compare.py`` counts
it: above what was allocated before the model was built). It then replays the recorded
allocations and frees to find the moment of peak allocated memory, and prints the
allocations live at that moment, largest first, grouped by where they were made (the
innermost frame in torch or in generated code) and by pool ("private" = a graph pool).
"""

from __future__ import annotations

import argparse
import collections

import torch

import inductor_xpugraph
from benchmarks.compare import WORKLOADS


def _site(frames: list[dict]) -> str:
    for frame in frames:
        name = frame["filename"]
        if "torchinductor" in name or "/tmp/" in name or "benchmarks/" in name:
            return f"{name.rsplit('/', 1)[-1]}:{frame['line']} {frame['name']}"
    for frame in frames:
        if frame["filename"].endswith(".py"):
            return f"{frame['filename'].rsplit('/', 1)[-1]}:{frame['line']} {frame['name']}"
    return "<c++>"


def live_at_peak(snapshot: dict) -> tuple[int, list[dict]]:
    live: dict[int, dict] = {}
    total = peak = 0
    peak_live: list[dict] = []
    for trace in snapshot["device_traces"]:
        for event in trace:
            if event["action"] == "alloc":
                live[event["addr"]] = event
                total += event["size"]
                if total > peak:
                    peak, peak_live = total, list(live.values())
            elif event["action"] == "free_completed" and event["addr"] in live:
                total -= live.pop(event["addr"])["size"]
    return peak, peak_live


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="train_gpt2")
    parser.add_argument("--variant", choices=("ours", "upstream"), default="ours")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    make_step, make_inputs, _ = WORKLOADS[args.workload]("cuda")
    if args.variant == "ours":
        inductor_xpugraph.enable("cuda")
    else:
        inductor_xpugraph.disable("cuda")
    torch._C._cuda_clearCublasWorkspaces()
    base, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    step = make_step(lambda fn: torch.compile(fn, mode="reduce-overhead"))
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    step_peaks = []
    for _ in range(args.steps):
        torch.cuda.reset_peak_memory_stats()
        step(*make_inputs())
        torch.cuda.synchronize()
        step_peaks.append((torch.cuda.max_memory_allocated() - base) / 2**20)
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak, blocks = live_at_peak(snapshot)
    groups: collections.Counter[str] = collections.Counter()
    for block in blocks:
        groups[_site(block.get("frames", []))] += block["size"]
    print(f"{args.workload} / {args.variant}: peak of each step above the memory before the")
    print("  model was built (MiB): " + " ".join(f"{p:.3f}" for p in step_peaks))
    reserved = (torch.cuda.memory_reserved() - base_reserved) / 2**20
    in_pools = sum(
        segment["total_size"]
        for segment in snapshot["segments"]
        if segment["segment_pool_id"] != (0, 0)
    )
    print(
        f"  reserved by the allocator after the last step: {reserved:.1f} MiB, of which "
        f"{in_pools / 2**20:.1f} MiB in graph pools"
    )
    print(f"  peak of traced allocations {peak / 2**20:.3f} MiB")
    for site, size in groups.most_common(15):
        print(f"  {size / 2**20:8.1f} MiB  {site}")


if __name__ == "__main__":
    main()
