"""What each device's graphs cannot record: operators never captured there.

A CUDA stream capture records almost any device work. SYCL Graph, under ``torch.xpu.XPUGraph``,
refuses some: the fused scaled-dot-product attention kernel of torch-xpu-ops, whose
work-group scratch memory SYCL Graph does not support ("The
sycl_ext_oneapi_work_group_scratch_memory feature is not yet available for use with SYCL Graph
extension", intel/torch-xpu-ops#3142), and collectives that run on a queue of their own
(pytorch/pytorch#196490). A capture that meets one fails at run time; listed here, the
operator is partitioned out at compile time instead (Inductor's
``custom_should_partition_ops``), so the rest of the model is still graphed and the report
names the operator and its source line.

Read from torch's and torch-xpu-ops' sources and issues; no Intel GPU was run by this project.
``python -m inductor_xpugraph doctor`` tries each listed operator on the machine it runs on and
says which ones record there; ``config.allow_capture_ops`` takes those off the list, and
``config.never_capture_ops`` adds operators on every device.
"""

from __future__ import annotations

from ... import config

#: Per device type, the operators its graphs are known not to record, with why.
#: Names as ``custom_should_partition_ops`` takes them ("namespace::op[.overload]").
UNRECORDABLE_OPS: dict[str, dict[str, str]] = {
    "xpu": {
        "aten::_scaled_dot_product_fused_attention_overrideable": (
            "the fused attention kernel uses work-group scratch memory, which SYCL Graph "
            "cannot record (intel/torch-xpu-ops#3142)"
        ),
    },
}


def ops_not_to_capture(device_type: str) -> tuple[str, ...]:
    """The operators to partition out of graphs on ``device_type``: the device's list, less
    ``config.allow_capture_ops``, plus ``config.never_capture_ops``."""
    allowed = set(config.allow_capture_ops)
    listed = [op for op in UNRECORDABLE_OPS.get(device_type, {}) if op not in allowed]
    return tuple(dict.fromkeys([*listed, *config.never_capture_ops]))


def why_not_captured(device_type: str, op: str) -> str:
    """Why ``op`` is not captured on ``device_type``, for reports and logs."""
    reason = UNRECORDABLE_OPS.get(device_type, {}).get(op)
    if reason is not None:
        return f"{op} is not captured on {device_type}: {reason}"
    return f"{op} is not captured: listed in inductor_xpugraph.config.never_capture_ops"
