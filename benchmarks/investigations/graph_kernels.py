"""What the device runs in one call, per variant: kernels by name, count and device time.

    PYTHONPATH=. python3 benchmarks/investigations/graph_kernels.py --workload softmax_chain \
        [--variants hand_replay upstream ours] [--calls 50] [--out kernels.json]

``latency.py`` showed a graphed call of ``softmax_chain`` (pipelined, so the device's time per
call) slower in ours and in upstream's trees than in the hand-captured replay of Inductor's
default code. This lists, for each variant (one fresh process each, built as ``latency.py``
builds it), every kernel one call runs inside or outside a graph, so that two variants'
lists can be compared line by line. CUDA only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
import latency  # noqa: E402


def kernels_per_call(workload: str, variant: str, calls: int, export_path: str | None) -> dict:
    from torch.profiler import ProfilerActivity, profile

    step, inputs = latency.build_step(workload, variant, "cuda", export_path)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step(*inputs)
        torch.cuda.synchronize()
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            by_name[event.name][0] += 1
            by_name[event.name][1] += event.device_time
    rows = sorted(
        ((name, count / calls, us / calls) for name, (count, us) in by_name.items()),
        key=lambda row: -row[2],
    )
    return {
        "workload": workload,
        "variant": variant,
        "device_us_per_call": sum(us for _, _, us in rows),
        "kernels": [{"name": n[:160], "per_call": c, "us_per_call": u} for n, c, u in rows],
    }


def _profile_variants(args: argparse.Namespace, export_path: str) -> list[dict]:
    """Each variant's kernels, from a fresh process each (``ours_deploy`` loads an export
    made first, in a process of its own, as ``latency.py`` does)."""
    if "ours_deploy" in args.variants:
        exported = latency.run_child(
            ["--export", args.workload, "--export-path", export_path, "--device", "cuda"]
        )
        if "error" in exported:
            sys.exit(f"export of {args.workload} failed: {exported['error']}")
    results = []
    for variant in args.variants:
        argv = [__file__, "--workload", args.workload, "--calls", str(args.calls)]
        argv += ["--export-path", export_path, "--child", variant]
        done = subprocess.run([sys.executable, *argv], capture_output=True, text=True)
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            results.append({"variant": variant, "error": done.stderr.strip()[-500:]})
            continue
        results.append(json.loads(lines[-1]))
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="softmax_chain", choices=latency.WORKLOADS)
    parser.add_argument("--variants", nargs="*", default=["hand_replay", "upstream", "ours"])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--export-path", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kernels = kernels_per_call(args.workload, args.child, args.calls, args.export_path)
        print(json.dumps(kernels))
        return
    with tempfile.TemporaryDirectory() as export_dir:
        results = _profile_variants(args, os.path.join(export_dir, "export"))
    print(f"## Kernels per call — {args.workload}, {torch.cuda.get_device_name()}")
    for result in results:
        if "error" in result:
            print(f"\n### {result['variant']}: error\n{result['error']}")
            continue
        print(f"\n### {result['variant']}: {result['device_us_per_call']:.1f} µs per call")
        for k in result["kernels"]:
            print(f"  {k['us_per_call']:8.2f} µs  ×{k['per_call']:<5g} {k['name']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
