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
4. try each operator of the device's do-not-capture list (``UNRECORDABLE_OPS``, read now) with
   sample inputs from ``EXERCISES``, and say which ones record here.

It runs in a child process that ``_probe_report`` starts and reads: a crash, a hang or a
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
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

from .trees.messages import first_line

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


def _inputs(device: str) -> list[torch.Tensor]:
    """A matmul's two operands and attention's query, key and value, in shapes that select a
    fused attention kernel (fp16 on a device: flash on cuda, oneDNN's on xpu)."""
    cpu_generator = torch.Generator().manual_seed(0)
    dtype = torch.float32 if device == "cpu" else torch.float16
    matrices = [torch.randn(64, 64, generator=cpu_generator) for _ in range(2)]
    qkv = [torch.randn(2, 4, 128, 64, generator=cpu_generator, dtype=dtype) for _ in range(3)]
    return [t.to(device) for t in matrices + qkv]


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
    """The torch release whose SYCL Graph rules ``backend``'s device follows ("2.13"), when it
    is the stand-in of ``sycl_rules``; else ""."""
    from .sycl_rules.releases import Release

    release = getattr(getattr(backend, "device_module", None), "release", None)
    return release.version if isinstance(release, Release) else ""


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
        args = _inputs(label)
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

    from .trees.backends import unrecordable_ops

    probe.not_to_capture = list(unrecordable_ops.ops_not_to_capture(device_type))
    listed = unrecordable_ops.listed_ops(device_type)
    if probe.sycl_rules:
        probe.stands_for = {
            op: xpu_op for op, xpu_op in unrecordable_ops.STANDS_FOR.items() if op in listed
        }
    for op in listed:
        stage(f"trying {op} of the do-not-capture list")
        probe.ops.append(try_op(backend, op, label))
    if any(op.outcome == "fails" for op in probe.ops):
        stage("running a random op un-graphed after trying the listed operators")
        probe.generator_after_ops = _random_op_words(label)
    return probe


# -- the do-not-capture list ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Exercise:
    """How to run an operator with sample inputs: ``make(device) -> (fn, args)``."""

    how: str
    make: Callable[[str], tuple[Callable[[list[Any]], list[Any]], list[Any]]]


def _attention_with(backend: SDPBackend) -> Exercise:
    def make(device: str):
        def fn(args):
            with sdpa_kernel(backend):
                return [F.scaled_dot_product_attention(args[0], args[1], args[2])]

        return fn, _inputs(device)[2:]

    return Exercise(f"F.scaled_dot_product_attention with the {backend.name} kernel", make)


def _flash_attention_backward() -> Exercise:
    """The backward op alone: its inputs come from the forward op, run un-graphed first."""

    def make(device: str):
        query, key, value = _inputs(device)[2:]
        forward = torch.ops.aten._scaled_dot_product_flash_attention(query, key, value)
        output, logsumexp, cum_q, cum_k, max_q, max_k, seed, offset = forward[:8]
        backward = torch.ops.aten._scaled_dot_product_flash_attention_backward

        def fn(args):
            rest = (cum_q, cum_k, max_q, max_k, 0.0, False, seed, offset)
            return list(backward(*args, *rest))

        return fn, [torch.ones_like(output), query, key, value, output, logsumexp]

    return Exercise("the flash-attention backward op, after its forward un-graphed", make)


def _cpu_flash_attention_backward() -> Exercise:
    """The CPU's flash-attention backward op alone (on the stand-in, what stands for xpu's
    flash backward): its inputs come from the CPU's forward op, run un-graphed first."""

    def make(device: str):
        query, key, value = _inputs(device)[2:]
        output, logsumexp = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value
        )
        backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward

        def fn(args):
            return list(backward(*args, 0.0, False))

        return fn, [torch.ones_like(output), query, key, value, output, logsumexp]

    return Exercise("the CPU's flash-attention backward op, after its forward un-graphed", make)


# -- oneMKL's operators (torch.linalg, torch.fft on xpu) ----------------------------------------
# Small float32 (complex64) samples every device runs. The ``_ex`` variants: ``torch.linalg.inv``
# and the like add ``aten::_linalg_check_errors``, which reads the result's info on the host (a
# host wait, which a recording queue refuses for its own reason); the ``_ex`` call runs the
# operator alone.


def _matrices(device: str) -> dict[str, torch.Tensor]:
    """8 x 8 samples: ``general``, ``spd`` (symmetric positive definite), ``upper``
    (triangular, well conditioned), ``rhs`` (8 x 3), ``signal`` (64 reals), ``complex``."""
    cpu_generator = torch.Generator().manual_seed(0)
    general = torch.randn(8, 8, generator=cpu_generator)
    spd = general @ general.T + 8 * torch.eye(8)
    samples = {
        "general": general,
        "spd": spd,
        "upper": torch.triu(spd),
        "rhs": torch.randn(8, 3, generator=cpu_generator),
        "signal": torch.randn(64, generator=cpu_generator),
        "complex": torch.randn(64, dtype=torch.complex64, generator=cpu_generator),
    }
    return {name: t.to(device) for name, t in samples.items()}


def _outputs(result: Any) -> list[torch.Tensor]:
    """An operator's outputs as real tensors (complex ones as their real view), for
    ``attempt`` to compare."""
    flat = list(result) if isinstance(result, (tuple, list)) else [result]
    return [torch.view_as_real(t) if t.is_complex() else t for t in flat]


def _onemkl(how: str, call: Callable[..., Any], *samples: str) -> Exercise:
    """``call(*samples)`` (``_matrices``' names); ``how``: the call, in words."""

    def make(device: str):
        matrices = _matrices(device)

        def fn(args):
            with warnings.catch_warnings():  # torch.triangular_solve is deprecated
                warnings.simplefilter("ignore")
                return _outputs(call(*args))

        return fn, [matrices[name] for name in samples]

    return Exercise(how, make)


def _lu_solve() -> Exercise:
    """``torch.linalg.lu_solve`` alone: the factorization is made un-graphed first."""

    def make(device: str):
        matrices = _matrices(device)
        factors, pivots = torch.linalg.lu_factor_ex(matrices["spd"])[:2]

        def fn(args):
            return _outputs(torch.linalg.lu_solve(*args))

        return fn, [factors, pivots, matrices["rhs"]]

    return Exercise("torch.linalg.lu_solve, after torch.linalg.lu_factor_ex un-graphed", make)


def _irfft() -> Exercise:
    """``torch.fft.irfft`` alone: its complex input is made un-graphed first."""

    def make(device: str):
        spectrum = torch.fft.rfft(_matrices(device)["signal"])
        return (lambda args: _outputs(torch.fft.irfft(args[0]))), [spectrum]

    return Exercise("torch.fft.irfft", make)


_ONEMKL_EXERCISES: dict[str, Exercise] = {
    "aten::_fft_r2c": _onemkl("torch.fft.rfft", torch.fft.rfft, "signal"),
    "aten::_fft_c2c": _onemkl("torch.fft.fft of a complex tensor", torch.fft.fft, "complex"),
    "aten::_fft_c2r": _irfft(),
    "aten::linalg_inv_ex": _onemkl(
        "torch.linalg.inv_ex (torch.linalg.inv without its host-side error check)",
        torch.linalg.inv_ex,
        "spd",
    ),
    "aten::linalg_qr": _onemkl("torch.linalg.qr", torch.linalg.qr, "general"),
    "aten::_linalg_eigh": _onemkl("torch.linalg.eigh", torch.linalg.eigh, "spd"),
    "aten::_linalg_svd": _onemkl("torch.linalg.svd", torch.linalg.svd, "general"),
    "aten::linalg_cholesky_ex": _onemkl(
        "torch.linalg.cholesky_ex", torch.linalg.cholesky_ex, "spd"
    ),
    "aten::_linalg_solve_ex": _onemkl("torch.linalg.solve_ex", torch.linalg.solve_ex, "spd", "rhs"),
    "aten::linalg_lu_factor_ex": _onemkl(
        "torch.linalg.lu_factor_ex", torch.linalg.lu_factor_ex, "spd"
    ),
    "aten::linalg_lu_solve": _lu_solve(),
    "aten::linalg_solve_triangular": _onemkl(
        "torch.linalg.solve_triangular",
        lambda upper, rhs: torch.linalg.solve_triangular(upper, rhs, upper=True),
        "upper",
        "rhs",
    ),
    "aten::triangular_solve": _onemkl(
        "torch.triangular_solve",
        lambda upper, rhs: torch.triangular_solve(rhs, upper),
        "upper",
        "rhs",
    ),
}

#: Per operator (``namespace::name``, every overload), how to run it with sample inputs.
EXERCISES: dict[str, Exercise] = {
    "aten::_scaled_dot_product_fused_attention_overrideable": _attention_with(
        SDPBackend.OVERRIDEABLE
    ),
    "aten::_scaled_dot_product_flash_attention": _attention_with(SDPBackend.FLASH_ATTENTION),
    "aten::_scaled_dot_product_flash_attention_backward": _flash_attention_backward(),
    "aten::_scaled_dot_product_flash_attention_for_cpu": _attention_with(
        SDPBackend.FLASH_ATTENTION
    ),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": _cpu_flash_attention_backward(),
    "aten::_scaled_dot_product_efficient_attention": _attention_with(
        SDPBackend.EFFICIENT_ATTENTION
    ),
    "aten::_scaled_dot_product_cudnn_attention": _attention_with(SDPBackend.CUDNN_ATTENTION),
    **_ONEMKL_EXERCISES,
}

#: Operator namespaces the probe cannot run alone, and why.
NOT_TRIED_NAMESPACES = {
    namespace: "needs a process group"
    for namespace in ("c10d", "_c10d_functional", "c10d_functional")
}


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
    from inductor_xpugraph._probe import child_main
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
        from .trees.backends import backend_class

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
                from . import sycl_rules

                scope.enter_context(sycl_rules.on_cpu(release))
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
