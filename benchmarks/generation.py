"""Hugging Face ``generate`` with graphs, the three ways that keep a static KV cache
(docs/generation.md), ours against upstream's CUDA Graph Trees, on a Llama-shaped model
(8 layers, 512 wide, bf16, random weights, batch 1, 16-token prompts, 128 new tokens, greedy).

    PYTHONPATH=. python3 benchmarks/generation.py [--calls 20] [--ways lazy hf] [--out r.json]

Ways:
- ``lazy``: ``model.forward = torch.compile(model.forward, mode="reduce-overhead")`` and one
  ``StaticCache`` passed to every call, made lazily inside the first compiled prefill;
- ``early``: the same, with the cache made first (``cache.early_initialization(...)``);
- ``hf``: transformers' own path, ``cache_implementation="static"`` with a ``CompileConfig``
  (it compiles the decode step itself and makes a new cache per call).

Each (way, implementation) runs in a fresh process with an Inductor cache of its own: a crash is
that row's (upstream's trees crash on ``lazy``). Every call is synchronized. Reported per row:
``tok/s`` over the last 10 calls, ``ms/call`` (median of those), the first call's seconds,
``equal`` (calls whose tokens equal those of the same way compiled without graphs, which
the graphs must reproduce), ``records/call`` over the last 10 calls (ours:
``stats()``; upstream: calls of its ``record_function``), and ``peak reserved`` (the caching
allocator's high-water mark, graph pools included); ``graphs``, our counters over all calls
(upstream: its records), and ``compiled_graphs``, Dynamo's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

WAYS = ("lazy", "early", "hf")
IMPLS = ("ours", "ours_owned", "upstream")  # ours_owned: owned outputs (xpu's strategy)
NEW_TOKENS = 128
LAST = 10  # steady-state figures over the last this-many calls
OUR_COUNTERS = ("warmups", "records", "replays", "rerecords", "fallbacks", "handovers", "skips")


def build_model(device: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
        num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=512,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device, torch.bfloat16).eval()


def count_upstream_records() -> list[int]:
    """A one-element counter of the captures upstream's trees make."""
    from torch._inductor import cudagraph_trees

    count = [0]
    record = cudagraph_trees.CUDAGraphTreeManager.record_function

    def counted(self, *args, **kwargs):
        count[0] += 1
        return record(self, *args, **kwargs)

    cudagraph_trees.CUDAGraphTreeManager.record_function = counted
    return count


def generate(model, prompt, **options):
    return model.generate(
        prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
        pad_token_id=0, **options,
    )  # fmt: skip


def way_calls(model, way: str, mode: str):
    """A function that runs one request on ``model`` the way ``way`` does, compiled with
    ``mode`` (the model's original forward is kept as ``model._eager_forward``)."""
    import transformers

    if way == "hf":
        compile_config = transformers.CompileConfig(mode=mode)
        compile_config._compile_all_devices = True  # the CPU emulator too
        return lambda prompt: generate(
            model, prompt, cache_implementation="static", compile_config=compile_config
        )
    forward = model.__dict__.setdefault("_eager_forward", model.forward)
    model.forward = torch.compile(forward, mode=mode)
    config = model.config
    cache = transformers.StaticCache(config=config, max_cache_len=16 + NEW_TOKENS)
    if way == "early":
        cache.early_initialization(
            batch_size=1, num_heads=config.num_key_value_heads,
            head_dim=config.hidden_size // config.num_attention_heads,
            dtype=model.dtype, device=model.device,
        )  # fmt: skip

    def one_call(prompt):
        cache.reset()
        return generate(model, prompt, past_key_values=cache)

    return one_call


def prompts_on(device: str) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(3, 32000, (1, 16), generator=generator).to(device) for _ in range(2)]


def run_paired(ways: list[str], calls: int, device: str) -> dict:
    """Ours, one model per way in one process, their calls alternating: tokens/s over the
    last 10 rounds each, free of the drift between processes."""
    import inductor_xpugraph

    inductor_xpugraph.enable(device)
    prompts = prompts_on(device)
    runners = [way_calls(build_model(device), way, "reduce-overhead") for way in ways]
    times: list[list[float]] = [[] for _ in ways]
    for i in range(calls):
        for runner, spent in zip(runners, times):
            start = time.perf_counter()
            runner(prompts[i % 2])
            torch.cuda.synchronize(device)
            spent.append(time.perf_counter() - start)
    rates = {
        way: round(NEW_TOKENS * LAST / sum(spent[-LAST:]), 1) for way, spent in zip(ways, times)
    }
    return {"paired": rates, "graphs": {k: inductor_xpugraph.stats()[k] for k in OUR_COUNTERS}}


def note_capture_times(total_ms: list[float]) -> None:
    """Add the capture time of each step our trees log (``CAPTURES_OF_A_STEP``) to
    ``total_ms[0]``."""
    import logging

    from inductor_xpugraph.trees import messages

    class CaptureTimes(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.msg == messages.CAPTURES_OF_A_STEP:
                total_ms[0] += record.args[2]

    logger = logging.getLogger("inductor_xpugraph")
    logger.setLevel(logging.INFO)
    logger.addHandler(CaptureTimes())
    logger.propagate = False  # the info lines go to the handler only


def run_one(way: str, impl: str, calls: int, device: str) -> dict:
    import inductor_xpugraph

    capture_ms = [0.0]
    if impl.startswith("ours"):
        inductor_xpugraph.enable(device)
        inductor_xpugraph.config.allocator_checkpointing = impl == "ours"
        records = lambda: inductor_xpugraph.stats()["records"]  # noqa: E731
        note_capture_times(capture_ms)
        counters = lambda: {k: inductor_xpugraph.stats()[k] for k in OUR_COUNTERS}  # noqa: E731
    else:
        inductor_xpugraph.disable(device)
        upstream = count_upstream_records()
        records = lambda: upstream[0]  # noqa: E731
        counters = lambda: {"records": upstream[0]}  # noqa: E731
    model = build_model(device)
    prompts = prompts_on(device)

    # What the graphs must reproduce: Inductor's kernels without graphs (bf16 eager rounds
    # differently, and 128 greedy tokens amplify that).
    with_kernels = way_calls(model, way, "default")
    expected = [with_kernels(p) for p in prompts]
    torch._dynamo.reset()
    one_call = way_calls(model, way, "reduce-overhead")

    times, equal, records_at, capture_ms_at = [], 0, [], []
    for i in range(calls):
        records_at.append(records())
        capture_ms_at.append(capture_ms[0])
        start = time.perf_counter()
        tokens = one_call(prompts[i % 2])
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
        equal += bool(torch.equal(tokens, expected[i % 2]))
    last = times[-LAST:]
    return {
        "way": way,
        "impl": impl,
        "tok_per_s": round(NEW_TOKENS * len(last) / sum(last), 1),
        "ms_per_call": round(statistics.median(last) * 1e3, 2),
        "first_call_s": round(times[0], 2),
        "equal": f"{equal}/{calls}",
        "records_per_call": round((records() - records_at[-LAST]) / LAST, 2),
        # Ours only: milliseconds spent capturing, per call (the cost of its records).
        "capture_ms_per_call": round((capture_ms[0] - capture_ms_at[-LAST]) / LAST, 2),
        "peak_reserved_mib": round(torch.cuda.max_memory_reserved(device) / 2**20, 1),
        "graphs": counters(),  # over all calls
        "compiled_graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"],
    }


def run_in_fresh_process(way: str, impl: str, calls: int, device: str) -> dict:
    with tempfile.TemporaryDirectory() as cache_dir:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir)
        command = [sys.executable, __file__, "--one", way, impl, "--calls", str(calls),
                   "--device", device]  # fmt: skip
        done = subprocess.run(command, env=env, capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            return json.loads(line)
    tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"way": way, "impl": impl, "failed": f"exit {done.returncode}: {tail[:160]}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=["ours", "upstream"])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", help="write the rows as JSON here too")
    parser.add_argument(
        "--paired", nargs="+", choices=WAYS, help="ours only: these ways in one process, in turn"
    )
    parser.add_argument("--one", nargs=2, metavar=("WAY", "IMPL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.paired:
        print(json.dumps(run_paired(args.paired, args.calls, args.device)), flush=True)
        return
    if args.one:
        print(json.dumps(run_one(*args.one, args.calls, args.device)), flush=True)
        return
    print(f"{torch.cuda.get_device_name(args.device)}, torch {torch.__version__}")
    rows = []
    for way in args.ways:
        for impl in args.impls:
            row = run_in_fresh_process(way, impl, args.calls, args.device)
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
