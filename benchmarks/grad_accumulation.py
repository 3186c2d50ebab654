"""Gradient accumulation: correctness against eager, and what handing gradients over costs.

Run on the GPU machine from the repository root:

    PYTHONPATH=. python3 benchmarks/grad_accumulation.py [--steps 12] [--micro-batches 4]

A step is ``--micro-batches`` forward + backward passes accumulating into ``.grad``, one SGD
update, then ``zero_grad(set_to_none=True)``: the standard way to train with a larger
effective batch. With ``--micro-batches 1`` it is a plain training step (nothing is handed
over), which separates the cost of the mechanism from the rest.

Each (workload, variant) runs in a fresh process. A variant runs the same steps on a copy of
the model in eager mode beside it and reports the largest difference of any gradient from
eager's over all steps (what the gradient-accumulation bug was: 3e-2 on the MLP, silently).
Reported: that difference, the median synchronized step time, our handovers per step
(gradient blocks copied out of the graph pool when the next micro-batch started) and the
bytes they copied, the host time spent retiring held outputs per step (synchronized around
each retirement, so it includes the device copies; measured in a second pass, so it does
not slow the timed one), replays, or the error a variant raised.
Variants: ``eager``, ``inductor`` (default mode, no graphs), ``upstream``
(mode="reduce-overhead", Inductor's own trees), ``ours_checkpointing`` and ``ours_owned``
(ours, with allocator checkpointing on, the cuda default, and off: the xpu strategy).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training_memory import build, select_variant  # noqa: E402

WORKLOADS = ("mlp", "gpt2")
VARIANTS = ("eager", "inductor", "upstream", "ours_checkpointing", "ours_owned")


def run_variant(workload: str, variant: str, steps: int, micro_batches: int) -> dict:
    import torch

    import inductor_xpugraph
    from inductor_xpugraph.trees.tree import GraphTree

    select_variant(variant)
    model, batch, loss_fn = build(workload)
    reference = copy.deepcopy(model)
    if variant == "eager":
        compiled = model
    else:
        compiled = torch.compile(model, mode=None if variant == "inductor" else "reduce-overhead")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=1e-3)

    def step(batches, check: bool) -> float:
        worst = 0.0
        for inputs in batches:
            loss_fn(compiled(*inputs), *inputs).backward()
        if check:
            for inputs in batches:
                loss_fn(reference(*inputs), *inputs).backward()
            worst = max(
                (p.grad - q.grad).abs().max().item()
                for p, q in zip(model.parameters(), reference.parameters())
            )
            ref_opt.step()
            ref_opt.zero_grad(set_to_none=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return worst

    result = {"workload": workload, "variant": variant, "micro_batches": micro_batches}
    try:
        # Correctness: every step against eager (the reference has the same weights).
        result["max_grad_diff"] = max(
            step([batch() for _ in range(micro_batches)], check=True) for _ in range(steps)
        )
        # Speed: the same steps, synchronized, without the reference.
        times = []
        for _ in range(steps):
            batches = [batch() for _ in range(micro_batches)]
            torch.cuda.synchronize()
            start = time.perf_counter()
            step(batches, check=False)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        result["step_ms"] = statistics.median(times[2:]) * 1e3
    except RuntimeError as error:
        result["error"] = str(error).splitlines()[0][:160]
        return result
    if variant.startswith("ours"):
        stats = inductor_xpugraph.stats()
        handovers = stats["handovers"]
        retire_seconds = []
        retire = GraphTree.retire_handed_out

        def timed_retire(self, *args, **kwargs):
            torch.cuda.synchronize()
            start = time.perf_counter()
            retire(self, *args, **kwargs)
            torch.cuda.synchronize()
            retire_seconds.append(time.perf_counter() - start)

        GraphTree.retire_handed_out = timed_retire
        for _ in range(steps):
            step([batch() for _ in range(micro_batches)], check=False)
        GraphTree.retire_handed_out = retire
        result["handovers_per_step"] = (inductor_xpugraph.stats()["handovers"] - handovers) / steps
        result["grad_mib"] = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
        result["retire_us_per_step"] = sum(retire_seconds) / steps * 1e6
        result["replays"] = stats["replays"]
    return result


def format_row(r: dict) -> str:
    head = f"| {r['workload']} | {r['micro_batches']} | {r['variant']} "
    if "error" in r:
        return head + f"| raises: {r['error']} | | | | | |"
    return head + (
        f"| {r['max_grad_diff']:.2e} | {r['step_ms']:.2f} "
        f"| {r.get('handovers_per_step', '-')} | {r.get('grad_mib', 0):.1f} "
        f"| {r.get('retire_us_per_step', float('nan')):.0f} | {r.get('replays', '-')} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[4, 1])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--out", default=None)
    parser.add_argument("--one", nargs=3, metavar=("WORKLOAD", "VARIANT", "MICRO_BATCHES"))
    args = parser.parse_args()
    if args.one:
        workload, variant, micro_batches = args.one
        print(json.dumps(run_variant(workload, variant, args.steps, int(micro_batches))))
        return
    import torch

    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.steps} steps")
    print(
        "| workload | micro-batches | variant | max grad diff vs eager | step ms "
        "| handovers/step | grad MiB | retire µs/step | replays |"
    )
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    rows = []
    for workload in args.workloads:
        for micro_batches in args.micro_batches:
            for variant in args.variants:
                command = [sys.executable, __file__, "--steps", str(args.steps), "--one"]
                proc = subprocess.run(
                    command + [workload, variant, str(micro_batches)],
                    capture_output=True,
                    text=True,
                    env=os.environ,
                )
                if proc.returncode != 0:
                    print(f"{workload} {variant}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
                    continue
                rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
                print(format_row(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
