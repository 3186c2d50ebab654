"""One (model, mode, implementation) of the zoo, measured in this process; ``zoo.py`` starts one
process per row. The row, a dict, is printed as the last line of stdout.

In order:
1. **reference**: eager on a copy of the model, ``--calls`` calls, each with fresh inputs
   (call i's inputs come from a generator seeded with 1000 + i); outputs (training: the loss and
   every parameter's gradient) kept on the host; the copy is freed;
2. peak memory statistics reset; the implementation built on the model;
3. **correctness**: the same ``--calls`` calls with the same inputs, each result compared with
   the reference. The error of a tensor is max |result - reference| / max |reference|; a row
   passes when the largest is within the dtype's tolerance. The first three calls
   (warmup, record, first replay), each synchronized, are the compile time;
4. **graphs replaying**: one more call under the profiler, counting graph launches
   (``cudaGraphLaunch`` on cuda; on xpu, events with a graph launch's name). The CPU emulator
   is not visible to the profiler: there the count is ``stats()["replays"]`` over the call;
5. **timing**, holding the parent's lock so that no other process times at the same moment:
   ``--timed-calls`` calls with one set of inputs, back to back with one synchronize
   (pipelined), then synchronized after each call; the median of ``--repeats``;
6. peak allocated and reserved memory over steps 2-5 (none on the CPU).

A training call is forward, loss, backward, gradients set to None (no optimizer step).
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import gc
import os
import statistics
import sys
import time
import traceback
from collections import Counter
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(__file__))
import zoo_models  # noqa: E402
from real_clients import Variant  # noqa: E402  (how every suite selects an implementation)

TOLERANCE = {"fp32": 1e-2, "bf16": 1e-1}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
COMPILE_CALLS = 3  # warmup, record, first replay
OUR_COUNTERS = ("warmups", "records", "replays", "rerecords", "fallbacks", "skips")


def synchronize(device: str) -> None:
    if device != "cpu":
        torch.get_device_module(device).synchronize()


def device_name(device: str) -> str:
    if device == "cpu":
        return "cpu (emulator)"
    return torch.get_device_module(device).get_device_name()


def tensors_of(output: Any) -> list[torch.Tensor]:
    """Every tensor of a (nested) output, in order: tuples, lists, dicts, model outputs."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):  # transformers' ModelOutput is an OrderedDict
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in tensors_of(item)]
    return []


class Runner:
    """Calls of one model in one mode: ``call(module, inputs)`` returns what is compared."""

    def __init__(self, workload: zoo_models.Workload, model: torch.nn.Module, training: bool):
        self.workload, self.training = workload, training
        self.params = [p for p in model.parameters() if p.requires_grad]

    def call(self, module, inputs: dict[str, torch.Tensor], params=None) -> list[torch.Tensor]:
        """One call; the result as host float32 copies (training: loss, then each gradient)."""
        if not self.training:
            with torch.no_grad():
                out = module(**zoo_models.model_inputs(inputs))
            return [t.detach().float().cpu() for t in tensors_of(out)]
        params = self.params if params is None else params
        loss = self.workload.loss(module(**zoo_models.model_inputs(inputs)), inputs)
        loss.backward()
        grads = [torch.zeros(()) if p.grad is None else p.grad.float().cpu() for p in params]
        for p in params:
            p.grad = None
        return [loss.detach().float().cpu(), *grads]

    def step(self, module, inputs: dict[str, torch.Tensor]) -> None:
        """One call as timed: the result is dropped."""
        if not self.training:
            with torch.no_grad():
                module(**zoo_models.model_inputs(inputs))
            return
        self.workload.loss(module(**zoo_models.model_inputs(inputs)), inputs).backward()
        for p in self.params:
            p.grad = None


def largest_error(got: list[torch.Tensor], want: list[torch.Tensor]) -> tuple[float, float]:
    """(largest normalized error, largest absolute error) over the tensors of one call."""
    if len(got) != len(want):
        raise AssertionError(f"{len(got)} tensors against eager's {len(want)}")
    worst, worst_abs = 0.0, 0.0
    for a, b in zip(got, want):
        if a.shape != b.shape:
            raise AssertionError(f"shape {tuple(a.shape)} against eager's {tuple(b.shape)}")
        if a.numel() == 0:
            continue
        diff = (a - b).abs().max().item()
        if diff != diff and bool(torch.isnan(b).any()):  # NaN where eager has NaN too
            diff = 0.0
        scale = max(b.abs().max().item(), 1e-6)
        worst, worst_abs = max(worst, diff / scale), max(worst_abs, diff)
        if diff != diff:
            return float("inf"), float("inf")
    return worst, worst_abs


def graph_launches(run_once, device: str) -> tuple[int | None, str, list[str]]:
    """Graph launches during one call: (count, how it was counted, the event names counted)."""
    import inductor_xpugraph

    if device == "cpu":
        before = inductor_xpugraph.stats()["replays"]
        run_once()
        count = inductor_xpugraph.stats()["replays"] - before
        return count, "stats()['replays'] (CPU emulator: not seen by the profiler)", []
    from torch.profiler import ProfilerActivity, profile

    activity = ProfilerActivity.CUDA if device == "cuda" else ProfilerActivity.XPU
    with profile(activities=[ProfilerActivity.CPU, activity]) as prof:
        run_once()
        synchronize(device)
    names = Counter(event.name for event in prof.events())

    def is_launch(name: str) -> bool:
        low = name.lower()
        if device == "cuda":
            return "graphlaunch" in low
        return "graphlaunch" in low or "commandbufferenqueue" in low or "executegraph" in low

    counted = {name: n for name, n in names.items() if is_launch(name)}
    return sum(counted.values()), "profiler", sorted(counted)


@contextlib.contextmanager
def exclusive(lock_path: str | None):
    """Hold the parent's timing lock (an flock on a file); yields the seconds waited for it."""
    if not lock_path:
        yield 0.0
        return
    start = time.perf_counter()
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield time.perf_counter() - start
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def per_call_ms(step, calls: int, repeats: int, synchronized: bool, device: str) -> float:
    samples = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            step()
            if synchronized:
                synchronize(device)
        synchronize(device)
        samples.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(samples)


class Skipped(Exception):
    """The model's package cannot be imported here."""


def measure(args) -> dict[str, Any]:
    """The row of ``args.model`` in ``args.mode`` with ``args.impl``; a failure is a row too."""
    row: dict[str, Any] = {
        "model": args.model, "suite": zoo_models.MODELS[args.model].suite, "mode": args.mode,
        "impl": args.impl, "device": args.device, "dtype": args.dtype, "batch": args.batch,
        "torch": torch.__version__, "status": "fail", "phase": "setup",
    }  # fmt: skip
    try:
        row["device_name"] = device_name(args.device)
        _measure(args, row)
    except Skipped as skipped:
        row["status"], row["reason"] = "skipped", str(skipped)
    except Exception as error:
        row["reason"] = f"{row['phase']}: {type(error).__name__}: {str(error).strip()[:300]}"
        row["traceback"] = traceback.format_exc()[-2000:]
    row.pop("phase")
    return row


def _measure(args, row: dict[str, Any]) -> None:
    import inductor_xpugraph

    spec = zoo_models.MODELS[args.model]
    missing = zoo_models.missing_dependency(spec)
    if missing:
        raise Skipped(missing)
    device, training = args.device, args.mode == "training"
    variant = Variant(args.impl, device)
    variant.select()
    row["phase"] = "build"
    torch.manual_seed(0)
    workload = spec.build(args.batch)
    model = zoo_models.quiet(workload.model).to(device, DTYPES[args.dtype]).train(training)
    runner = Runner(workload, model, training)

    def inputs_of(call: int) -> dict[str, torch.Tensor]:
        made = workload.make_inputs(torch.Generator(device).manual_seed(1000 + call))
        cast = DTYPES[args.dtype]
        return {k: v.to(cast) if v.is_floating_point() else v for k, v in made.items()}

    row["phase"] = "eager reference"
    inputs = [inputs_of(i) for i in range(args.calls)]
    reference_model = copy.deepcopy(model)
    reference_params = [p for p in reference_model.parameters() if p.requires_grad]
    expected = [runner.call(reference_model, x, reference_params) for x in inputs]
    del reference_model, reference_params
    gc.collect()
    memory = None if device == "cpu" else torch.get_device_module(device)
    if memory is not None:
        memory.empty_cache()
        memory.reset_peak_memory_stats()

    row["phase"] = "compile and first calls"
    compiled = variant.compile(model)
    first_calls, worst, worst_abs = [], 0.0, 0.0
    for i, x in enumerate(inputs):
        if i == COMPILE_CALLS:
            row["phase"] = "correctness"
        synchronize(device)
        start = time.perf_counter()
        got = runner.call(compiled, x)
        if i < COMPILE_CALLS:
            synchronize(device)
            first_calls.append(time.perf_counter() - start)
        error, error_abs = largest_error(got, expected[i])
        worst, worst_abs = max(worst, error), max(worst_abs, error_abs)
    row["first_calls_s"] = [round(t, 3) for t in first_calls]
    row["compile_s"] = round(sum(first_calls), 3)
    row["max_error"], row["max_abs_error"] = worst, worst_abs
    row["tolerance"] = TOLERANCE[args.dtype]
    row["calls_checked"] = args.calls
    del expected

    row["phase"] = "graph launches"
    timed_inputs = inputs[0]
    graphs = args.impl not in ("eager", "inductor")
    if graphs or device != "cpu":
        count, how, names = graph_launches(lambda: runner.step(compiled, timed_inputs), device)
        row["graph_launches_per_call"], row["graph_launches_counted_by"] = count, how
        row["graph_launch_events"] = names

    row["phase"] = "timing"
    with exclusive(args.lock) as waited:
        row["lock_wait_s"] = round(waited, 3)
        step = lambda: runner.step(compiled, timed_inputs)  # noqa: E731
        step()
        for mode, synchronized in (("pipelined", False), ("synchronized", True)):
            ms = per_call_ms(step, args.timed_calls, args.repeats, synchronized, device)
            row[f"{mode}_ms"] = ms
    if memory is not None:
        row["peak_allocated_mib"] = memory.max_memory_allocated() / 2**20
        row["peak_reserved_mib"] = memory.max_memory_reserved() / 2**20
    else:
        row["peak_allocated_mib"] = row["peak_reserved_mib"] = None
    if args.impl.startswith("ours"):
        stats = inductor_xpugraph.stats()
        row["graphs"] = {k: stats[k] for k in OUR_COUNTERS}
        row["skip_reasons"] = stats["skip_reasons"]
    elif args.impl == "upstream":
        skips = dict(torch._dynamo.utils.counters["inductor"]).get("cudagraph_skips", 0)
        row["graphs"] = {"cudagraph_skips": skips}
    row["status"] = "pass" if worst <= TOLERANCE[args.dtype] else "fail"
    if row["status"] == "fail":
        row["reason"] = f"error {worst:.2e} above the tolerance {TOLERANCE[args.dtype]:.0e}"
