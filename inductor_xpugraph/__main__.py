"""``python -m inductor_xpugraph demo``: see graph trees work on this machine.
``python -m inductor_xpugraph inspect <export>``: what a precompiled export holds (``deploy``).
``python -m inductor_xpugraph doctor``: whether this machine's stack is right (``doctor``).

Picks xpu, else cuda, else the CPU emulator; compiles a small model with
``mode="reduce-overhead"``; prints the graph-tree lines Inductor generated, the runtime
counters and a short timing table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def pick_device() -> str:
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


def demo(args: argparse.Namespace) -> int:
    from torch._inductor.utils import run_and_get_code

    import inductor_xpugraph

    device = args.device or pick_device()
    inductor_xpugraph.enable(device)
    if device == "cpu":
        print(
            "No xpu or cuda device: running on the CPU EMULATOR. It exercises the real "
            "generated code and runtime, but emulated graphs re-run the kernels on the host: "
            "expect no speed-up.\n"
        )
    torch.manual_seed(0)
    model = (
        torch.nn.Sequential(
            *[m for _ in range(args.layers) for m in (torch.nn.Linear(64, 64), torch.nn.GELU())]
        )
        .to(device)
        .eval()
    )
    x = torch.randn(8, 64, device=device)

    with torch.no_grad():
        torch._dynamo.reset()
        graphed = torch.compile(model, mode="reduce-overhead")
        _, sources = run_and_get_code(graphed, x)
        print("Graph-tree lines Inductor generated (TORCH_LOGS=output_code shows all):")
        for source in sources:
            block = source[source.index("# -- graph tree") :].split("\n\n\n")[0]
            print("    " + block.replace("\n", "\n    "))
        torch.testing.assert_close(graphed(x), model(x), rtol=1e-4, atol=1e-4)

        timings = {
            "eager": time_per_call(model, x, device),
            "reduce-overhead (inductor_xpugraph)": time_per_call(graphed, x, device),
        }
        counters = inductor_xpugraph.stats()
        inductor_xpugraph.disable(device)
        torch._dynamo.reset()
        timings["inductor default (no graphs)"] = time_per_call(torch.compile(model), x, device)
        if device == "cuda":
            torch._dynamo.reset()
            upstream = torch.compile(model, mode="reduce-overhead")
            timings["reduce-overhead (upstream CUDA Graph Trees)"] = time_per_call(
                upstream, x, device
            )
        inductor_xpugraph.enable(device)

    print("\nCounters (inductor_xpugraph.stats()):")
    for name, value in counters.items():
        print(f"    {name}: {value}")
    label = "CPU emulator" if device == "cpu" else torch.device(device, 0)
    print(f"\nPer-call time, {args.layers} x (Linear 64 + GELU), batch 8, on {label}:")
    for name, seconds in timings.items():
        print(f"    {name:<45} {seconds * 1e6:9.1f} µs")
    if device == "cpu":
        print("    (emulated: graphs re-run on the host, so no speed-up is expected)")
    return 0


def time_per_call(fn, x, device: str, calls: int = 50, repeats: int = 7) -> float:
    sync = {"cuda": torch.cuda.synchronize, "xpu": lambda: torch.xpu.synchronize()}.get(
        device, lambda: None
    )
    for _ in range(5):
        fn(x)
    sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn(x)
        sync()
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


def inspect_artifact(args: argparse.Namespace) -> int:
    from .deploy import ArtifactError, describe

    try:
        print(describe(args.artifact, source=not args.no_source))
    except ArtifactError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def _doctor() -> int:
    from .doctor import main

    return main()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inductor_xpugraph")
    commands = parser.add_subparsers(dest="command", required=True)
    demo_parser = commands.add_parser("demo", help="compile a small model and show the graphs")
    demo_parser.add_argument("--device", choices=("xpu", "cuda", "cpu"), default=None)
    demo_parser.add_argument("--layers", type=int, default=16)
    demo_parser.set_defaults(run=demo)
    inspect_parser = commands.add_parser(
        "inspect", help="print what an export (inductor_xpugraph.deploy.export) holds"
    )
    inspect_parser.add_argument("artifact", help="the export's directory")
    inspect_parser.add_argument("--no-source", action="store_true", help="omit wrapper source")
    inspect_parser.set_defaults(run=inspect_artifact)
    doctor_parser = commands.add_parser(
        "doctor", help="check torch, the device, Triton and the extension (exit 1 on FAIL)"
    )
    doctor_parser.set_defaults(run=lambda args: _doctor())
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
