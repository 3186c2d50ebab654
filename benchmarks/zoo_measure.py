"""One (model, mode, implementation) of the zoo, measured in this process (``zoo.py`` starts one
process per row); the row, a dict, is the last line of stdout. In order:
1. **references**: eager on a copy of the model, ``--calls`` calls with fresh inputs (call i's
   from a generator seeded with 1000 + i), then the same on a float64 copy, kept on the host;
2. **correctness**: the implementation built from a start without cuBLAS workspaces, the same
   calls judged as PyTorch's dashboard judges accuracy: a tensor's error is its relative RMS
   difference from the float64 result, and passes within ``MULTIPLIER`` × eager's own error
   plus the tolerance of the dtype and mode (a stale or wrong output is off by about 1). The
   first three calls (warmup, record, first replay), each synchronized, are the compile time;
3. **timing**, holding the parent's lock with every other process paused (``exclusive``):
   pipelined and synchronized (``measure.per_call_us``) on the first call's inputs;
4. **graph launches** in one more call (``measure.graph_launches``), then peak memory.
A training call is forward, loss, backward, gradients set to None (no optimizer step).
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import gc
import os
import signal
import statistics
import sys
import time
import traceback
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(__file__))
import zoo_models  # noqa: E402
from measure import (  # noqa: E402
    DeviceMemory,
    Variant,
    device_name,
    graph_launches,
    per_call_us,
    synchronize,
)  # fmt: skip

# Relative RMS error allowed beyond MULTIPLIER × eager's own. Training is looser, as on the
# dashboard. On the CPU, Inductor's batch-norm backward is 7.5e-3 off float64 in ResNet-18's
# last block where eager is 8e-6 off (with and without graphs alike); compiled MobileNetV3's
# first batch-norm bias gradient is 4e-2 off where eager is 1e-2 off. A wrong or stale graph
# output is off by about 1.
TOLERANCE = {
    "fp32": {"inference": 1e-3, "training": 2e-2},
    "bf16": {"inference": 1e-2, "training": 5e-2},
}
MULTIPLIER = 3.0
FLOOR = 1e-2  # of the median tensor's RMS: the smallest scale a tensor's error is taken against
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
COMPILE_CALLS = 3  # warmup, record, first replay
LAUNCHED_AT = "ZOO_LAUNCHED_AT"  # the parent's time.time() when it started this process


def tensors_of(output: Any) -> list[torch.Tensor]:
    """Every tensor of a (nested) output, in order: tuples, lists, dicts, model outputs."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):  # transformers' ModelOutput is an OrderedDict
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in tensors_of(item)]
    return []


def _host(t: torch.Tensor) -> torch.Tensor:
    """A host copy to compare: float64 stays float64, every other dtype becomes float32."""
    return t.detach().to("cpu", torch.float64 if t.dtype == torch.float64 else torch.float32)


class Runner:
    """Calls of one model in one mode: ``call(module, inputs)`` returns what is compared."""

    def __init__(self, workload: zoo_models.Workload, model: torch.nn.Module, training: bool):
        self.workload, self.training = workload, training
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self.params = [p for _, p in named]
        # what each compared tensor is (inference: outputs, in order)
        self.names = ["loss", *(f"{name}.grad" for name, _ in named)] if training else None

    def call(self, module, inputs: dict[str, torch.Tensor], params=None) -> list[torch.Tensor]:
        """One call; the result as host float32 copies (training: loss, then each gradient)."""
        if not self.training:
            with torch.no_grad():
                out = module(**zoo_models.model_inputs(inputs))
            return [_host(t) for t in tensors_of(out)]
        params = self.params if params is None else params
        loss = self.workload.loss(module(**zoo_models.model_inputs(inputs)), inputs)
        loss.backward()
        grads = [torch.zeros(()) if p.grad is None else _host(p.grad) for p in params]
        for p in params:
            p.grad = None
        return [_host(loss), *grads]

    def step(self, module, inputs: dict[str, torch.Tensor]) -> None:
        """One call as timed: the result is dropped."""
        if not self.training:
            with torch.no_grad():
                module(**zoo_models.model_inputs(inputs))
            return
        self.workload.loss(module(**zoo_models.model_inputs(inputs)), inputs).backward()
        for p in self.params:
            p.grad = None


def _rms(t: torch.Tensor) -> float:
    t = t.double()
    t = t[torch.isfinite(t)]
    return t.square().mean().sqrt().item() if t.numel() else 0.0


def _relative_rms(a: torch.Tensor, b: torch.Tensor, floor: float) -> float:
    """RMS of a - b over the RMS of b, or ``floor`` where that is larger (a gradient far
    smaller than the others, such as one that is zero in exact arithmetic, is mostly rounding
    noise); float64, where b is finite."""
    a, b = a.double(), b.double()
    finite = torch.isfinite(b)
    if not bool(finite.all()):
        a, b = a[finite], b[finite]
    if b.numel() == 0:
        return 0.0
    diff = (a - b).square().mean().sqrt().item()
    if diff != diff:
        return float("inf")
    return 0.0 if diff == 0 else diff / max(_rms(b), floor, 1e-30)


def compare(
    got: list[torch.Tensor], eager: list[torch.Tensor], precise: list[torch.Tensor], tol: float
) -> dict[str, Any]:
    """One call's result against eager's and the float64 reference's (``precise``; eager's own
    where there is none), tensor by tensor: a tensor's error is its RMS difference from the
    reference, relative to its own RMS or to ``FLOOR`` × the median tensor's, whichever is
    larger. Returns the worst tensor: its index, error, eager's error, its ``score`` (error
    over ``MULTIPLIER`` × eager's error + ``tol``: above 1 fails), and the largest absolute
    difference from eager."""
    if not len(got) == len(eager) == len(precise):
        raise AssertionError(f"{len(got)} tensors against eager's {len(eager)}")
    worst = {"score": 0.0, "error": 0.0, "eager_error": 0.0, "at": 0, "abs_vs_eager": 0.0}
    scales = [_rms(p) for p in precise if p.numel()]
    floor = FLOOR * statistics.median(scales) if scales else 0.0
    for i, (a, e, p) in enumerate(zip(got, eager, precise)):
        if a.shape != e.shape:
            raise AssertionError(f"shape {tuple(a.shape)} against eager's {tuple(e.shape)}")
        if a.numel() == 0:
            continue
        error, eager_error = _relative_rms(a, p, floor), _relative_rms(e, p, floor)
        score = error / (MULTIPLIER * eager_error + tol)
        if score > worst["score"] or score != score:
            worst.update(score=score, error=error, eager_error=eager_error, at=i)
        difference = (a.double() - e.double()).abs().max().item()
        worst["abs_vs_eager"] = max(worst["abs_vs_eager"], difference)
    return worst


def references(runner: Runner, model, inputs: list[dict], dtype) -> list[list[torch.Tensor]]:
    """Eager's results of every call on a copy of the model (in ``dtype``, if given)."""
    copied = copy.deepcopy(model)
    if dtype is not None:
        copied = copied.to(dtype)
        cast = lambda v: v.to(dtype) if v.is_floating_point() else v  # noqa: E731
        inputs = [{k: cast(v) for k, v in x.items()} for x in inputs]
    params = [p for p in copied.parameters() if p.requires_grad]
    return [runner.call(copied, x, params) for x in inputs]


@contextlib.contextmanager
def exclusive(lock_path: str | None):
    """Hold the parent's timing lock (an flock) with every other process of the run paused;
    yields the seconds waited. A lock alone kept two processes from timing at once but not the
    others' compiles from taking the CPU and their calls the GPU (eager's launch-bound times
    came out 4× slower than alone), so the holder stops the other processes' groups (the
    parent lists them in ``<lock>.groups``) and continues them after."""
    if not lock_path:
        yield 0.0
        return
    start = time.perf_counter()
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        paused = pause_others(lock_path)
        try:
            yield time.perf_counter() - start
        finally:
            signal_groups(paused, signal.SIGCONT)
            fcntl.flock(handle, fcntl.LOCK_UN)


def pause_others(lock_path: str) -> list[int]:
    """Stop the process groups the parent lists, except this process's own; returns them."""
    try:
        with open(lock_path + ".groups") as f:
            groups = [int(g) for g in f.read().split()]
    except FileNotFoundError:
        return []
    others = [g for g in groups if g != os.getpgrp()]
    signal_groups(others, signal.SIGSTOP)
    return others


def signal_groups(groups: list[int], signum: int) -> None:
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signum)


class Skipped(Exception):
    """The model's package cannot be imported here."""


def enter_phase(row: dict[str, Any], phase: str) -> None:
    """Close the row's current phase (its seconds go to ``phase_s``) and open ``phase``."""
    now = time.perf_counter()
    row["phase_s"][row["phase"]] = round(now - row.pop("_phase_started"), 2)
    row["phase"], row["_phase_started"] = phase, now


def measure(args) -> dict[str, Any]:
    """The row of ``args.model`` in ``args.mode`` with ``args.impl``; a failure is a row too.
    ``phase_s``: the seconds of each phase, "start" from the parent's launch of the process
    (interpreter and torch imports)."""
    row: dict[str, Any] = {
        "model": args.model, "suite": zoo_models.MODELS[args.model].suite, "mode": args.mode,
        "impl": args.impl, "device": args.device, "dtype": args.dtype, "batch": args.batch,
        "torch": torch.__version__, "status": "fail", "phase": "setup",
        "_phase_started": time.perf_counter(), "phase_s": {},
    }  # fmt: skip
    launched = os.environ.get(LAUNCHED_AT)
    if launched:
        row["phase_s"]["start"] = round(time.time() - float(launched), 2)
    try:
        row["device_name"] = device_name(args.device)
        _measure(args, row)
    except Skipped as skipped:
        row["status"], row["reason"] = "skipped", str(skipped)
    except Exception as error:
        row["reason"] = f"{row['phase']}: {type(error).__name__}: {str(error).strip()[:300]}"
        row["traceback"] = traceback.format_exc()[-2000:]
    enter_phase(row, "done")
    row.pop("phase"), row.pop("_phase_started")
    return row


def _measure(args, row: dict[str, Any]) -> None:
    import inductor_xpugraph

    spec = zoo_models.MODELS[args.model]
    missing = zoo_models.missing_dependency(spec)
    if missing:
        raise Skipped(missing)
    device, training = args.device, args.mode == "training"
    variant = Variant(args.impl, device).select()
    enter_phase(row, "build")
    torch.manual_seed(0)
    workload = spec.build(args.batch)
    model = zoo_models.quiet(workload.model).to(device, DTYPES[args.dtype]).train(training)
    runner = Runner(workload, model, training)

    def inputs_of(call: int) -> dict[str, torch.Tensor]:
        made = workload.make_inputs(torch.Generator(device).manual_seed(1000 + call))
        cast = DTYPES[args.dtype]
        return {k: v.to(cast) if v.is_floating_point() else v for k, v in made.items()}

    enter_phase(row, "eager reference")
    inputs = [inputs_of(i) for i in range(args.calls)]
    eager = references(runner, model, inputs, None)
    try:  # the float64 reference, as the dashboard's accuracy check
        precise = references(runner, model, inputs, torch.float64)
        row["reference"] = "float64"
    except Exception as error:
        precise = eager
        row["reference"] = f"eager (float64 failed: {type(error).__name__}: {str(error)[:100]})"
    gc.collect()
    # The references' cuBLAS workspaces go (measure.DeviceMemory): each implementation starts
    # without any and makes those it needs.
    memory = DeviceMemory(device).start().module

    enter_phase(row, "compile and first calls")
    compiled = variant.compile(model)
    first_calls, tol = [], TOLERANCE[args.dtype][args.mode]
    worst: dict[str, Any] = {"score": 0.0}
    for i, x in enumerate(inputs):
        if i == COMPILE_CALLS:
            enter_phase(row, "correctness")
        synchronize(device)
        start = time.perf_counter()
        got = runner.call(compiled, x)
        runner.names = runner.names or [f"output {k}" for k in range(len(got))]
        if i < COMPILE_CALLS:
            synchronize(device)
            first_calls.append(time.perf_counter() - start)
        result = compare(got, eager[i], precise[i], tol)
        if worst["score"] == worst["score"] and not result["score"] <= worst["score"]:
            worst = {**result, "call": i}  # the largest score; the first NaN stays
        largest = max(row.get("max_abs_error_vs_eager", 0.0), result["abs_vs_eager"])
        row["max_abs_error_vs_eager"] = largest
    row["first_calls_s"] = [round(t, 3) for t in first_calls]
    row["compile_s"] = round(sum(first_calls), 3)
    row["max_error"], row["eager_error"] = worst.get("error", 0.0), worst.get("eager_error", 0.0)
    row["error_score"] = worst["score"]
    if "call" in worst:
        row["max_error_at"] = f"call {worst['call']}, {runner.names[worst['at']]}"
    row["tolerance"], row["calls_checked"] = tol, args.calls
    del eager, precise

    enter_phase(row, "timing")
    with exclusive(args.lock) as waited:
        row["lock_wait_s"] = round(waited, 3)
        step = lambda: runner.step(compiled, inputs[0])  # noqa: E731
        step()
        for mode, synchronized in (("pipelined", False), ("synchronized", True)):
            us = per_call_us(step, args.timed_calls, args.repeats, device, synchronized)
            row[f"{mode}_ms"] = us / 1e3

    enter_phase(row, "graph launches")
    graphs = args.impl not in ("eager", "inductor")
    if graphs or device != "cpu":
        count, how, names = graph_launches(lambda: runner.step(compiled, inputs[0]), device)
        row["graph_launches_per_call"], row["graph_launches_counted_by"] = count, how
        row["graph_launch_events"] = names

    if memory is not None:
        row["peak_allocated_mib"] = memory.max_memory_allocated() / 2**20
        row["peak_reserved_mib"] = memory.max_memory_reserved() / 2**20
    else:
        row["peak_allocated_mib"] = row["peak_reserved_mib"] = None
    row["graphs"] = variant.counters()
    if variant.ours:
        row["skip_reasons"] = inductor_xpugraph.stats()["skip_reasons"]
    if args.impl == "upstream":
        skips = dict(torch._dynamo.utils.counters["inductor"]).get("cudagraph_skips", 0)
        row["graphs"]["cudagraph_skips"] = skips
    row["status"] = "pass" if worst["score"] <= 1.0 else "fail"
    if row["status"] == "fail":
        row["reason"] = (
            f"error {row['max_error']:.2e} ({row.get('max_error_at')}) above "
            f"{MULTIPLIER:g} × eager's {row['eager_error']:.2e} + {tol:g}"
        )
