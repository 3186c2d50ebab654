"""Programs as users run them: generation, training, inference, a process that swaps models
(README.md describes each client).

Each (client, variant) runs in a fresh process with an empty Inductor cache of its own, so
every row compiles and autotunes as a first run does. A client is built for its variant and
called, each call synchronized: a call is one request or one training step, and returns its
result as text (tokens, a loss, the largest difference from eager), which should match
Inductor's row. A row holds the steady time (the median of the last 10 calls; tokens/s for
generation), the first two calls, peak allocated and reserved memory and what is still
allocated after the last call (above the client's start), the records made during the steady
calls, and the graph counters. Random weights; smaller models on the CPU emulator, where a
run only checks that the script works.

``--paired``: the host's speed differs from one process to the next by up to a quarter on the
GPU machines, so a host-bound client compares processes more than implementations in a
fresh-process table. Paired, one client is built twice from one seed, one copy compiled with
this package enabled and one with stock reduce-overhead, and their synchronized calls
alternate in one process: each side's median, the ratio, its range over blocks of 20 calls.
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402
import workloads  # noqa: E402

STEADY_CALLS = 10
MICRO_BATCHES = 4


def cache_keyword() -> str:
    """The keyword ``generate`` takes a cache by: ``cache`` from transformers 5.24, where
    ``past_key_values`` is deprecated."""
    import transformers

    version = tuple(int(part) for part in transformers.__version__.split(".")[:2])
    return "cache" if version >= (5, 24) else "past_key_values"


def static_cache(model: Any, batch: int, max_cache_len: int, early: bool) -> Any:
    """A ``StaticCache`` for ``model``: made first (``early_initialization``) when ``early``,
    else filled lazily at its first update."""
    from transformers import StaticCache

    config = model.config
    cache = StaticCache(config=config, max_cache_len=max_cache_len)
    if early:
        cache.early_initialization(
            batch_size=batch, num_heads=config.num_key_value_heads,
            head_dim=config.hidden_size // config.num_attention_heads,
            dtype=model.dtype, device=model.device,
        )  # fmt: skip
    return cache


def generate(variant: measure.Variant, batch: int, way: str) -> Callable[[], str]:
    """``way``: "lazy" (``model.forward`` compiled, one StaticCache made inside the first
    compiled call, reset and passed to every call), "early" (the same, the cache made
    first), "hf" (transformers' own compile path), "new_cache" (``model.forward`` compiled,
    ``cache_implementation="static"``: a new cache per call), "beam" ("lazy", two beams)."""
    from transformers import CompileConfig, LlamaConfig, LlamaForCausalLM

    device, big = variant.device, variant.device != "cpu"
    config = LlamaConfig(
        vocab_size=32000, hidden_size=512 if big else 128,
        intermediate_size=1376 if big else 256, num_hidden_layers=8 if big else 2,
        num_attention_heads=8, num_key_value_heads=8,
        max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(device, torch.bfloat16 if big else torch.float32)
    model.eval()
    new_tokens = 128 if big else 8
    seeds = (torch.Generator().manual_seed(seed) for seed in (1, 2))
    prompts = [torch.randint(3, 32000, (batch, 16), generator=g).to(device) for g in seeds]
    options: dict[str, Any] = dict(
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0
    )
    cache = None
    if way == "beam":
        options["num_beams"] = 2
    if not variant.graphs and way != "hf":
        # On a GPU generate compiles the decode step itself, with graphs unless told
        # otherwise: a variant without graphs must not get upstream's that way.
        options["compile_config"] = CompileConfig(mode="default")
        options.update({"disable_compile": True} if variant.name == "eager" else {})
    if way == "hf":
        compile_config = CompileConfig(mode="reduce-overhead" if variant.graphs else "default")
        compile_config._compile_all_devices = True  # the CPU emulator too
        options.update(cache_implementation="static", compile_config=compile_config)
        options.update({"disable_compile": True} if variant.name == "eager" else {})
    elif way == "new_cache":
        model.forward = variant.compile(model.forward)
        options["cache_implementation"] = "static"
    else:
        model.forward = variant.compile(model.forward)
        cache = static_cache(model, batch, 16 + new_tokens, early=way == "early")
        options[cache_keyword()] = cache
    kept: list[torch.Tensor] = []

    def call() -> str:
        if cache is not None:
            cache.reset()
        kept.append(model.generate(prompts[len(kept) % 2], **options))
        tokens = tuple(kept[-1][:, 16:].flatten().tolist())
        return f"tokens #{hash(tokens) % 10**8:08d}"

    call.tokens_per_call = batch * new_tokens  # type: ignore[attr-defined]
    call.new_tokens = new_tokens  # type: ignore[attr-defined]
    call.model = model  # type: ignore[attr-defined]
    return call


def token_time(variant: measure.Variant, call: Callable[[], str]) -> dict[str, float]:
    """Where a generated token's time goes, in ms per decode step, each over one more call:
    the whole call (``total``); the host time of the compiled decode step (``compiled_host``:
    Dynamo's guards and wrappers, AOT's, and the graph runtime); of this package's runtime
    inside it (``runtime_host``, ours only); the device's busy time (``device_busy``: the
    union of its kernels' intervals, under the profiler). The rest of ``total`` is generate's
    own loop (logits processing, stopping criteria, the cache's bookkeeping)."""
    steps, device, model = call.new_tokens, variant.device, call.model  # type: ignore[attr-defined]
    spent = {"compiled_host": 0.0, "runtime_host": 0.0}

    def timed(fn: Callable, key: str) -> Callable:
        @functools.wraps(fn)  # generate reads the forward's signature
        def run(*args: Any, **kwargs: Any) -> Any:
            begin = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[key] += time.perf_counter() - begin

        return run

    # The compiled decode step: on cuda and xpu, generate with a static cache compiles it
    # itself (``get_compiled_call``), whatever the way, and that call traces through a
    # ``model.forward`` compiled by hand. (Wrapping ``model.forward`` would change the code
    # that call traces, and compile it again.)
    compiled_call = model.get_compiled_call
    model.get_compiled_call = lambda config: timed(compiled_call(config), "compiled_host")
    if variant.ours:
        from inductor_xpugraph.trees.graphed_callable import GraphedCallable

        runtime_call = GraphedCallable.__call__
        GraphedCallable.__call__ = timed(runtime_call, "runtime_host")
    try:
        start = time.perf_counter()
        call()
        measure.synchronize(device)
        total = time.perf_counter() - start
    finally:
        del model.get_compiled_call
        if variant.ours:
            GraphedCallable.__call__ = runtime_call
    times = {"total": total * 1e3 / steps}
    times.update({key: value * 1e3 / steps for key, value in spent.items() if value})
    if device == "cuda":
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as profile:
            call()
            measure.synchronize(device)
        kernels = sorted(
            (event.time_range.start, event.time_range.end)
            for event in profile.events()
            if event.device_type.name == "CUDA"
        )
        busy, reach = 0.0, float("-inf")
        for begin, end in kernels:
            if end > reach:
                busy += end - max(begin, reach)
                reach = end
        times["device_busy"] = busy / 1e3 / steps
    return times


def adamw(variant: measure.Variant, batch: int, compiled_step: bool) -> Callable[[], str]:
    device = variant.device
    model = workloads.gpt2_lm(device)
    compiled = variant.compile(model)
    lr = torch.tensor(1e-3) if compiled_step else 1e-3
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    opt_step = variant.compile(opt.step) if compiled_step else opt.step
    data = torch.Generator(device=device).manual_seed(1)

    def call() -> str:
        ids = torch.randint(0, 5000, (batch, 128), device=device, generator=data)
        loss = workloads.next_token_loss(compiled(ids).logits, ids)
        loss.backward()
        opt_step()
        opt.zero_grad(set_to_none=True)
        return f"loss {loss.item():.4f}"  # what a training loop logs

    return call


def grad_accumulation(variant: measure.Variant, batch: int, checked: int) -> Callable[[], str]:
    device = variant.device
    model = workloads.gpt2_lm(device)
    reference = copy.deepcopy(model)
    compiled = variant.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    reference_opt = torch.optim.SGD(reference.parameters(), lr=1e-3)
    data = torch.Generator(device=device).manual_seed(1)
    state = {"calls": 0, "worst": 0.0}

    def accumulate(module, batches) -> None:
        for ids in batches:
            workloads.next_token_loss(module(ids).logits, ids).backward()

    def call() -> str:
        shape = (MICRO_BATCHES, batch, 128)  # iterated: one micro-batch of token ids each
        batches = torch.randint(0, 5000, shape, device=device, generator=data)
        accumulate(compiled, batches)
        if state["calls"] < checked:
            accumulate(reference, batches)
            pairs = zip(model.parameters(), reference.parameters())
            worst = max((p.grad - q.grad).abs().max().item() for p, q in pairs)
            state["worst"] = max(state["worst"], worst)
            reference_opt.step()
            reference_opt.zero_grad(set_to_none=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        state["calls"] += 1
        return f"max grad diff from eager {state['worst']:.1e}"

    return call


def train_two_shapes(variant: measure.Variant, batch: int) -> Callable[[], str]:
    device = variant.device
    model = workloads.mlp(device)
    compiled = variant.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rows = [batch, batch * 3 // 4]
    calls = iter(range(10**9))

    def call() -> str:
        x = torch.randn(rows[next(calls) % 2], 1024, device=device)
        loss = compiled(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return f"loss {loss.item():.4f}"

    return call


def several_models(variant: measure.Variant, batch: int) -> Callable[[], str]:
    """One call: a sequence of models, each stage's output compared with the module run
    eagerly; the result is the largest difference over every call so far."""
    device = variant.device
    worst = [0.0]

    def mlp():
        return torch.nn.Sequential(
            torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)
        ).to(device)

    def convnet():
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
            torch.nn.Linear(16 * 16 * 16, 10),
        ).to(device)  # fmt: skip

    def stage(module, compiled, make_input) -> None:
        with torch.no_grad():
            for _ in range(5):
                x = make_input()
                diff = (compiled(x).float() - module(x).float()).abs().max().item()
                worst[0] = max(worst[0], diff)

    vectors = partial(torch.randn, batch, 256, device=device)
    images = partial(torch.randn, batch, 3, 16, 16, device=device)

    def call() -> str:
        torch.manual_seed(0)
        first = mlp()
        stage(first, variant.compile(first), vectors)
        del first
        torch._dynamo.reset()  # what notebooks and test runners do
        gc.collect()
        second = convnet()
        stage(second, variant.compile(second), images)
        variant.reset_graphs()
        compiled_second = variant.compile(second)
        stage(second, compiled_second, images)
        second.load_state_dict(convnet().state_dict())  # new values, same tensors
        stage(second, compiled_second, images)
        third = mlp()  # a new instance of a class compiled before: new parameter addresses
        compiled_third = variant.compile(third)
        stage(third, compiled_third, vectors)
        fourth = mlp()
        stage(fourth, variant.compile(fourth), vectors)
        stage(third, compiled_third, vectors)  # the third's parameters come back
        del second, compiled_second, third, compiled_third, fourth
        torch._dynamo.reset()
        variant.reset_graphs()
        gc.collect()
        return f"max diff from eager {worst[0]:.1e}"

    return call


def resnet18(variant: measure.Variant, batch: int) -> Callable[[], str]:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).to(variant.device).eval()
    return inference(variant, model, torch.randn(batch, 3, 224, 224, device=variant.device))


def bert(variant: measure.Variant, batch: int) -> Callable[[], str]:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    big = variant.device != "cpu"
    config = BertConfig(
        hidden_size=768 if big else 128, num_hidden_layers=12 if big else 2,
        num_attention_heads=12 if big else 4, intermediate_size=3072 if big else 256,
    )  # fmt: skip
    model = BertModel(config).to(variant.device).eval()
    ids = torch.randint(0, config.vocab_size, (batch, 128), device=variant.device)
    return inference(variant, workloads.first_output(model), ids)


def inference(variant: measure.Variant, model, x: torch.Tensor) -> Callable[[], str]:
    compiled = variant.compile(model)

    def call() -> str:
        with torch.no_grad():
            return f"mean abs {compiled(x).float().abs().mean().item():.5f}"  # the caller uses it

    return call


def small(variant: measure.Variant, batch: int, name: str) -> Callable[[], str]:
    """``workloads.py``'s small models, whose calls are short enough that the host's work
    before the launch shows."""
    model, (x,) = workloads.model_and_inputs(name, variant.device)
    return inference(variant, workloads.first_output(model), x)


@dataclass(frozen=True)
class Client:
    build: Callable[[measure.Variant, int], Callable[[], str]]
    batch: int
    calls: int
    ungraphed_calls: int | None = None  # eager and Inductor, where they are slow


CLIENTS: dict[str, Client] = {
    "generate_lazy": Client(partial(generate, way="lazy"), 1, 20, 12),
    "generate_early": Client(partial(generate, way="early"), 1, 20, 12),
    "generate_hf": Client(partial(generate, way="hf"), 1, 100, 12),
    "generate_hf_b4": Client(partial(generate, way="hf"), 4, 100, 12),
    "generate_new_cache": Client(partial(generate, way="new_cache"), 1, 40, 12),
    "generate_beam": Client(partial(generate, way="beam"), 1, 20, 12),
    "adamw": Client(partial(adamw, compiled_step=False), 8, 40),
    "adamw_compiled_step": Client(partial(adamw, compiled_step=True), 8, 40),
    "grad_accumulation": Client(partial(grad_accumulation, checked=20), 8, 30),
    "train_two_shapes": Client(train_two_shapes, 64, 40),
    "several_models": Client(several_models, 8, 3),
    "resnet18_b8": Client(resnet18, 8, 60),
    "resnet18_b64": Client(resnet18, 64, 60),
    "bert_b1": Client(bert, 1, 60),
    "bert_b16": Client(bert, 16, 60),
    **{f"{name}_small": Client(partial(small, name=name), 1, 60) for name in workloads.MODELS},
}
# The clients whose two copies can run in one process (``generate`` compiles inside
# transformers, ``several_models`` resets every tree).
PAIRABLE = (
    "adamw", "train_two_shapes", "resnet18_b8", "resnet18_b64", "bert_b1", "bert_b16",
    *(f"{name}_small" for name in workloads.MODELS),
)  # fmt: skip
PAIRED_WARMUP_CALLS, PAIRED_BLOCK = 10, 20


def call_ours(fn, *args):
    return fn(*args)


def call_upstream(fn, *args):
    return fn(*args)


class PairedSide(measure.Variant):
    """One side of ``--paired``: everything it compiles goes through an entry function of its
    own, as Dynamo caches compiled code per code object, so the sides never share it."""

    def compile(self, fn: Callable, **options) -> Callable:
        entry = torch.compile(call_ours if self.ours else call_upstream, mode="reduce-overhead")
        return lambda *args: entry(fn, *args)


def run_paired(name: str, calls: int, ours: str) -> dict:
    """The client built twice from one seed, ours and upstream's, their calls alternating."""
    import inductor_xpugraph

    client, sides, warm_results = CLIENTS[name], {}, {}
    for side_name in (ours, "upstream"):
        # Code is generated at the first call: each copy compiles (and warms up) while its
        # implementation is the one registered for cuda.
        side = PairedSide(side_name, "cuda").select()
        call = client.build(side, client.batch)
        for _ in range(PAIRED_WARMUP_CALLS):
            warm_results[side_name] = call()
        sides[side_name] = side, call
    inductor_xpugraph.disable("cuda")
    times: dict[str, list[float]] = {side_name: [] for side_name in sides}
    for _ in range(calls):
        for side_name, (_, call) in sides.items():
            start = time.perf_counter()
            call()
            times[side_name].append(time.perf_counter() - start)
    mine, theirs = times[ours], times["upstream"]
    blocks = measure.block_ratios(theirs, mine, PAIRED_BLOCK)
    return {
        "client": name, "calls": calls,
        "ours_ms": statistics.median(mine) * 1e3, "upstream_ms": statistics.median(theirs) * 1e3,
        "speedup": statistics.median(theirs) / statistics.median(mine),
        "block_range": [min(blocks), max(blocks)],
        # After the warmup calls: a long training run may drift apart in the last digits,
        # as kernels that accumulate with atomics need not add in one order.
        "results_equal": warm_results[ours] == warm_results["upstream"],
        "graphs": {side_name: side.counters() for side_name, (side, _) in sides.items()},
    }  # fmt: skip


def paired(args) -> None:
    import inductor_xpugraph

    print(measure.header(f"Paired, ours = {args.paired}", "cuda"))
    print("| client | ours ms | upstream ms | speedup | per-block range | results equal | graphs |")
    print("|---" * 7 + "|")
    rows = []
    for name in args.clients:
        rows.append(row := run_paired(name, args.calls or 300, args.paired))
        low, high = row["block_range"]
        cells = [f"{row['ours_ms']:.3f}", f"{row['upstream_ms']:.3f}", f"{row['speedup']:.3f}x"]
        cells += [f"{low:.2f}-{high:.2f}x", str(row["results_equal"]), str(row["graphs"])]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
        measure.write_json(args.out, rows)
        inductor_xpugraph.reset()
        torch._dynamo.reset()


def run_one(client_name: str, variant_name: str, device: str, calls: int | None) -> dict:
    """One (client, variant) in this process: its row."""
    variant = measure.Variant(variant_name, device).select()
    client = CLIENTS[client_name]
    if calls is None:
        calls = client.calls if variant.graphs else client.ungraphed_calls or client.calls
    memory = measure.DeviceMemory(device).start()
    call = client.build(variant, client.batch)
    times, result, steady_from = [], "", max(2, calls - STEADY_CALLS)
    for i in range(calls):
        if i == steady_from:
            records_before = (variant.counters() or {}).get("records")
        start = time.perf_counter()
        result = call()
        measure.synchronize(device)
        times.append(time.perf_counter() - start)
    steady = times[steady_from:]
    row: dict[str, Any] = {"client": client_name, "variant": variant_name, "calls": calls}
    row.update(result=result, first_ms=times[0] * 1e3, second_ms=times[1] * 1e3)
    row["steady_ms"] = statistics.median(steady) * 1e3
    if hasattr(call, "tokens_per_call"):
        row["tokens_per_s"] = call.tokens_per_call * len(steady) / sum(steady)
    row.update(memory.mib())
    row["graphs"] = variant.counters()
    if row["graphs"] is not None:
        row["steady_records"] = row["graphs"]["records"] - records_before
    if hasattr(call, "new_tokens") and variant.graphs:
        row["ms_per_token"] = token_time(variant, call)
    if variant.ours:
        import inductor_xpugraph

        row["skip_reasons"] = inductor_xpugraph.stats()["skip_reasons"]
    return row


def report(rows: list[dict], device: str) -> None:
    print(measure.header("Real clients", device))
    print("| client | variant | steady | 1st s | 2nd ms | peak / reserved MiB | after MiB "
          "| result | steady records | graphs |")  # fmt: skip
    print("|---" * 10 + "|")
    for row in rows:
        if "error" in row:
            print(f"| {row['client']} | {row['variant']} | error: {row['error']} |" + " |" * 7)
            continue
        rate, peak = row.get("tokens_per_s"), row.get("peak_mib")
        steady = f"{rate:.0f} tok/s" if rate else f"{row['steady_ms']:.2f} ms"
        memory = "-" if peak is None else f"{peak:.0f} / {row['peak_reserved_mib']:.0f}"
        cells = [row["client"], row["variant"], steady, f"{row['first_ms'] / 1e3:.1f}"]
        cells += [f"{row['second_ms']:.0f}", memory, str(row.get("after_mib", "-")), row["result"]]
        cells += [str(row.get("steady_records", "-")), str(row.get("graphs") or "-")]
        print("| " + " | ".join(cells) + " |")
    for client in dict.fromkeys(row["client"] for row in rows):
        by_variant = {r["variant"]: r for r in rows if r["client"] == client and "error" not in r}
        upstream = by_variant.get("upstream")
        for ours in ("ours", "ours_portable"):
            if upstream and ours in by_variant:
                mine = by_variant[ours]
                speed = upstream["steady_ms"] / mine["steady_ms"]
                memory = mine.get("peak_mib", 0) / max(upstream.get("peak_mib", 0), 1e-9)
                print(
                    f"{client}: {ours} vs upstream: {speed:.2f}x speed, {memory:.2f}x peak memory"
                )
    breakdowns = [row for row in rows if row.get("ms_per_token")]
    if breakdowns:
        print("\n| client | variant | ms per token | compiled forward, host | its graph runtime, "
              "host | device busy |")  # fmt: skip
        print("|---" * 6 + "|")
    for row in breakdowns:
        times = row["ms_per_token"]
        cells = [row["client"], row["variant"]]
        for key in ("total", "compiled_host", "runtime_host", "device_busy"):
            cells.append(f"{times[key]:.3f}" if key in times else "-")
        print("| " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add, variants = parser.add_argument, measure.VARIANTS
    add("--clients", nargs="*", default=None, choices=list(CLIENTS))
    add("--variants", nargs="*", default=list(variants), choices=variants)
    add("--paired", nargs="?", const="ours", choices=("ours", "ours_portable"),
        help="ours and upstream in one process, their calls alternating (cuda)")  # fmt: skip
    add("--device", default=measure.default_device())
    add("--calls", type=int, default=None, help="override every client's (--paired: 300)")
    add("--out", default=None)
    add("--child", nargs=2, metavar=("CLIENT", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_one(*args.child, args.device, args.calls)))
        return
    if args.paired:
        if not torch.cuda.is_available():
            parser.error("--paired runs beside upstream's CUDA Graph Trees: it needs cuda")
        args.clients = args.clients or list(PAIRABLE)
        unpairable = [name for name in args.clients if name not in PAIRABLE]
        if unpairable:
            parser.error(f"--paired runs {', '.join(PAIRABLE)}; not {', '.join(unpairable)}")
        paired(args)
        return
    args.clients = args.clients or [name for name in CLIENTS if not name.endswith("_small")]
    variants = [v for v in args.variants if args.device == "cuda" or v != "upstream"]
    rows = []
    for client in args.clients:
        for variant in variants:
            argv = [os.path.abspath(__file__), "--child", client, variant, "--device", args.device]
            argv += ["--calls", str(args.calls)] if args.calls else []
            rows.append({"client": client, "variant": variant, **measure.in_fresh_process(argv)})
            print(json.dumps(rows[-1]), flush=True)
            measure.write_json(args.out, rows)
    report(rows, args.device)


if __name__ == "__main__":
    main()
