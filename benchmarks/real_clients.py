"""Real clients, the way users run them: Hugging Face ``generate``, a process that swaps models,
AdamW training loops, torchvision ResNet-18 and a BERT encoder. Random weights, no downloads.

Run on the GPU machine from the repository root (``--clients`` picks some; default all):

    PYTHONPATH=. python3 benchmarks/real_clients.py [--clients generate_b1 bert_b1] [--out r.json]

Each (client, variant) runs in a fresh process with an empty Inductor cache of its own, so a
variant's first calls, peak memory and failures are its own: every row compiles and
autotunes as a first run does. (With one cache shared, the first row to compile a kernel
autotuned it and the later rows found it cached: on the H100 the autotuner's 50 MiB L2-flush
buffer then landed in the first row's peak only.)

Variants: ``eager``; ``inductor`` (default mode, no graphs);
``upstream`` (``mode="reduce-overhead"``, Inductor's CUDA Graph Trees); ``ours`` (the same
mode with this package enabled for the device: allocator checkpointing, the cuda default)
and ``ours_portable`` (ours with owned outputs: the strategy xpu uses). With ``--device cpu``
the emulator runs ``ours`` beside eager and Inductor (no timings worth reporting; a check
that the clients run).

Every call is synchronized, as a caller that uses each result is. Reported per row:
- ``steady``: per-call time over the last 10 calls (generate: tokens/s over the last 10);
- ``1st`` / ``2nd``: the first two calls (compile + warmup, then record + first replay);
- ``peak``: peak allocated memory above what was allocated before the client was built
  (cuBLAS workspaces cleared first);
- ``result``: a fingerprint of the client's result (generated tokens, final loss, an output
  checksum), which should agree with Inductor's: the graphs compute what the kernels compute;
- ``graphs``: our counters (records, replays, re-records, fallbacks, handovers, skips), or
  upstream's ``cudagraph_skips``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

VARIANTS = ("eager", "inductor", "upstream", "ours", "ours_portable")
STEADY_CALLS = 10  # the steady-state figure is taken over the last this-many calls
OUR_COUNTERS = ("records", "replays", "rerecords", "fallbacks", "handovers", "skips")


@dataclass
class Variant:
    name: str
    device: str
    # Our counters as they stood at each reset_graphs() (which zeroes them), summed.
    counters_before_resets: Counter = field(default_factory=Counter)

    @property
    def graphs(self) -> bool:
        return self.name not in ("eager", "inductor")

    def select(self) -> None:
        """Switch this package on or off for the device (one variant per process)."""
        import inductor_xpugraph

        if self.name.startswith("ours"):
            inductor_xpugraph.enable(self.device)
            inductor_xpugraph.config.allocator_checkpointing = self.name == "ours"
        else:
            inductor_xpugraph.disable(self.device)

    def compile(self, fn: Callable) -> Callable:
        if self.name == "eager":
            return fn
        return torch.compile(fn, mode="reduce-overhead" if self.graphs else None)

    def reset_graphs(self) -> None:
        """What a user of this variant calls to drop every graph (no-op without graphs)."""
        import inductor_xpugraph

        if self.name.startswith("ours"):
            counters = inductor_xpugraph.stats()
            self.counters_before_resets.update({k: counters[k] for k in OUR_COUNTERS})
            inductor_xpugraph.reset()
        elif self.name == "upstream":
            from torch._inductor import cudagraph_trees

            cudagraph_trees.reset_cudagraph_trees()


# -- clients: each runs its calls and returns (per-call seconds, result fingerprint, extra) ---


def generate(variant: Variant, batch: int, calls: int) -> tuple[list[float], Any, dict]:
    """``model.generate`` with a static KV cache, results kept by the caller.

    Transformers compiles the decode step itself (``generation_config.compile_config``,
    ``mode="reduce-overhead"``) when the cache is static; a new cache is allocated per call.
    """
    from transformers import CompileConfig, LlamaConfig, LlamaForCausalLM

    device = variant.device
    big = device == "cuda"
    config = LlamaConfig(
        vocab_size=32000, hidden_size=512 if big else 128, intermediate_size=1376 if big else 256,
        num_hidden_layers=8 if big else 2, num_attention_heads=8, num_key_value_heads=8,
        max_position_embeddings=512, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(device, torch.bfloat16 if big else torch.float32).eval()
    prompt = torch.randint(1, 32000, (batch, 16), device=device)
    new_tokens = 128 if big else 8
    compile_config = CompileConfig(mode="reduce-overhead" if variant.graphs else "default")
    compile_config._compile_all_devices = True  # the CPU emulator too
    options: dict[str, Any] = {"disable_compile": True} if variant.name == "eager" else {}
    kept, times = [], []
    for _ in range(calls):
        start = time.perf_counter()
        out = model.generate(
            prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
            cache_implementation="static", compile_config=compile_config, **options,
        )  # fmt: skip
        _sync(device)
        times.append(time.perf_counter() - start)
        kept.append(out)  # as every real caller does
    tokens = kept[-1][:, prompt.shape[1] :]
    return times, _digest(tokens), {"tokens_per_call": batch * new_tokens}


def several_models(variant: Variant, batch: int, calls: int) -> tuple[list[float], Any, dict]:
    """One process, one model after another, the ways notebooks, test runners and servers
    swap them: ``del`` + ``torch._dynamo.reset()``, the variant's own reset, new weights
    loaded in place (``load_state_dict``), a new instance of a class already compiled.

    Each stage's output is compared with the same module run eagerly; the result is the
    largest difference over all stages. A per-call time is the whole sequence's.
    """
    device = variant.device
    worst = 0.0

    def mlp():
        return torch.nn.Sequential(
            torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)
        ).to(device)

    def convnet():
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
            torch.nn.Linear(16 * 16 * 16, 10),
        ).to(device)  # fmt: skip

    def stage(module, compiled, make_input, n=5) -> None:
        nonlocal worst
        with torch.no_grad():
            for _ in range(n):
                x = make_input()
                got, want = compiled(x), module(x)
                worst = max(worst, (got.float() - want.float()).abs().max().item())

    vectors = lambda: torch.randn(batch, 256, device=device)  # noqa: E731
    images = lambda: torch.randn(batch, 3, 16, 16, device=device)  # noqa: E731
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        torch.manual_seed(0)
        first = mlp()
        stage(first, variant.compile(first), vectors)
        del first
        torch._dynamo.reset()
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
        _sync(device)
        times.append(time.perf_counter() - start)
    return times, f"max |compiled - eager| {worst:.1e}", {}


def adamw(variant: Variant, batch: int, calls: int, *, compiled_step: bool = False):
    """A GPT-2 training loop with AdamW; with ``compiled_step`` the optimizer step is compiled
    too, as the PyTorch tutorials show. The result is the last step's loss."""
    from transformers import GPT2Config, GPT2LMHeadModel

    device = variant.device
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=4, n_head=4, n_embd=256, vocab_size=5000, n_positions=128,
        attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0,
    )  # fmt: skip
    model = GPT2LMHeadModel(config).to(device)
    compiled = variant.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-3) if compiled_step else 1e-3)
    opt_step = variant.compile(opt.step) if compiled_step else opt.step
    data = torch.Generator(device=device).manual_seed(1)
    times, loss_value = [], float("nan")
    for _ in range(calls):
        ids = torch.randint(0, 5000, (batch, 128), device=device, generator=data)
        start = time.perf_counter()
        logits = compiled(ids).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1)
        )
        loss.backward()
        opt_step()
        opt.zero_grad(set_to_none=True)
        loss_value = loss.item()  # what a training loop logs; synchronizes
        times.append(time.perf_counter() - start)
    return times, f"loss {loss_value:.4f}", {}


def resnet18(variant: Variant, batch: int, calls: int):
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).to(variant.device).eval()
    x = torch.randn(batch, 3, 224, 224, device=variant.device)
    return _inference(variant, model, (x,), calls)


def bert(variant: Variant, batch: int, calls: int):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    big = variant.device == "cuda"
    config = BertConfig(
        hidden_size=768 if big else 128, num_hidden_layers=12 if big else 2,
        num_attention_heads=12 if big else 4, intermediate_size=3072 if big else 256,
    )  # fmt: skip
    model = BertModel(config).to(variant.device).eval()
    ids = torch.randint(0, config.vocab_size, (batch, 128), device=variant.device)
    return _inference(variant, lambda ids: model(ids).last_hidden_state, (ids,), calls)


def _inference(variant: Variant, model, inputs, calls):
    compiled = variant.compile(model)
    times, checksum = [], 0.0
    with torch.no_grad():
        for _ in range(calls):
            start = time.perf_counter()
            out = compiled(*inputs)
            checksum = out.float().abs().mean().item()  # the caller uses the result
            times.append(time.perf_counter() - start)
    return times, f"mean |out| {checksum:.5f}", {}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _digest(tokens: torch.Tensor) -> str:
    values = tokens.flatten().tolist()
    return f"tokens #{hash(tuple(values)) % 10**8:08d}"


# (client, batch, calls on cuda): the calls of eager and Inductor are capped at
# UNGRAPHED_CALLS where a client is slow without graphs (only the last 10 are reported).
CLIENTS: dict[str, tuple[Callable, int, int]] = {
    "generate_b1": (generate, 1, 100),
    "generate_b4": (generate, 4, 100),
    "several_models": (several_models, 8, 3),
    "adamw": (adamw, 8, 40),
    "adamw_compiled_step": (lambda v, b, n: adamw(v, b, n, compiled_step=True), 8, 40),
    "resnet18_b8": (resnet18, 8, 60),
    "resnet18_b64": (resnet18, 64, 60),
    "bert_b1": (bert, 1, 60),
    "bert_b16": (bert, 16, 60),
}
UNGRAPHED_CALLS = {"generate_b1": 12, "generate_b4": 12}


def run_one(client: str, variant_name: str, device: str, calls: int | None) -> dict:
    """One (client, variant) in this process; returns its row."""
    import inductor_xpugraph

    variant = Variant(variant_name, device)
    variant.select()
    fn, batch, default_calls = CLIENTS[client]
    if calls is None:
        calls = default_calls if variant.graphs else UNGRAPHED_CALLS.get(client, default_calls)
    if device == "cuda":
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    times, fingerprint, extra = fn(variant, batch, calls)
    row: dict[str, Any] = {"client": client, "variant": variant_name, "calls": calls}
    row["result"] = fingerprint
    row["first_ms"], row["second_ms"] = times[0] * 1e3, times[1] * 1e3
    steady = times[-STEADY_CALLS:]
    row["steady_ms"] = statistics.median(steady) * 1e3
    if "tokens_per_call" in extra:
        row["tokens_per_s"] = extra["tokens_per_call"] * len(steady) / sum(steady)
    if device == "cuda":
        row["peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    if variant.name.startswith("ours"):
        counters = inductor_xpugraph.stats()
        total = variant.counters_before_resets + Counter({k: counters[k] for k in OUR_COUNTERS})
        row["graphs"] = {k: total[k] for k in OUR_COUNTERS}
        row["skip_reasons"] = counters["skip_reasons"]
    elif variant.name == "upstream":
        row["graphs"] = dict(torch._dynamo.utils.counters["inductor"]).get("cudagraph_skips", 0)
    return row


def run_in_fresh_process(client: str, variant: str, device: str, calls: int | None) -> dict:
    command = [sys.executable, __file__, "--child", client, variant, "--device", device]
    if calls is not None:
        command += ["--calls", str(calls)]
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        result = subprocess.run(command, capture_output=True, text=True, env=env)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        tail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"client": client, "variant": variant, "error": tail[:300]}
    return json.loads(lines[-1])


def report(rows: list[dict], device: str) -> None:
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (emulator)"
    print(f"## Real clients — {name}, torch {torch.__version__}")
    print("| client | variant | steady | 1st s | 2nd ms | peak MiB | result | graphs |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        if "error" in row:
            print(f"| {row['client']} | {row['variant']} | error: {row['error']} |||||")
            continue
        steady = (
            f"{row['tokens_per_s']:.0f} tok/s"
            if "tokens_per_s" in row
            else f"{row['steady_ms']:.2f} ms"
        )
        peak = f"{row['peak_mib']:.0f}" if "peak_mib" in row else "-"
        cells = [row["client"], row["variant"], steady, f"{row['first_ms'] / 1e3:.1f}"]
        cells += [f"{row['second_ms']:.0f}", peak, row["result"], str(row.get("graphs", "-"))]
        print("| " + " | ".join(cells) + " |")
    for client in dict.fromkeys(row["client"] for row in rows):
        by_variant = {r["variant"]: r for r in rows if r["client"] == client and "error" not in r}
        upstream = by_variant.get("upstream")
        for ours in ("ours", "ours_portable"):
            if upstream and ours in by_variant:
                mine = by_variant[ours]
                speed = upstream["steady_ms"] / mine["steady_ms"]
                memory = mine["peak_mib"] / max(upstream["peak_mib"], 1e-9)
                print(
                    f"{client}: {ours} vs upstream: {speed:.2f}x speed, {memory:.2f}x peak memory"
                )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", nargs="*", default=list(CLIENTS), choices=list(CLIENTS))
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--calls", type=int, default=None, help="override every client's")
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", nargs=2, metavar=("CLIENT", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(*args.child, args.device, args.calls)))
        return
    on_cpu = ("eager", "inductor", "ours")  # upstream's trees need cuda
    variants = [v for v in args.variants if args.device == "cuda" or v in on_cpu]
    rows = []
    for client in args.clients:
        for variant in variants:
            rows.append(run_in_fresh_process(client, variant, args.device, args.calls))
            print(json.dumps(rows[-1]), flush=True)
            if args.out:  # after every row: a run cut short keeps what it measured
                with open(args.out, "w") as f:
                    json.dump(rows, f, indent=2)
    report(rows, args.device)


if __name__ == "__main__":
    main()
