"""What an operator that waits on the host costs a graphed model, and what partitioning it
out wins back.

The model: ``--layers`` blocks of (matmul, softmax) on a batch of 4 × 256, with a custom
operator in the middle whose kernel reads a sum back to the host (``.item()``), as an operator
whose XPU kernel synchronizes does. A capture meets the wait and fails (SYCL throws its wait
text on an Intel GPU; CUDA refuses the synchronization inside a stream capture), so the graph
runs un-graphed from then on. Once the package has named the operator, a compile partitions it
out: the blocks before and after it are graphed, and the operator runs between them.

Variants, each in a fresh process: ``eager``; ``failed``, ours after the capture failed (the
graph runs un-graphed); ``partitioned``, ours compiled with the operator in
``config.never_capture_ops`` from the start (what every later compile in the process does
after a failure: ``unrecordable_ops.note_capture_failed_in``). µs per call, pipelined and
synchronized (``measure.per_call_us``)::

    python benchmarks/host_wait.py --device cuda --out host_wait.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402

VARIANTS = ("eager", "failed", "partitioned")
OPERATOR = "xpugraph_bench::scale_by_mean"


@torch.library.custom_op(OPERATOR, mutates_args=())
def scale_by_mean(x: torch.Tensor) -> torch.Tensor:
    """Waits on the host: the mean is read back (``.item()``) before the kernel runs."""
    return x * (1.0 / (1.0 + abs(x.mean().item())))


@scale_by_mean.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class Chain(torch.nn.Module):
    def __init__(self, layers: int, width: int = 256) -> None:
        super().__init__()
        self.weights = torch.nn.ParameterList(
            torch.nn.Parameter(torch.randn(width, width) / width**0.5) for _ in range(layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        middle = len(self.weights) // 2
        for i, weight in enumerate(self.weights):
            if i == middle:
                x = torch.ops.xpugraph_bench.scale_by_mean(x)
            x = torch.softmax(x @ weight, dim=-1)
        return x


def run_variant(variant: str, device: str, layers: int, calls: int, repeats: int) -> dict:
    import inductor_xpugraph

    inductor_xpugraph.enable(device.split(":")[0])
    torch.manual_seed(0)
    model = Chain(layers).to(device)
    x = torch.randn(4, 256, device=device)
    if variant == "eager":
        step = model
    else:
        never = (OPERATOR,) if variant == "partitioned" else ()
        with inductor_xpugraph.config.patch(never_capture_ops=never):
            step = torch.compile(model, mode="reduce-overhead")
            with torch.no_grad():
                for _ in range(5):
                    step(x)
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(step(x), expected)
        timings = {
            mode: measure.per_call_us(
                lambda: step(x), calls, repeats, device, synchronized=mode == "synchronized"
            )
            for mode in ("pipelined", "synchronized")
        }
    counters = {} if variant == "eager" else inductor_xpugraph.stats()
    said = [e.reason for e in inductor_xpugraph.report().events if "capture on" in e.reason]
    return {
        "variant": variant,
        **timings,
        "records": counters.get("records"),
        "replays": counters.get("replays"),
        "capture_failures": counters.get("capture_failures"),
        "capture_failure_said": said[0] if said else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=measure.default_device())
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--variant", choices=VARIANTS, help="run one variant in this process")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.variant:
        result = run_variant(args.variant, args.device, args.layers, args.calls, args.repeats)
        measure.write_json(args.out, result)
        print(json.dumps(result))
        return
    print(
        measure.header(
            "An operator that waits on the host, un-graphed or partitioned out", args.device
        )
    )
    rows = []
    for variant in VARIANTS:
        argv = [__file__, "--variant", variant, "--device", args.device,
                "--layers", str(args.layers), "--calls", str(args.calls),
                "--repeats", str(args.repeats)]  # fmt: skip
        rows.append({"variant": variant, **measure.in_fresh_process(argv)})
    print("| variant | pipelined µs | synchronized µs | records | replays | capture failures |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        if "error" in row:
            print(f"| {row.get('variant', '?')} | {row['error']} |")
            continue
        print(
            f"| {row['variant']} | {row['pipelined']:.1f} | {row['synchronized']:.1f} | "
            f"{row['records']} | {row['replays']} | {row['capture_failures']} |"
        )
    measure.write_json(args.out, rows)


if __name__ == "__main__":
    main()
