"""Side by side, in one process on one device: eager, Inductor default, upstream
``mode="reduce-overhead"`` (Inductor's own CUDA Graph Trees), ours, and a raw graph replay of
the same compiled code (the floor). Ours runs with allocator checkpointing (the cuda default)
or, with ``--memory owned``, with owned outputs (the portable strategy xpu uses): the memory
strategy belongs to the device's tree, so one per process.

Run on the GPU machine from the repository root, one workload per process:

    PYTHONPATH=. python3 benchmarks/compare.py --workload add_one [--memory owned] [--out r.json]

Workloads: ``add_one`` (``x + 1`` on 16 floats: pure overhead), ``softmax_chain`` (32 ×
(matmul 64² + softmax), batch 4: launch-bound), ``decode`` (one decode step of a 4-layer
transformer at batch 1 with a static KV cache, gpt-fast style), ``train_mlp`` and
``train_gpt2`` (forward + backward + SGD step; GPT-2 from ``transformers``, random weights).

For each variant, in this order:
1. first calls: every variant is compiled and run 3 times (filling the FX cache); then,
   ``--cold-starts`` times, Dynamo and the graph trees are reset and the variants are built
   again one by one, starting with another variant each time. The times of a variant's
   first two calls are what a warm-cache process pays to warm up and record (cache lookup +
   warmup, then record + first replay): the median over the cold starts is reported, the
   ratio of each one, and the time spent inside the trees (``timing_tree_entry_points``);
2. peak memory, each variant in a fresh process: peak allocated above what was allocated
   before the model was built (cuBLAS workspaces cleared), over its first 22 calls;
3. per-call host time: after a last reset, all variants are built again; then repeats of
   N back-to-back calls + one synchronize, the variants interleaved inside each repeat (so
   drift of the shared machine hits all of them alike); the median per variant;
4. GPU span: CUDA events around one call issued on an idle device, median of 50.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch._inductor.cudagraph_trees as upstream_trees

import inductor_xpugraph
from inductor_xpugraph.trees.graphed_callable import GraphedCallable

VARIANTS = ("eager", "inductor", "upstream", "ours", "raw_graph")
PEAK_CALLS = 22  # warmup, record, then replays


# -- workloads: each returns (make_step, make_inputs, trains) ---------------------------------
# make_step(compile) returns the callable to time; compile is a function (module/fn -> compiled).


def add_one(device):
    def make_step(compile):
        return compile(lambda x: x + 1)

    return make_step, lambda: (torch.randn(16, device=device),), False


def softmax_chain(device, static_weights=False):
    """``static_weights``: the weights (plain tensors the function closes over, not
    parameters, so copied into the graph's buffers at every call by default) are marked with
    ``torch._dynamo.mark_static_address``: read in place, as a hand-captured graph does."""
    torch.manual_seed(0)
    weights = [torch.randn(64, 64, device=device) * 0.1 for _ in range(32)]
    if static_weights:
        for w in weights:
            torch._dynamo.mark_static_address(w)

    def chain(x):
        for w in weights:
            x = torch.softmax(x @ w, dim=-1)
        return x

    def make_step(compile):
        return compile(chain)

    return make_step, lambda: (torch.randn(4, 64, device=device),), False


class DecoderLayer(torch.nn.Module):
    def __init__(self, dim: int, heads: int, max_len: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.out = torch.nn.Linear(dim, dim, bias=False)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim)
        )
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        cache_shape = (1, heads, max_len, self.head_dim)
        self.register_buffer("k_cache", torch.zeros(cache_shape))
        self.register_buffer("v_cache", torch.zeros(cache_shape))

    def forward(self, x, pos, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, self.head_dim).transpose(1, 2) for z in (q, k, v))
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        attn = torch.nn.functional.scaled_dot_product_attention(
            q, self.k_cache, self.v_cache, attn_mask=mask
        )
        x = x + self.out(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class TinyDecoder(torch.nn.Module):
    """A 4-layer decoder with a static KV cache: one call is one decode step at batch 1."""

    def __init__(self, vocab=5000, dim=256, heads=4, layers=4, max_len=256) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.layers = torch.nn.ModuleList(DecoderLayer(dim, heads, max_len) for _ in range(layers))
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.register_buffer("causal", torch.ones(max_len, max_len, dtype=torch.bool).tril())

    def forward(self, token, pos):
        mask = self.causal[pos].view(1, 1, 1, -1)
        x = self.embed(token)
        for layer in self.layers:
            x = layer(x, pos, mask)
        return self.head(x)


def decode(device):
    torch.manual_seed(0)
    model = TinyDecoder().to(device).eval()
    position = iter(range(10**9))

    def make_step(compile):
        compiled = compile(model)

        def step(token, pos):
            with torch.no_grad():
                return compiled(token, pos)

        return step

    def inputs():
        pos = next(position) % 256
        return (
            torch.randint(0, 5000, (1, 1), device=device),
            torch.tensor([pos], device=device),
        )

    return make_step, inputs, False


def train_mlp(device):
    def build():
        torch.manual_seed(0)
        layers = []
        for _ in range(4):
            layers += [torch.nn.Linear(1024, 1024), torch.nn.GELU()]
        return torch.nn.Sequential(*layers).to(device)

    def loss_fn(out, x):
        return out.square().mean()

    return _training(build, loss_fn, lambda: (torch.randn(64, 1024, device=device),))


def train_gpt2(device):
    from transformers import GPT2Config, GPT2LMHeadModel

    def build():
        torch.manual_seed(0)
        config = GPT2Config(
            n_layer=4, n_head=4, n_embd=256, vocab_size=5000, n_positions=128,
            attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0,
        )  # fmt: skip
        return GPT2LMHeadModel(config).to(device)

    def loss_fn(out, ids):
        logits = out.logits if hasattr(out, "logits") else out[0]
        return torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1)
        )

    return _training(build, loss_fn, lambda: (torch.randint(0, 5000, (8, 128), device=device),))


def _training(build, loss_fn, inputs):
    def make_step(compile):
        model = build()
        compiled = compile(model)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step(*batch):
            loss = loss_fn(compiled(*batch), *batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        return step

    return make_step, inputs, True


WORKLOADS = {
    "add_one": add_one,
    "softmax_chain": softmax_chain,
    "decode": decode,
    "train_mlp": train_mlp,
    "train_gpt2": train_gpt2,
}


# -- variants ---------------------------------------------------------------------------------


def reset_all(device: str) -> None:
    torch._dynamo.reset()
    inductor_xpugraph.reset()
    upstream_trees.reset_cudagraph_trees()


def compiler(variant: str, device: str) -> Callable[[Any], Any]:
    """How a variant turns a function or module into what is timed.

    The registration is switched here and used when the returned function first runs
    (compiles); code compiled earlier keeps the wrapper it was compiled with.
    """
    if variant == "eager":
        return lambda fn: fn
    if variant == "inductor":
        inductor_xpugraph.disable(device)
        return lambda fn: torch.compile(fn)
    if variant == "upstream":
        inductor_xpugraph.disable(device)
        return lambda fn: torch.compile(fn, mode="reduce-overhead")
    inductor_xpugraph.enable(device)
    return lambda fn: torch.compile(fn, options=REDUCE_OVERHEAD_OPTIONS)


# Exactly the options mode="reduce-overhead" sets, spelled differently: Dynamo's cache is per
# code object and would otherwise hand ours the code compiled for upstream.
REDUCE_OVERHEAD_OPTIONS = {"triton.cudagraphs": True, "triton.cudagraph_trees": True}


def raw_graph_step(make_step, make_inputs, device):
    """The floor: Inductor's default compiled code captured by hand in one graph."""
    inductor_xpugraph.disable(device)
    step = make_step(lambda fn: torch.compile(fn))
    static = [t.clone() for t in make_inputs()]
    for _ in range(3):
        step(*static)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(*static)

    def replay(*args):
        for dst, src in zip(static, args):
            dst.copy_(src)
        graph.replay()
        return out

    return replay


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", choices=sorted(WORKLOADS), required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument(
        "--memory", choices=("checkpointing", "owned"), default="checkpointing",
        help="ours: allocator checkpointing (cuda default) or owned outputs (portable, xpu's)",
    )  # fmt: skip
    parser.add_argument(
        "--cold-starts", type=int, default=5,
        help="first calls: times each variant is rebuilt from a reset; medians are reported",
    )  # fmt: skip
    parser.add_argument("--out", default=None)
    parser.add_argument("--peak-of", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    # Our memory strategy is per device tree, read when the tree is created: one per process.
    inductor_xpugraph.config.allocator_checkpointing = args.memory == "checkpointing"
    if args.peak_of:
        print_peak(args.workload, args.peak_of)
        return
    device = args.device
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    make_step, make_inputs, trains = WORKLOADS[args.workload](device)
    variants = [v for v in VARIANTS if cuda or v not in ("upstream", "raw_graph")]
    if trains:  # a hand capture of a whole training step is not a fair floor
        variants = [v for v in variants if v != "raw_graph"]

    for variant in variants:  # fill the FX cache: every variant then starts from a warm one
        if variant not in ("eager", "raw_graph"):
            step = make_step(compiler(variant, device))
            for _ in range(3):
                step(*make_inputs())
            sync()
            del step

    rows: dict[str, dict[str, Any]] = {v: {} for v in variants}
    built = [v for v in variants if v != "raw_graph"]
    first_calls: dict[str, list[tuple[float, float]]] = {v: [] for v in built}
    in_trees: dict[str, list[float]] = {v: [] for v in built}
    for cold_start in range(args.cold_starts):
        reset_all(device)
        shift = cold_start % len(built)  # another variant goes first each time
        for variant in built[shift:] + built[:shift]:
            gc.collect()
            step = make_step(compiler(variant, device))
            with timing_tree_entry_points(sync) as tree_seconds:
                first_calls[variant].append(
                    tuple(_time_call(step, make_inputs, sync) for _ in "12")
                )
            in_trees[variant].append(tree_seconds[0] * 1e3)
            del step
    for variant, times in first_calls.items():
        rows[variant]["first_call_ms"] = statistics.median(t[0] for t in times)
        rows[variant]["second_call_ms"] = statistics.median(t[1] for t in times)
        rows[variant]["first_two_ms_each_start"] = [t[0] + t[1] for t in times]
        rows[variant]["in_trees_ms_each_start"] = in_trees[variant]

    if cuda:
        for variant in built:
            rows[variant]["peak_mib"] = peak_in_fresh_process(args.workload, args.memory, variant)

    reset_all(device)
    steps: dict[str, Callable[..., Any]] = {}
    for variant in variants:  # built once more, for the timed loops
        if variant == "raw_graph":
            steps[variant] = raw_graph_step(make_step, make_inputs, device)
            continue
        steps[variant] = step = make_step(compiler(variant, device))
        for _ in range(PEAK_CALLS):  # past warmup and record, as in the peak measurement
            step(*make_inputs())
        sync()

    inputs = make_inputs()  # one set of inputs for the timed loops (decode: a fixed position)
    samples: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(args.repeats):
        for variant in variants:
            step = steps[variant]
            sync()
            start = time.perf_counter()
            for _ in range(args.calls):
                step(*inputs)
            sync()
            samples[variant].append((time.perf_counter() - start) / args.calls * 1e6)
    rows["ours"]["stats"] = {
        k: v for k, v in inductor_xpugraph.stats().items() if k != "skip_reasons"
    }
    rows["ours"]["memory"] = args.memory
    for variant in variants:
        rows[variant]["host_us"] = statistics.median(samples[variant])
        rows[variant]["host_us_iqr"] = _iqr(samples[variant])
        if cuda:
            rows[variant]["gpu_span_us"] = _gpu_span_us(steps[variant], inputs)

    report(args.workload, device, variants, rows, trains)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"workload": args.workload, "rows": rows}, f, indent=2)


@contextlib.contextmanager
def timing_tree_entry_points(sync):
    """Wall time spent inside the graph trees, synchronized, as a one-element list of seconds.

    Times the outermost calls of the trees' entry points: ours, ``GraphedCallable.__call__``
    (warmups, records, replays); upstream's, ``cudagraphify`` (its tree manager's creation
    and first run) and ``CUDAGraphTreeManager.run``. What remains of a first call is shared
    by every compiled variant: Dynamo, the cache lookups, loading the compiled code.
    """
    spent, depth = [0.0], [0]

    def timed(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            depth[0] += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    sync()
                    spent[0] += time.perf_counter() - start

        return wrapper

    entry_points = [
        (GraphedCallable, "__call__"),
        (upstream_trees, "cudagraphify"),
        (upstream_trees.CUDAGraphTreeManager, "run"),
    ]
    originals = [getattr(owner, name) for owner, name in entry_points]
    for (owner, name), original in zip(entry_points, originals):
        setattr(owner, name, timed(original))
    try:
        yield spent
    finally:
        for (owner, name), original in zip(entry_points, originals):
            setattr(owner, name, original)


def peak_in_fresh_process(workload: str, memory: str, variant: str) -> float:
    """Peak memory of a variant's first ``PEAK_CALLS`` calls, measured in a new process.

    Nothing else is allocated there. In this process, what the variants built earlier hold
    or free during the measured calls shifts the count, by 0.5 to 16 MiB on the H100.
    """
    command = [sys.executable, __file__, "--workload", workload, "--memory", memory]
    command += ["--peak-of", variant]
    result = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(result.stdout.splitlines()[-1])["peak_mib"]


def print_peak(workload: str, variant: str) -> None:
    """``--peak-of``: peak allocated above what was allocated before the variant was built
    (with cuBLAS workspaces cleared), over its first ``PEAK_CALLS`` calls."""
    make_step, make_inputs, _ = WORKLOADS[workload]("cuda")
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step = make_step(compiler(variant, "cuda"))
    for _ in range(PEAK_CALLS):
        step(*make_inputs())
    torch.cuda.synchronize()
    print(json.dumps({"peak_mib": (torch.cuda.max_memory_allocated() - base) / 2**20}))


def _time_call(step, make_inputs, sync) -> float:
    inputs = make_inputs()
    sync()
    start = time.perf_counter()
    step(*inputs)
    sync()
    return (time.perf_counter() - start) * 1e3


def _iqr(samples: list[float]) -> float:
    q = statistics.quantiles(samples, n=4)
    return q[2] - q[0]


def _gpu_span_us(step, inputs, repeats=50) -> float:
    spans = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        step(*inputs)
        end.record()
        torch.cuda.synchronize()
        spans.append(start.elapsed_time(end) * 1e3)
    return statistics.median(spans)


def report(workload, device, variants, rows, trains) -> None:
    name = torch.cuda.get_device_name() if device == "cuda" else device
    print(f"## {workload} — {name}, torch {torch.__version__}")
    print("| variant | host µs/call (IQR) | GPU span µs | 1st call ms | 2nd call ms | peak MiB |")
    print("|---|---|---|---|---|---|")
    for v in variants:
        r = rows[v]
        cells = [
            f"{r['host_us']:.1f} ({r['host_us_iqr']:.1f})",
            _fmt(r.get("gpu_span_us"), ".1f"),
            _fmt(r.get("first_call_ms"), ".1f"),
            _fmt(r.get("second_call_ms"), ".1f"),
            _fmt(r.get("peak_mib"), ".1f"),
        ]
        print(f"| {v} | " + " | ".join(cells) + " |")
    host = {v: rows[v]["host_us"] for v in variants}
    ours = rows["ours"]
    print(f"ours ({ours['memory']}) stats: {ours['stats']}")
    if "upstream" in host:
        up, ind = host["upstream"], host["inductor"]
        print(
            "tree overhead (ours - inductor) / (upstream - inductor): "
            f"{(host['ours'] - ind) / (up - ind):.3f}  "
            f"[{host['ours'] - ind:+.1f} µs vs {up - ind:+.1f} µs]"
        )
        upstream = rows["upstream"]
        first = ours["first_call_ms"] + ours["second_call_ms"]
        up_first = upstream["first_call_ms"] + upstream["second_call_ms"]
        per_start = [
            f"{a / b:.2f}"
            for a, b in zip(ours["first_two_ms_each_start"], upstream["first_two_ms_each_start"])
        ]
        print(
            f"first two calls ours / upstream (medians): {first / up_first:.2f}  "
            f"[each cold start: {' '.join(per_start)}]"
        )
        ours_tree = statistics.median(ours["in_trees_ms_each_start"])
        up_tree = statistics.median(upstream["in_trees_ms_each_start"])
        print(
            f"time in the trees during the first two calls (warmup + record), medians: "
            f"ours {ours_tree:.1f} ms, upstream {up_tree:.1f} ms, ratio {ours_tree / up_tree:.2f}"
        )
        if ours.get("peak_mib") and upstream.get("peak_mib"):
            print(f"peak memory ours / upstream: {ours['peak_mib'] / upstream['peak_mib']:.2f}")
    if "raw_graph" in host:
        for variant in ("ours", "upstream"):
            print(f"{variant} / raw graph: {host[variant] / host['raw_graph']:.3f}")


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


if __name__ == "__main__":
    main()
