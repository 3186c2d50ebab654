"""The device probe of ``python -m inductor_xpugraph doctor``: can this machine record graphs?

``torch.xpu.XPUGraph`` exists even in torch builds without XPU, and SYCL Graph refuses some
work that runs fine eagerly (``trees.backends.unrecordable_ops``: fused attention's scratch
memory, collectives on queues of their own), so only capturing and replaying tells. The probe
does it through this project's own backend (``trees.backends.backend_class(device_type)(0)``:
warmup, pool, capture, replay), the path compiled code takes:

1. run a matmul, a scaled-dot-product attention and ``torch.rand`` un-graphed (the device
   works at all: else the device is unusable);
2. capture the three in one graph and replay it twice: the matmul's and the attention's
   results must match the un-graphed ones, the random values must differ between replays.
   When the capture fails, each of the three is captured alone, to name what does not record;
3. run a random op un-graphed afterwards: a failed capture must not leave the device's random
   number generator in capture mode;
4. try each operator of the device's do-not-capture list (``unrecordable_ops.listed_ops``) with
   sample inputs from ``probe_exercises.EXERCISES``, and say which ones record here.

It runs in a child process that ``probe_report`` starts and reads: a crash, a hang or a
poisoned generator there never harms the doctor. The child prints its progress (``stage ...``)
and its result (``result {json}``) on lines of their own. ``probe_device`` is the same probe
in this process, for tests with a scripted backend.

With ``--sycl-rules RELEASE`` (``doctor --device cpu --sycl-rules 2.13``) the child probes the
CPU inside ``sycl_rules.on_cpu(RELEASE)``: through the backend the package's trees use there
(``XpuRulesBackend``, xpu's backend code over the stand-in device), against the xpu list of
that release in CPU names, every operator submitted under SYCL Graph's rules. What it shows is
what that release's XPU runtime would refuse, not a measurement of an XPU device.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from ..trees.messages import first_line
from .probe_exercises import EXERCISES, NOT_TRIED_NAMESPACES, sample_inputs

# The CPU emulator captures only code shaped like Inductor's CPU output: functions whose module
# defines the allocator that code calls, which the emulator routes into the graph's memory.
empty_strided_cpu = torch._C._dynamo.guards._empty_strided_cpu

PARTS = ("matmul", "attention", "random")


@dataclasses.dataclass
class Attempt:
    """One capture and two replays of something, through the backend."""

    recorded: bool
    words: str = ""  # why not, in the device's words (the exception's first line)
    wrong: list[str] = dataclasses.field(default_factory=list)  # replays unlike eager
    random_repeats: bool = False  # random values the same at both replays


@dataclasses.dataclass
class OpTry:
    op: str
    outcome: str  # "records", "fails", "not tried"
    words: str = ""  # the device's words ("fails"), why not tried, or what replayed wrong


@dataclasses.dataclass
class DeviceProbe:
    device: str  # "xpu:0", "cuda:0", "cpu"
    unusable: str = ""  # the device cannot run the probe's ops even un-graphed: why
    attention_ops: list[str] = dataclasses.field(default_factory=list)  # what SDPA dispatched
    graph: Attempt | None = None  # the three parts in one graph
    parts: dict[str, Attempt] = dataclasses.field(default_factory=dict)  # each alone, if needed
    generator_after: str = ""  # a random op un-graphed after the captures raised: its words
    ops: list[OpTry] = dataclasses.field(default_factory=list)
    generator_after_ops: str = ""  # the same, after trying the listed operators
    # The operators compiled graphs partition out on the device, as the probe's process
    # has them (``ops_not_to_capture``): the list, less allow_capture_ops, plus never_capture_ops.
    not_to_capture: list[str] = dataclasses.field(default_factory=list)
    # The torch release whose SYCL Graph rules the CPU followed ("2.13"; "": none, the device
    # itself or the CPU emulator), and the xpu operator each listed CPU operator stands for.
    sycl_rules: str = ""
    stands_for: dict[str, str] = dataclasses.field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> DeviceProbe:
        data = json.loads(text)
        graph = data["graph"]
        return cls(
            **{
                **data,
                "graph": None if graph is None else Attempt(**graph),
                "parts": {name: Attempt(**a) for name, a in data["parts"].items()},
                "ops": [OpTry(**op) for op in data["ops"]],
            }
        )


def device_label(device_type: str) -> str:
    """The device the probe runs on: device 0 of its type ("cpu" for the emulator)."""
    return "cpu" if device_type == "cpu" else f"{device_type}:0"


# -- the probe's graph -----------------------------------------------------------------------------


def _matmul(args):
    return [args[0] @ args[1]]


def _attention(args):
    return [F.scaled_dot_product_attention(args[2], args[3], args[4])]


def _random(args):
    return [torch.rand(4096, device=args[0].device)]


def _all_parts(args):
    return _matmul(args) + _attention(args) + _random(args)


_PART_FUNCTIONS = {"matmul": _matmul, "attention": _attention, "random": _random}


class _NoCopiedInputs:
    """``place_inputs`` of a capture whose inputs are all static (none is copied)."""

    indices: tuple[int, ...] = ()

    def __call__(self, args: list[Any]) -> None:
        pass


class _DispatchedOps(TorchDispatchMode):
    """Records the ATen operators that run, as ``namespace::name`` and ``...name.overload``."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        self.names += [name, f"{name}.{func._overloadname}"]
        return func(*args, **(kwargs or {}))


def dispatched_ops(fn: Callable[[list[Any]], Any], args: list[Any]) -> list[str]:
    with _DispatchedOps() as recorder:
        fn(args)
    return list(dict.fromkeys(recorder.names))


def _snapshot(outputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [out.detach().to("cpu", copy=True) for out in outputs]


def attempt(
    backend: Any, fn: Callable, args: list[Any], expected: list[tuple[str, Any]]
) -> Attempt:
    """Warm ``fn`` up, capture it and replay it twice through ``backend``. ``expected``: per
    output, its name and un-graphed value, or None for a random output (fresh at each
    replay)."""
    try:
        backend.warmup(fn, args)
        pool = backend.new_pool()
        graph, outputs = backend.capture(fn, args, pool, _NoCopiedInputs())
    except Exception as error:
        return Attempt(recorded=False, words=first_line(error))
    try:
        graph.replay()
        first = _snapshot(outputs)
        graph.replay()
        second = _snapshot(outputs)
    except Exception as error:
        return Attempt(recorded=False, words=f"(at replay) {first_line(error)}")
    result = Attempt(recorded=True)
    for (name, want), got, again in zip(expected, first, second):
        if want is None:
            result.random_repeats |= torch.equal(got, again)
            continue
        for replayed in (got, again):
            if not torch.allclose(replayed.float(), want.float(), rtol=1e-2, atol=1e-2):
                difference = (replayed.float() - want.float()).abs().max().item()
                result.wrong.append(f"{name} differs by up to {difference:.3g}")
                break
    return result


def sycl_rules_of(backend: Any) -> str:
    """The SYCL Graph rules ``backend``'s device follows ("2.13", "2.14:native"), when it is
    the stand-in of ``sycl_rules``; else ""."""
    from ..sycl_rules.releases import Release, rule_set_name

    device = getattr(backend, "device_module", None)
    release = getattr(device, "release", None)
    return rule_set_name(release, device.recording) if isinstance(release, Release) else ""


def _random_op_words(device: str) -> str:
    """'' when a random op runs un-graphed on ``device``, else the error's first line."""
    try:
        torch.rand(8, device=device).sum().item()
    except Exception as error:
        return first_line(error)
    return ""


def probe_device(
    device_type: str,
    make_backend: Callable[[], Any],
    stage: Callable[[str], None] = lambda text: None,
) -> DeviceProbe:
    """The probe (module docstring, steps 1-4) on device 0 of ``device_type``."""
    stage("starting the device")
    label = device_label(device_type)
    module = getattr(torch, device_type, None)
    if device_type != "cpu" and (module is None or not module.is_available()):
        return DeviceProbe(label, unusable=f"torch.{device_type}.is_available() is False")
    try:
        backend = make_backend()
        args = sample_inputs(label)
    except Exception as error:
        return DeviceProbe(label, unusable=first_line(error))
    probe = DeviceProbe(label, sycl_rules=sycl_rules_of(backend))

    stage("running a matmul, attention and torch.rand un-graphed")
    expected: dict[str, list[tuple[str, Any]]] = {}
    for part, fn in _PART_FUNCTIONS.items():
        try:
            outputs = _snapshot(fn(args))
        except Exception as error:
            probe.unusable = f"{part} un-graphed: {first_line(error)}"
            return probe
        expected[part] = [(part, None if part == "random" else out) for out in outputs]
    # The fused kernel attention ran (a composite's ops are not one operator to name).
    probe.attention_ops = [
        op
        for op in dispatched_ops(_attention, args)
        if "scaled_dot_product" in op and "." not in op
    ]

    stage("capturing a matmul, attention and torch.rand in one graph and replaying it")
    probe.graph = attempt(backend, _all_parts, args, [v for p in PARTS for v in expected[p]])
    if not probe.graph.recorded:
        for part, fn in _PART_FUNCTIONS.items():
            stage(f"capturing {part} alone and replaying it")
            probe.parts[part] = attempt(backend, fn, args, expected[part])

    stage("running a random op un-graphed after the captures")
    probe.generator_after = _random_op_words(label)

    from ..trees.backends import unrecordable_ops

    probe.not_to_capture = list(unrecordable_ops.ops_not_to_capture(device_type))
    listed = unrecordable_ops.listed_ops(device_type)
    if probe.sycl_rules:
        stands_for = unrecordable_ops.stood_for(device_type)
        probe.stands_for = {op: xpu_op for op, xpu_op in stands_for.items() if op in listed}
    for op in listed:
        stage(f"trying {op} of the do-not-capture list")
        probe.ops.append(try_op(backend, op, label))
    if any(op.outcome == "fails" for op in probe.ops):
        stage("running a random op un-graphed after trying the listed operators")
        probe.generator_after_ops = _random_op_words(label)
    return probe


def try_op(backend: Any, op: str, device: str) -> OpTry:
    """Whether ``op`` records on ``backend``'s device (``OpTry.outcome``)."""
    namespace, _, name = op.partition("::")
    if namespace in NOT_TRIED_NAMESPACES:
        return OpTry(op, "not tried", NOT_TRIED_NAMESPACES[namespace])
    exercise = EXERCISES.get(f"{namespace}::{name.split('.')[0]}")
    if exercise is None:
        return OpTry(op, "not tried", "doctor has no sample inputs for it")
    try:
        fn, args = exercise.make(device)
        ran = dispatched_ops(fn, args)
        expected = [(op, out) for out in _snapshot(fn(args))]
    except Exception as error:
        return OpTry(
            op,
            "not tried",
            f"{exercise.how} raises un-graphed ({first_line(error)})",
        )
    if op not in ran:
        ran_here = ", ".join(o for o in ran if "." not in o.partition("::")[2])
        return OpTry(op, "not tried", f"{exercise.how} runs {ran_here} here, not it")
    result = attempt(backend, fn, args, expected)
    if not result.recorded:
        return OpTry(op, "fails", result.words)
    if result.wrong:
        return OpTry(op, "fails", "its replay differs from un-graphed: " + "; ".join(result.wrong))
    return OpTry(op, "records")


# -- the child process -----------------------------------------------------------------------------

LINE_PREFIX = "inductor_xpugraph-probe "
# Run by the child: imports that fail (a bad INDUCTOR_XPUGRAPH_* value) become a line too.
CHILD_CODE = f"""
import sys
try:
    from inductor_xpugraph.diagnostics.device_probe import child_main
except BaseException as error:
    message = (str(error).splitlines() or [""])[0]
    print({LINE_PREFIX!r} + "import-error " + type(error).__name__ + ": " + message, flush=True)
    sys.exit(3)
sys.exit(child_main(sys.argv[1:]))
"""


def _say(kind: str, text: str) -> None:
    print(f"{LINE_PREFIX}{kind} {text}", flush=True)


def _backend_class(device_type: str, spec: str | None) -> type:
    """This project's backend class for ``device_type``, or the class ``spec`` names
    ("module:Class": tests script one that fails)."""
    if spec is None:
        from ..trees.backends import backend_class

        return backend_class(device_type)
    module_name, _, class_name = spec.partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def child_main(argv: list[str]) -> int:
    """``<device_type> [module:BackendClass] [--sycl-rules RELEASE]``: probe device 0 (with
    ``--sycl-rules``, the CPU inside ``sycl_rules.on_cpu(RELEASE)``), print the result line."""
    device_type, rest = argv[0], list(argv[1:])
    release = None
    if "--sycl-rules" in rest:
        at = rest.index("--sycl-rules")
        release = rest[at + 1]
        del rest[at : at + 2]
    spec = rest[0] if rest else None
    try:
        with contextlib.ExitStack() as scope:
            if release is not None:
                from .. import sycl_rules

                version, recording = sycl_rules.releases.rule_set(release)
                scope.enter_context(sycl_rules.on_cpu(version.version, recording=recording))
            probe = probe_device(
                device_type,
                lambda: _backend_class(device_type, spec)(0),
                lambda text: _say("stage", text),
            )
    except Exception as error:  # a bug of the probe itself, not the device's
        _say("error", first_line(error))
        return 2
    _say("result", probe.to_json())
    return 0
