"""GPU time of one ``paired.py`` client's step, ours or upstream's trees, by kernel.

    PYTHONPATH=. python3 benchmarks/investigations/gpu_profile.py ours|upstream \
        [--client adamw] [--calls 20]

Prints the device time per step (sum of kernel and memcpy/memset durations from
``torch.profiler``) and the kernels with the most time, to tell host-bound from GPU-bound
differences between the two trees.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from paired import CLIENTS, WARMUP_CALLS, _compiled_for  # noqa: E402

import inductor_xpugraph  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("side", choices=("ours", "upstream"))
    parser.add_argument("--client", default="adamw", choices=list(CLIENTS))
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--out")
    args = parser.parse_args()
    (inductor_xpugraph.enable if args.side == "ours" else inductor_xpugraph.disable)("cuda")
    step = CLIENTS[args.client](_compiled_for(args.side))
    for _ in range(WARMUP_CALLS):
        step()
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(args.calls):
            step()
    by_kernel: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            by_kernel[event.name[:90]] += event.device_time
            count[event.name[:90]] += 1
    total = sum(by_kernel.values()) / args.calls
    print(
        f"{args.side} {args.client}: device time {total:.0f} us/step, "
        f"{sum(count.values()) / args.calls:.0f} device events/step"
    )
    for name, t in by_kernel.most_common(15):
        print(f"  {t / args.calls:8.1f} us  x{count[name] / args.calls:5.1f}  {name}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({k: v / args.calls for k, v in by_kernel.items()}, f, indent=1)


if __name__ == "__main__":
    main()
