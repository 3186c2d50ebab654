"""Hugging Face ``generate`` six ways on one Llama: tokens/s, where a token's time goes, the graph
counters, peak memory, and whether every call's tokens are right, ours against upstream's CUDA
Graph Trees and eager (README.md: how to run it).

The model: a random-weight Llama of 8 layers × 512, vocabulary 8192, 8 heads and 4 key-value
heads, bf16 on cuda, seed 0; two 16-token prompts taken in turn, batch 1, 128 new tokens
(``min_new_tokens`` too), greedy. The ways (docs/generation.md says what the graphs do in each):

- ``hf``: transformers' own path, ``cache_implementation="static"`` and a ``CompileConfig``
  (transformers compiles the decode step; a new cache per call);
- ``early``, ``lazy``: ``model.forward`` compiled, one ``StaticCache`` passed to every call and
  reset between them, made first (``early_initialization``) or inside the first compiled call;
- ``new_cache``: ``model.forward`` compiled, ``cache_implementation="static"``;
- ``beam``: ``lazy`` with two beams;
- ``assisted``: ``model.forward`` compiled, and a 2-layer draft model's too, passed as
  ``assistant_model``; the default dynamic cache.

Where the user compiled ``model.forward``, ``generate`` gets ``disable_compile=True``: the
decode step is the user's compiled forward (without it, transformers compiles a decode step of
its own around it on a GPU whenever the cache is static). Variants: ``ours``; ``upstream``
(stock ``mode="reduce-overhead"``, cuda only); ``eager`` (nothing compiled, and
``disable_compile=True`` on every way).

Each (way, variant) runs in a fresh process with an empty Inductor cache of its own, as every
suite does (``measure.py``); ``--jobs`` processes at once, with the CPU shared out between them.
A process makes 2 warm calls, then times the others holding a lock with every other process
paused (the zoo's ``exclusive``), so that no compile takes the CPU from them: each call
synchronized, their median giving tokens/s and ms per token; then ``real_clients.token_time``
over two more calls gives the GPU's busy time per token (the union of its kernels' intervals,
under the profiler). The alternating prompts' reference tokens come from the same way
compiled without graphs (``torch.compile``'s default mode, ``CompileConfig(mode="default")``
for ``hf``) in a process of its own: a row says how many of its calls gave them. Every call's
tokens are kept, as servers do. A row that raises says where and the error's first line,
with what it measured before.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402
import real_clients  # noqa: E402
import zoo  # noqa: E402
import zoo_measure  # noqa: E402

WAYS = ("hf", "early", "lazy", "new_cache", "beam", "assisted")
VARIANTS = ("ours", "upstream", "eager")
LONGEST_FIRST = ("assisted", "beam", "lazy", "new_cache", "early", "hf")  # on an H200
REFERENCE = "inductor"  # measure.Variant's name for torch.compile without graphs
WARM_CALLS = 2
PROMPT_TOKENS = 16


def llama_config(device: str, layers: int | None = None):
    """The table's model on a GPU; on the CPU emulator 2 layers × 64, enough to run the script."""
    from transformers import LlamaConfig

    big = device != "cpu"
    return LlamaConfig(
        vocab_size=8192, hidden_size=512 if big else 64,
        intermediate_size=1536 if big else 192, num_attention_heads=8, num_key_value_heads=4,
        num_hidden_layers=layers or (8 if big else 2), max_position_embeddings=512,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip


def llama(config, device: str, seed: int):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    return LlamaForCausalLM(config).to(device, dtype).eval()


def generation(variant: measure.Variant, way: str) -> Callable[[], None]:
    """The model set up for ``way`` and ``variant``; each call generates for the next of two
    prompts and keeps the output (``call.outputs``). ``call.new_tokens`` and ``call.model`` are
    what ``real_clients.token_time`` reads."""
    from transformers import CompileConfig

    device, batch = variant.device, 1
    config = llama_config(device)
    model = llama(config, device, seed=0)
    new_tokens = 8 if device == "cpu" else 128
    seeds = (torch.Generator().manual_seed(seed) for seed in (1, 2))
    prompts = [
        torch.randint(3, config.vocab_size, (batch, PROMPT_TOKENS), generator=g).to(device)
        for g in seeds
    ]
    options: dict[str, Any] = dict(
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0
    )
    cache = None
    if way == "hf":
        options["cache_implementation"] = "static"
        if variant.name == "eager":
            options["disable_compile"] = True
        else:
            mode = "reduce-overhead" if variant.graphs else "default"
            compile_config = CompileConfig(mode=mode)
            compile_config._compile_all_devices = True  # the CPU emulator too
            options["compile_config"] = compile_config
    else:
        options["disable_compile"] = True  # the decode step is the user's compiled forward
        model.forward = variant.compile(model.forward)
        if way == "new_cache":
            options["cache_implementation"] = "static"
        elif way == "assisted":
            draft = llama(llama_config(device, layers=2), device, seed=1)
            draft.forward = variant.compile(draft.forward)
            options["assistant_model"] = draft
        else:
            max_cache_len = PROMPT_TOKENS + new_tokens
            cache = real_clients.static_cache(model, batch, max_cache_len, way == "early")
            options[real_clients.cache_keyword()] = cache
            if way == "beam":
                options["num_beams"] = 2
    outputs: list[torch.Tensor] = []

    def call() -> None:
        if cache is not None:
            cache.reset()
        outputs.append(model.generate(prompts[len(outputs) % 2], **options))

    call.outputs = outputs  # type: ignore[attr-defined]
    call.new_tokens = new_tokens  # type: ignore[attr-defined]
    call.tokens_per_call = batch * new_tokens  # type: ignore[attr-defined]
    call.model = model  # type: ignore[attr-defined]
    return call


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def run_row(way: str, variant_name: str, device: str, calls: int, lock: str | None) -> dict:
    """One (way, variant) in this process. Printed as a JSON line after the warm calls and at
    the end, so that a process that dies between them still reports its warm calls."""
    row: dict[str, Any] = {"way": way, "variant": variant_name, "stage": "setup"}
    variant = measure.Variant(variant_name, device).select()
    memory = measure.DeviceMemory(device).start()
    call: Any = None
    try:
        call = generation(variant, way)
        row["stage"] = "warm calls"
        for _ in range(min(WARM_CALLS, calls)):
            call()
        emit(row, variant, memory, call)
        if calls > WARM_CALLS:
            row["stage"] = "timed calls"
            with zoo_measure.exclusive(lock):
                seconds = []
                for _ in range(calls - WARM_CALLS):
                    start = time.perf_counter()
                    call()
                    measure.synchronize(device)
                    seconds.append(time.perf_counter() - start)
                median = statistics.median(seconds)
                row["tokens_per_s"] = call.tokens_per_call / median
                row["ms_per_token"] = median * 1e3 / call.new_tokens
                row["stage"] = "token_time"
                row["token_time"] = real_clients.token_time(variant, call)
        row["stage"] = "done"
    except Exception as error:
        row["error"] = first_line(error)
        row["traceback"] = traceback.format_exc()[-3000:]
    emit(row, variant, memory, call)
    return row


def emit(row: dict, variant: measure.Variant, memory: measure.DeviceMemory, call: Any) -> None:
    """Bring the row's counters, memory and tokens up to date, and print it."""
    row["graphs"] = variant.counters()
    if variant.ours:
        import inductor_xpugraph

        row["stats"] = inductor_xpugraph.stats()
    row.update(memory.mib())
    if call is not None:
        row["calls_done"] = len(call.outputs)
        row["tokens"] = [out[:, PROMPT_TOKENS:].flatten().tolist() for out in call.outputs]
    print(json.dumps(row), flush=True)


def run_process(
    way: str, variant: str, args, lock: str, groups: zoo.ProcessGroups
) -> dict[str, Any]:
    """A row in a fresh process with empty Inductor and Triton caches and its share of the CPU
    (as the zoo's rows: ``zoo.run_child``), killed past ``--timeout``. Its last JSON line, and
    where the process failed, its exit and the last line of its stderr."""
    calls = 2 if variant == REFERENCE else args.calls  # one call per prompt
    command = [sys.executable, os.path.abspath(__file__), "--child", way, variant]
    command += ["--device", args.device, "--calls", str(calls), "--lock", lock]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="generation_cache_") as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
        env["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")
        share = str(max(1, (os.cpu_count() or 1) // args.jobs))
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", share)
        env.setdefault("OMP_NUM_THREADS", share)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (measure.REPO_ROOT, env.get("PYTHONPATH")) if p
        )
        proc = groups.start(command, env)
        killed = False
        try:
            stdout, stderr = proc.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            killed = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # compile workers left behind, if any
        groups.ended(proc)
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    row: dict[str, Any] = json.loads(lines[-1]) if lines else {"stage": "start"}
    row.update(way=way, variant=variant, wall_s=round(time.perf_counter() - start, 1))
    if killed:
        row["error"] = f"killed after --timeout {args.timeout:.0f} s"
    elif proc.returncode != 0 and "error" not in row:
        tail = (stderr.strip().splitlines() or ["(no output)"])[-1][:300]
        if proc.returncode < 0:  # killed by a signal: a crash, whose last line is seldom why
            name = signal.Signals(-proc.returncode).name
            row["error"] = f"killed by {name} (stderr's last line: {tail})"
        else:
            row["error"] = f"exit {proc.returncode}: {tail}"
    return row


def compare(rows: list[dict]) -> None:
    """Each row's calls against its way's reference tokens (call i used prompt i % 2):
    ``equal`` (calls that gave them), ``first_difference`` (the first call that did not, and the
    first token position where it differs), and ``self_consistent`` (every call gave what the
    row's first call for the same prompt gave)."""
    references = {r["way"]: r for r in rows if r["variant"] == REFERENCE}
    for row in rows:
        reference = references.get(row["way"], {}).get("tokens") or []
        tokens = row.get("tokens") or []
        if row["variant"] == REFERENCE:
            continue
        row["self_consistent"] = all(got == tokens[i % 2] for i, got in enumerate(tokens))
        if len(reference) < min(2, len(tokens)):
            continue
        row["equal"], row["checked"] = 0, len(tokens)
        for i, got in enumerate(tokens):
            expected = reference[i % 2]
            if got == expected:
                row["equal"] += 1
            elif "first_difference" not in row:
                where = next((p for p, (a, b) in enumerate(zip(got, expected)) if a != b), None)
                row["first_difference"] = {"call": i, "position": where}


def equality_cell(row: dict, references: dict[str, dict]) -> str:
    if row["variant"] == REFERENCE:
        return "reference"
    if "equal" not in row or not row["checked"]:
        reference = references.get(row["way"], {})
        return f"no reference ({reference.get('error', 'no tokens')})" if row.get("tokens") else "-"
    cell = f"{row['equal']}/{row['checked']}"
    if "first_difference" in row:
        first = row["first_difference"]
        cell += f" (call {first['call'] + 1} differs from token {first['position']}"
        cell += "; its own calls agree)" if row["self_consistent"] else ")"
    return cell


def report(rows: list[dict], device: str) -> None:
    import transformers

    references = {r["way"]: r for r in rows if r["variant"] == REFERENCE}
    size = "8 layers × 512, bf16" if device != "cpu" else "2 layers × 64, fp32"
    print(measure.header(f"Hugging Face generation, Llama {size}", device))
    print(
        f"\ntransformers {transformers.__version__}; batch 1, {PROMPT_TOKENS}-token prompts "
        f"(two, alternating), {'128' if device != 'cpu' else '8'} new tokens, greedy; "
        f"tokens/s and ms per token: the median of the calls after {WARM_CALLS} warm ones, each "
        "synchronized; GPU busy: the union of the kernels' intervals over one more call. Graph "
        "counters: ours' stats(), upstream's trees' nodes made and run. Equal: calls whose "
        "tokens equal those of the same way compiled without graphs (torch.compile's default "
        "mode) in a process of its own, for the same prompt (in bf16, eager rounds otherwise than "
        "compiled code, and greedy decoding amplifies that).\n"
    )
    print(
        "| way | variant | tok/s | ms per token | GPU busy ms per token | records | replays "
        "| rerecords | fallbacks | peak reserved MiB | equal to reference | error |"
    )
    print("|---" * 12 + "|")
    for row in rows:
        if row["variant"] == REFERENCE and not row.get("error"):
            continue  # the reference rows are listed only where they failed
        graphs, busy = row.get("graphs") or {}, (row.get("token_time") or {}).get("device_busy")
        rate, per_token = row.get("tokens_per_s"), row.get("ms_per_token")
        cells = [row["way"], row["variant"]]
        cells += [f"{rate:.0f}" if rate else "-", f"{per_token:.2f}" if per_token else "-"]
        cells.append(f"{busy:.3f}" if busy is not None else "-")
        cells += [str(graphs.get(key, "-")) for key in ("records", "replays", "rerecords")]
        cells.append(str(graphs.get("fallbacks", "-")))
        reserved = row.get("peak_reserved_mib")
        cells.append(f"{reserved:.0f}" if reserved is not None else "-")
        cells.append(equality_cell(row, references))
        error = row.get("error")
        cells.append(f"{row.get('stage', '')}: {error}" if error else "")
        print("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--device", default=measure.default_device(), choices=("cuda", "cpu"))
    add("--ways", nargs="*", default=list(WAYS), choices=WAYS)
    add("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS)
    add("--calls", type=int, default=None, help="per row (20 on cuda, 3 on the CPU)")
    add("--jobs", type=int, default=None, help="processes at once (4 on cuda, 2 on the CPU)")
    add("--timeout", type=float, default=900.0, help="seconds a process may run, paused or not")
    add("--json", default=None, help="write the rows there, after every row")
    add("--child", nargs=2, metavar=("WAY", "VARIANT"), help=argparse.SUPPRESS)
    add("--lock", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cpu = args.device == "cpu"
    args.calls = args.calls or (3 if cpu else 20)
    if args.child:
        run_row(*args.child, args.device, args.calls, args.lock)
        return
    args.jobs = args.jobs or (2 if cpu else 4)
    variants = [v for v in args.variants if not (cpu and v == "upstream")]
    # The longest compiles first; an eager row (no compile, the longest timed calls) after every
    # three others, so that no eager rows are left at the end waiting for the lock in turn.
    ways = sorted(args.ways, key=LONGEST_FIRST.index)
    compiled = [(way, v) for way in ways for v in (REFERENCE, *variants) if v != "eager"]
    eager = [(way, "eager") for way in ways if "eager" in variants]
    jobs = []
    for i, job in enumerate(compiled):
        jobs += [job, *([eager.pop(0)] if eager and i % 3 == 2 else [])]
    jobs += eager
    table_order = [(way, v) for way in args.ways for v in (*variants, REFERENCE)]
    rows: list[dict] = []
    written, started = threading.Lock(), time.perf_counter()
    import transformers

    meta = {
        "device": measure.device_name(args.device), "torch": torch.__version__,
        "transformers": transformers.__version__, "commit": measure.git_commit(),
        "calls": args.calls, "reference": REFERENCE,
    }  # fmt: skip
    fd, lock = tempfile.mkstemp(prefix="generation_timing_", suffix=".lock")
    os.close(fd)
    groups = zoo.ProcessGroups(lock)

    def one(job: tuple[str, str]) -> None:
        row = run_process(*job, args, lock, groups)
        with written:
            rows.append(row)
            rows.sort(key=lambda r: table_order.index((r["way"], r["variant"])))
            done = f"[{len(rows)}/{len(jobs)}, {time.perf_counter() - started:.0f} s]"
            outcome = row.get("error") or "ok"
            print(f"{done} {job[0]} {job[1]}: {outcome} ({row['wall_s']} s)", file=sys.stderr)
            measure.write_json(args.json, {**meta, "rows": rows})

    try:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            list(pool.map(one, jobs))
    finally:
        for path in (lock, lock + ".groups"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
    compare(rows)
    for row in rows:
        if row["variant"] != REFERENCE:
            row.pop("tokens", None)  # the reference's are kept, and each row's equality
    measure.write_json(args.json, {**meta, "rows": rows})
    report(rows, args.device)


if __name__ == "__main__":
    main()
