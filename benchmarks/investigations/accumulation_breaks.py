"""Gradient accumulation across a graph break: how much of each step stays graphed.

    PYTHONPATH=. python3 benchmarks/investigations/accumulation_breaks.py \
        [--device cuda] [--steps 12]

A two-layer model with ``torch._dynamo.graph_break()`` between its layers (two compiled
regions: two forward and two backward graphs per micro-batch), trained with 1 or 2
micro-batches per step and ``zero_grad(set_to_none=...)`` True, False, or alternating. Each
configuration runs in a fresh process, beside an eager copy of the model. Printed per
configuration: records, replays, re-records (a liveness variant is one), liveness fallbacks
(a micro-batch leaving the tree because a recording reused memory that is referenced now),
gradient handovers, and the largest difference of any gradient from eager's. On
``--device cpu`` ours runs on the emulator.
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys

import torch

CONFIGS = [  # (micro-batches, graph break, set_to_none)
    (1, False, "true"),
    (2, False, "true"),
    (1, True, "true"),
    (2, True, "true"),
    (2, True, "false"),
    (2, True, "alternating"),
]


class TwoLayers(torch.nn.Module):
    def __init__(self, graph_break: bool) -> None:
        super().__init__()
        self.graph_break = graph_break
        self.a, self.b = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x).relu()
        if self.graph_break:
            torch._dynamo.graph_break()
        return self.b(h)


def run(device: str, steps: int, micro_batches: int, graph_break: bool, set_to_none: str) -> dict:
    import inductor_xpugraph

    inductor_xpugraph.enable(device)
    torch.manual_seed(0)
    model = TwoLayers(graph_break).to(device)
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, mode="reduce-overhead")
    worst = 0.0
    for step in range(steps):
        for _ in range(micro_batches):
            x = torch.randn(4, 32, device=device)
            compiled(x).square().mean().backward()
            reference(x).square().mean().backward()
        for ours, eager in zip(model.parameters(), reference.parameters()):
            worst = max(worst, (ours.grad - eager.grad).abs().max().item())
        to_none = {"true": True, "false": False, "alternating": step % 2 == 0}[set_to_none]
        model.zero_grad(set_to_none=to_none)
        reference.zero_grad(set_to_none=to_none)
    stats = inductor_xpugraph.stats()
    keys = ("records", "replays", "rerecords", "liveness_fallbacks", "handovers")
    return {**{key: stats[key] for key in keys}, "max_grad_diff": worst}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        micro, graph_break, set_to_none = args.child
        row = run(args.device, args.steps, int(micro), graph_break == "1", set_to_none)
        print(json.dumps(row))
        return
    print(f"device {args.device}, torch {torch.__version__}, {args.steps} steps\n")
    print("| micro-batches | graph break | set_to_none | records | replays | re-records "
          "| liveness fallbacks | handovers | max grad diff |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for micro, graph_break, set_to_none in CONFIGS:
        child = [sys.executable, __file__, "--device", args.device, "--steps", str(args.steps)]
        child += ["--child", str(micro), str(int(graph_break)), set_to_none]
        done = subprocess.run(child, capture_output=True, text=True)
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            cells = ["error: " + (done.stderr.strip().splitlines() or ["?"])[-1][:120]]
        else:
            row = json.loads(lines[-1])
            keys = ("records", "replays", "rerecords", "liveness_fallbacks", "handovers")
            cells = [str(row[k]) for k in keys]
            cells.append(f"{row['max_grad_diff']:.1e}")
        print(
            f"| {micro} | {'yes' if graph_break else 'no'} | {set_to_none} | "
            + " | ".join(cells)
            + " |"
        )


if __name__ == "__main__":
    main()
