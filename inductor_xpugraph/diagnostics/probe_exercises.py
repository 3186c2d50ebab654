"""Sample inputs for the device probe (``device_probe``): the operands of its graph, and how
to run each operator of a device's do-not-capture list alone (``EXERCISES``), so that
``doctor`` can say which of them record on this machine."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# The CPU emulator captures only code shaped like Inductor's CPU output: functions whose module
# defines the allocator that code calls (as ``device_probe`` does for its own graph).
empty_strided_cpu = torch._C._dynamo.guards._empty_strided_cpu


def sample_inputs(device: str) -> list[torch.Tensor]:
    """A matmul's two operands and attention's query, key and value, in shapes that select a
    fused attention kernel (fp16 on a device: flash on cuda, oneDNN's on xpu)."""
    cpu_generator = torch.Generator().manual_seed(0)
    dtype = torch.float32 if device == "cpu" else torch.float16
    matrices = [torch.randn(64, 64, generator=cpu_generator) for _ in range(2)]
    qkv = [torch.randn(2, 4, 128, 64, generator=cpu_generator, dtype=dtype) for _ in range(3)]
    return [t.to(device) for t in matrices + qkv]


# -- attention ----------------------------------------------------------------------


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

        return fn, sample_inputs(device)[2:]

    return Exercise(f"F.scaled_dot_product_attention with the {backend.name} kernel", make)


def _flash_attention_backward() -> Exercise:
    """The backward op alone: its inputs come from the forward op, run un-graphed first."""

    def make(device: str):
        query, key, value = sample_inputs(device)[2:]
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
        query, key, value = sample_inputs(device)[2:]
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
