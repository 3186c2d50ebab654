"""``python -m inductor_xpugraph demo``: see graph trees work on this machine.
``python -m inductor_xpugraph inspect <export>``: what a precompiled export holds (``deploy``).
``python -m inductor_xpugraph doctor [--device cpu]``: whether this machine's stack is right and
its devices record graphs (``doctor``); ``doctor --device cpu --sycl-rules 2.13``: what torch
2.13's XPU runtime would record, the CPU standing in for the GPU (``sycl_rules.on_cpu``).
``python -m inductor_xpugraph report script.py [args]``: run a script, then print its report.
``python -m inductor_xpugraph build``: build the package's C++ module for this torch (``native``;
otherwise built when the package is installed).
Errors that need no torch (a path that is not an export, a missing script, a device torch was
not built for) are said before torch is imported. A C++ compiler missing for Inductor's CPU
kernels is said in one line, with the fix (``diagnostics.cpp_compiler``): by ``demo`` on the CPU
emulator before it compiles, by ``report`` when it stops the script.
A bad ``INDUCTOR_XPUGRAPH_*`` value is one of the doctor's FAIL lines; every other command says
so in one line and goes on without it, as a program importing the package does (``_settings``).

Picks xpu, else cuda, else the CPU emulator; compiles a small model with
``mode="reduce-overhead"``; prints the graph-tree lines Inductor generated, whether the
graphed model's output equals eager's (a difference is a loud line, and exit status 1), the
runtime counters and a short timing table.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time

# What the parser offers, without importing torch (``--help`` and usage errors answer at
# once): ``sycl_rules.releases.RELEASES`` and ``diagnostics.probe_report.PROBE_TIMEOUT``,
# which a test holds equal to these.
SYCL_RULES_RELEASES = ("2.11", "2.13", "2.14", "2.15")
PROBE_TIMEOUT = 180.0


def pick_device() -> str:
    import torch

    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


def device_missing(device: str) -> str:
    """Why ``device`` cannot run here, or "" when it can."""
    import torch

    if device == "cpu":
        return ""
    runtime = getattr(torch, device, None)
    if runtime is not None and runtime.is_available():
        return ""
    return (
        f"--device {device}: this torch ({torch.__version__}) sees no {device} device; "
        "without --device the demo picks one it sees (the CPU emulator here)"
    )


def demo(args: argparse.Namespace) -> int:
    import torch
    from torch._inductor.utils import run_and_get_code

    import inductor_xpugraph

    device = args.device or pick_device()
    missing = device_missing(device)
    if missing:
        print(f"error: {missing}", file=sys.stderr)
        return 2
    if device == "cpu":
        from .diagnostics import cpp_compiler

        lacking = cpp_compiler.missing()
        if lacking:
            print(f"error: {lacking}", file=sys.stderr)
            return 2
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
        print("Graph-tree lines Inductor generated (shortened; TORCH_LOGS=output_code shows all):")
        for source in sources:
            print("    " + graph_tree_lines(source).replace("\n", "\n    "))
        difference = difference_from_eager(graphed(x), model(x))
        if difference:
            print(f"\nRESULTS DIFFER FROM EAGER: {difference}. Please report this output.")
        else:
            print(
                "\nResults: the graphed model's output equals eager's within "
                f"rtol=atol={RESULT_TOLERANCE:g} (torch.testing.assert_close)."
            )

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

    inductor_xpugraph.reset()
    torch._dynamo.reset()
    tokens = sample_with_an_lstm_cell(device)
    counters = inductor_xpugraph.stats()
    print(
        f"\nA sampling loop that feeds each step's state back in ({len(tokens)} steps): "
        f"{counters['warmups']} warmup, {counters['records']} record, "
        f"{counters['replays']} replays; tokens {tokens}"
    )

    inductor_xpugraph.reset()
    torch._dynamo.reset()
    train_with_a_graph_break(device)
    print("\nA training loop with a graph break and two batch sizes (inductor_xpugraph.report()):")
    print(inductor_xpugraph.report(args.picture))
    if args.picture:
        print(f"(drawn into {args.picture})")
    if difference:
        print(f"\nRESULTS DIFFER FROM EAGER (see above): {difference}", file=sys.stderr)
        return 1
    return 0


RESULT_TOLERANCE = 1e-4  # relative and absolute, as torch.testing.assert_close takes them


def difference_from_eager(graphed, eager) -> str:
    """How the graphed model's output differs from eager's, in one line ("" where it does not:
    ``torch.testing.assert_close`` within ``RESULT_TOLERANCE``)."""
    import torch

    try:
        torch.testing.assert_close(graphed, eager, rtol=RESULT_TOLERANCE, atol=RESULT_TOLERANCE)
    except AssertionError as mismatch:
        return " ".join(str(mismatch).split())
    return ""


# The dict of names a graphify call gets, one entry per line: a line per parameter.
_INPUT_NAMES = re.compile(r"input_names=\{\n(.*?)\n *\}", re.DOTALL)


def graph_tree_lines(source: str, names_shown: int = 2) -> str:
    """The lines of a generated module that wrap its code in graphs, as the demo shows them:
    the comments saying what is captured, the import and the graphify calls, each call's
    ``input_names`` (what the runtime's messages call each static input: one per parameter)
    cut to its first ``names_shown`` entries. Left out: how the module hands Inductor the
    graphs' lifetime."""
    block = source[source.index("# -- graph tree") :].split("\n\n\n")[0]
    block = block.split("\n# Inductor keeps this module")[0]

    def shorten(names: re.Match) -> str:
        entries = [line.strip().rstrip(",") for line in names[1].splitlines()]
        if len(entries) > names_shown:
            entries[names_shown:] = [f"... {len(entries) - names_shown} more"]
        return "input_names={" + ", ".join(entries) + "}"

    return _INPUT_NAMES.sub(shorten, block)


def sample_with_an_lstm_cell(device: str, steps: int = 12) -> list[int]:
    """How a decode loop uses graphs (as gpt-fast writes one): the state a step returns is
    the next step's input, as is; what the caller keeps past the next step is cloned, because
    the next replay overwrites the graph's outputs (reading a kept output raises)."""
    import torch

    torch.manual_seed(0)
    embed = torch.nn.Embedding(64, 32).to(device)
    cell = torch.nn.LSTMCell(32, 64).to(device)
    head = torch.nn.Linear(64, 64).to(device)

    @torch.compile(mode="reduce-overhead")
    def step(token, h, c):
        h, c = cell(embed(token), (h, c))
        return head(h).argmax(-1), h, c

    token = torch.zeros(1, dtype=torch.long, device=device)
    h, c = torch.zeros(1, 64, device=device), torch.zeros(1, 64, device=device)
    kept = []
    with torch.no_grad():
        for _ in range(steps):
            token, h, c = step(token, h, c)  # outputs passed back in: no clone needed
            kept.append(token.clone())  # kept past the next step: cloned
    return torch.cat(kept).tolist()


def train_with_a_graph_break(device: str, steps_per_size: int = 4) -> None:
    """Forward and backward graphs on each side of a graph break, for two batch sizes."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1)
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def loss_of(x):
        hidden = model[1](model[0](x))
        torch._dynamo.graph_break()  # e.g. a print or a data-dependent branch
        return model[2](hidden).square().mean()

    compiled = torch.compile(loss_of, mode="reduce-overhead")
    for batch in (8, 16):
        for _ in range(steps_per_size):
            compiled(torch.randn(batch, 32, device=device)).backward()
            opt.step()
            opt.zero_grad()


def time_per_call(fn, x, device: str, calls: int = 50, repeats: int = 7) -> float:
    import torch

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


def run_and_report(args: argparse.Namespace) -> int:
    import runpy

    import inductor_xpugraph

    sys.argv = [args.script, *args.script_args]
    try:
        runpy.run_path(args.script, run_name="__main__")
    finally:
        print(inductor_xpugraph.report(args.picture), file=sys.stderr)
    return 0


def build_compiled_module(args: argparse.Namespace) -> int:
    """``build``: the compiled module for this torch, into this environment's cache (``native``),
    unless one is there already; the compiler's output is shown."""
    from . import native

    version, found = native.torch_version(), native.find()
    if found is not None:
        print(f"The compiled module for torch {version} is there: {found}")
        return 0
    lacking = native.missing_tools()
    if lacking:
        print(f"error: cannot build the compiled module: this machine lacks {', '.join(lacking)}")
        return 1
    cache = native.environment_cache()
    print(f"Building the compiled module for torch {version} into {cache} (about a minute)")
    started = time.monotonic()
    try:
        built = native.build_into_cache()
    except Exception as error:
        print(f"error: the build failed: {error}", file=sys.stderr)
        return 1
    if built is None:
        print(f"Another process is building it now (it holds {cache}); nothing to do here.")
        return 0
    print(f"Built {built} in {time.monotonic() - started:.0f} s")
    return 0


def refusal_before_torch(args: argparse.Namespace) -> str:
    """Why the command cannot run, where finding out needs no torch ("" if it can run): a path
    that is not an export, a missing script, a device this torch was not built for. Said at
    once, before torch's import (seconds) and before anything runs."""
    if args.command == "inspect":
        from ._export_directory import not_an_export

        return not_an_export(args.artifact)
    if args.command == "report" and not os.path.exists(args.script):
        return f"cannot run {args.script}: no such file"
    if args.command == "demo" and args.device in ("cuda", "xpu"):
        from .native import torch_build

        build = torch_build()
        if build.get(args.device) is None:
            return (
                f"--device {args.device}: this torch ({build['__version__']}) is not built "
                f"for {args.device}; without --device the demo picks a device it has (the "
                "CPU emulator here)"
            )
    return ""


def _doctor(args: argparse.Namespace) -> int:
    from .diagnostics.doctor import main

    if args.sycl_rules is not None:
        refusal = _sycl_rules_refusal(args)
        if refusal:
            print(f"error: {refusal}", file=sys.stderr)
            return 2
    return main(
        args.device,
        probe=not args.no_probe,
        probe_timeout=args.probe_timeout,
        sycl_rules=args.sycl_rules,
    )


def _sycl_rules_refusal(args: argparse.Namespace) -> str:
    """Why ``doctor --sycl-rules`` cannot run with these options ("" if it can)."""
    from .sycl_rules.releases import RELEASES, rule_set

    try:
        rule_set(args.sycl_rules)
    except ValueError as error:
        version = args.sycl_rules.partition(":")[0]
        if version not in RELEASES:
            return (
                f"--sycl-rules {args.sycl_rules}: no rule set for torch {version}; choose "
                f"one of {', '.join(sorted(RELEASES))}"
            )
        return f"--sycl-rules {args.sycl_rules}: {error}"
    if set(args.device or []) != {"cpu"}:
        given = ", ".join(f"--device {d}" for d in dict.fromkeys(args.device or [])) or "none"
        return (
            "--sycl-rules puts the CPU under SYCL Graph's rules, standing in for an xpu "
            f"device: it needs --device cpu and no other device (given: {given})"
        )
    if args.no_probe:
        return "--sycl-rules probes the CPU under SYCL Graph's rules; --no-probe captures nothing"
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=_program_name())
    commands = parser.add_subparsers(dest="command", required=True)
    demo_parser = commands.add_parser("demo", help="compile a small model and show the graphs")
    demo_parser.add_argument(
        "--device",
        choices=("xpu", "cuda", "cpu"),
        default=None,
        help="run on this device (cpu: the CPU emulator). Default: xpu where torch sees one, "
        "else cuda, else the CPU emulator",
    )
    demo_parser.add_argument(
        "--layers",
        type=int,
        default=16,
        metavar="N",
        help="the model's depth: N x (Linear 64 + GELU) (default: 16)",
    )
    demo_parser.add_argument("--picture", default=None, help="draw the report (.png, .svg)")
    demo_parser.set_defaults(run=demo)
    report_parser = commands.add_parser(
        "report", help="run a Python script, then print (and draw) its graph-tree report"
    )
    report_parser.add_argument("--picture", default=None, help="draw it (.png, .svg, .pdf)")
    report_parser.add_argument("script", nargs="?", help="the Python script to run")
    report_parser.add_argument(
        "script_args", nargs=argparse.REMAINDER, metavar="...", help="the script's arguments"
    )
    report_parser.set_defaults(run=run_and_report)
    inspect_parser = commands.add_parser(
        "inspect", help="print what an export (inductor_xpugraph.deploy.export) holds"
    )
    inspect_parser.add_argument("artifact", help="the export's directory")
    inspect_parser.add_argument("--no-source", action="store_true", help="omit wrapper source")
    inspect_parser.set_defaults(run=inspect_artifact)
    doctor_parser = commands.add_parser(
        "doctor",
        help="check torch, the settings, the device, Triton and the extension, and whether "
        "the device records graphs (exit 1 on FAIL)",
    )
    doctor_parser.add_argument(
        "--device",
        action="append",
        choices=("xpu", "cuda", "cpu"),
        help="probe this device's graphs (repeatable; cpu: the CPU emulator). Default: each "
        "available xpu and cuda device, and the emulator when INDUCTOR_XPUGRAPH_DEVICES names it",
    )
    doctor_parser.add_argument(
        "--no-probe", action="store_true", help="check the installation only: capture nothing"
    )
    doctor_parser.add_argument(
        "--sycl-rules",
        default=None,
        metavar="RELEASE[:MODE]",
        help="with --device cpu: probe the CPU under SYCL Graph's rules as torch RELEASE's XPU "
        f"runtime meets them ({', '.join(SYCL_RULES_RELEASES)}), recording as torch chooses "
        "or as MODE says (command-buffer, native; torch >= 2.14), a stand-in for an Intel GPU, "
        "not a measurement of one",
    )
    doctor_parser.add_argument(
        "--probe-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"end a device's probe after this long (default: {PROBE_TIMEOUT:g})",
    )
    doctor_parser.set_defaults(run=_doctor)
    build_parser = commands.add_parser(
        "build",
        help="build the package's compiled module for this torch now, in the foreground "
        "(pip install --no-build-isolation builds it at install)",
    )
    build_parser.set_defaults(run=build_compiled_module)
    args, unknown = parser.parse_known_args(argv)
    chosen = commands.choices[args.command]
    if unknown:  # said by the command's own parser, with its usage
        chosen.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command == "report" and args.script is None:
        chosen.error("a script to run is required: report script.py [its arguments]")
    refusal = refusal_before_torch(args)
    if refusal:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    if args.command == "build":
        return args.run(args)
    import inductor_xpugraph

    inductor_xpugraph._load_api()  # deferred while the arguments were parsed
    if args.command != "doctor":
        say_refused_settings()
    try:
        return args.run(args)
    except Exception as error:  # a compiler missing is said in one line, with the fix
        from .diagnostics import cpp_compiler

        if not cpp_compiler.is_missing_compiler(error):
            raise
        print(f"error: {cpp_compiler.stopped()}", file=sys.stderr)
        return 1


def _program_name() -> str:
    """How the user started this: the ``inductor-xpugraph`` script, or ``python -m``."""
    script = os.path.basename(sys.argv[0]) if sys.argv else ""
    return "inductor-xpugraph" if script == "inductor-xpugraph" else "python -m inductor_xpugraph"


def say_refused_settings() -> None:
    """Say each ``INDUCTOR_XPUGRAPH_*`` value the package's import refused, in one line on
    stderr: under this command line the import records them instead of warning
    (``_settings``). The command goes on without them; the doctor reports them itself."""
    from . import _settings

    for said in (_settings.refused or {}).values():
        print(f"warning: {said}", file=sys.stderr)
    if _settings.refused:
        print("(python -m inductor_xpugraph doctor checks every setting)", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
