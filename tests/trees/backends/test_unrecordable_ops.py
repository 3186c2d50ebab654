"""Operators never captured: the per-device list, the config that extends and shrinks it, and
what a compiled graph that runs one does.

On the CPU emulator Inductor has no partitions (every CPU kernel stays in ``call``), so a graph
running a never-captured operator is not captured at all, with the operator, why and the source
line in the reason; the other graphs of the model are still graphed. How Inductor partitions a
device graph around such an operator is checked on the real xpu wrapper source
(``test_fake_device_codegen.py``).
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config
from torch._inductor.virtualized import V

import inductor_xpugraph
from inductor_xpugraph.codegen import not_captured_ops
from inductor_xpugraph.trees.backends import unrecordable_ops, xpu_unrecordable_ops
from inductor_xpugraph.trees.backends.devices import DEVICES
from inductor_xpugraph.trees.backends.unrecordable_ops import (
    listed_name,
    ops_not_to_capture,
    why_not_captured,
)

FLASH_ATTENTION = "aten::_scaled_dot_product_flash_attention"
TWICE = "xpugraph_tests::twice"


def listing(monkeypatch, device: str, ops: dict[str, str]) -> None:
    """``device``'s do-not-capture list is ``ops`` for the test."""
    monkeypatch.setitem(DEVICES, device, dataclasses.replace(DEVICES[device], unrecordable_ops=ops))


# A custom operator: Inductor runs it as a fallback kernel, the kind it can partition around.
@torch.library.custom_op(TWICE, mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def model(x, w):
    y = (x @ w).relu()
    torch._dynamo.graph_break()
    y = twice(y)
    torch._dynamo.graph_break()
    return (y @ w).relu()  # the same kernel as the first graph's: one C++ compile


def line_of(fn, text: str) -> str:
    """``test_unrecordable_ops.py:<line> in``, the line of ``fn`` that holds ``text`` (a
    source line's path is relative to where the tests run; its function may be a resume
    function Dynamo made after a graph break)."""
    lines, first = inspect.getsourcelines(fn)
    (offset,) = [i for i, line in enumerate(lines) if text in line]
    return f"test_unrecordable_ops.py:{first + offset} in "


def run_compiled(device, calls=4):
    compiled = torch.compile(model, mode="reduce-overhead")
    w = torch.randn(8, 8, device=device)
    for _ in range(calls):
        x = torch.randn(4, 8, device=device)
        torch.testing.assert_close(compiled(x, w), model(x, w))
    return inductor_xpugraph.stats()


def skip_events():
    return [e for e in inductor_xpugraph.report().events if e.kind.value == "skip"]


# -- the list -------------------------------------------------------------------------------


def test_xpu_list_names_the_flash_attention_kernels_and_the_functional_collectives():
    with inductor_xpugraph.config.patch(xpu_recording="command-buffer"):
        listed = ops_not_to_capture("xpu")

    assert {FLASH_ATTENTION, FLASH_ATTENTION + "_backward"} <= set(listed)
    assert {
        "_c10d_functional::all_reduce_",
        "_c10d_functional::all_gather_into_tensor",
        "_c10d_functional::reduce_scatter_tensor",
        "_c10d_functional::wait_tensor",
        "_c10d_functional::wait_tensors",
    } <= set(listed)


ONEDNN_ATTENTION = "aten::_scaled_dot_product_fused_attention_overrideable"


@pytest.mark.parametrize("release, listed", [((2, 13), True), ((2, 14), True), ((2, 15), False)])
def test_onednn_attention_is_listed_before_torch_2_15(release, listed):
    """intel/torch-xpu-ops#5069: it fails capture on 2.13 with oneDNN 3.12, records on 2.15."""
    ops = unrecordable_ops.listed_ops("xpu", release)
    assert (ONEDNN_ATTENTION in ops) is listed
    assert (ONEDNN_ATTENTION + "_backward" in ops) is listed


@pytest.mark.parametrize("recording, listed", [("command-buffer", True), ("native", False)])
def test_flash_attention_is_listed_under_command_buffers_only(recording, listed):
    """Work-group scratch memory: refused by command buffers (intel/torch-xpu-ops#3142),
    recorded natively (intel/llvm NativeRecording/work_group_scratch_memory.cpp)."""
    for release in [(2, 14), (2, 15)]:
        ops = unrecordable_ops.listed_ops("xpu", release, recording)
        assert (FLASH_ATTENTION in ops) is listed
        assert (FLASH_ATTENTION + "_backward" in ops) is listed


def test_the_list_follows_the_recording_mode_torch_chooses(monkeypatch):
    """``config.xpu_recording="auto"``: torch 2.13 records through command buffers, 2.14 on a
    device that cannot be asked (a client GPU) natively; the setting overrides it."""
    monkeypatch.delenv("SYCL_GRAPH_FORCE_NATIVE_RECORDING", raising=False)
    assert FLASH_ATTENTION in unrecordable_ops.listed_ops("xpu", (2, 13))
    assert FLASH_ATTENTION not in unrecordable_ops.listed_ops("xpu", (2, 14))
    with inductor_xpugraph.config.patch(xpu_recording="command-buffer"):
        assert FLASH_ATTENTION in unrecordable_ops.listed_ops("xpu", (2, 14))


def test_a_bad_recording_mode_is_refused_and_changes_nothing():
    with pytest.raises(ValueError, match="xpu_recording"):
        inductor_xpugraph.config.xpu_recording = "level-zero"
    assert inductor_xpugraph.config.xpu_recording == "auto"


@pytest.mark.parametrize(
    "oneccl, recorded", [(None, False), ((2021, 14, 1), False), ((2021, 17, 2), True)]
)
def test_all_reduce_all_gather_and_reduce_scatter_are_captured_from_oneccl_2021_17_2(
    oneccl, recorded
):
    """intel/torch-xpu-ops#2992: XCCL records these three with oneCCL >= 2021.17.2; broadcast,
    point-to-point and the coalesced forms stay listed."""
    ops = unrecordable_ops.listed_ops(
        "xpu", (2, 15), "command-buffer", library_version=lambda library: oneccl
    )
    three = {
        "_c10d_functional::all_reduce",
        "_c10d_functional::all_gather_into_tensor",
        "_c10d_functional::reduce_scatter_tensor",
    }
    assert three.isdisjoint(ops) is recorded
    assert bool(three <= set(ops)) is not recorded
    assert {"_c10d_functional::broadcast", "_c10d_functional::all_reduce_coalesced"} <= set(ops)


def test_the_installed_oneccl_version_is_read_from_its_distribution(monkeypatch):
    versions = {"oneccl-devel": "2021.17.2"}

    def version(distribution):
        if distribution not in versions:
            raise xpu_unrecordable_ops.importlib.metadata.PackageNotFoundError(distribution)
        return versions[distribution]

    monkeypatch.setattr(xpu_unrecordable_ops.importlib.metadata, "version", version)
    xpu_unrecordable_ops.installed_library_version.cache_clear()
    try:
        assert xpu_unrecordable_ops.installed_library_version("oneccl") == (2021, 17, 2)
        assert xpu_unrecordable_ops.installed_library_version("onednn") is None
    finally:
        xpu_unrecordable_ops.installed_library_version.cache_clear()


def test_onemkl_ops_are_listed_on_every_release():
    for release in [(2, 11), (2, 13), (2, 15)]:
        ops = unrecordable_ops.listed_ops("xpu", release)
        assert {"aten::linalg_inv_ex", "aten::_fft_r2c", "aten::linalg_qr"} <= set(ops)


def test_every_listed_op_gives_a_reason_with_its_source():
    for device in DEVICES:
        for op, reason in unrecordable_ops.listed_ops(device, (2, 11)).items():
            assert "#" in reason, f"{device} {op}: the reason names no issue"


def test_devices_without_a_list_capture_everything():
    assert ops_not_to_capture("cuda") == ()
    assert ops_not_to_capture("cpu") == ()


def test_allow_capture_ops_takes_an_op_off_the_device_list():
    with inductor_xpugraph.config.patch(
        allow_capture_ops=(FLASH_ATTENTION,), xpu_recording="command-buffer"
    ):
        listed = ops_not_to_capture("xpu")
    assert FLASH_ATTENTION not in listed
    assert FLASH_ATTENTION + "_backward" in listed


def test_never_capture_ops_adds_an_op_on_every_device():
    with inductor_xpugraph.config.patch(never_capture_ops=(TWICE,)):
        assert ops_not_to_capture("cpu") == (TWICE,)
        assert ops_not_to_capture("xpu")[-1] == TWICE
        assert why_not_captured("cpu", TWICE).endswith("config.never_capture_ops")


def test_an_op_is_named_by_its_overload_packet_or_by_one_overload():
    op = torch.ops.aten.mm.default
    assert listed_name(op, ("aten::mm",)) == "aten::mm"
    assert listed_name(op, ("aten::mm.default",)) == "aten::mm.default"
    assert listed_name(op, ("aten::mm.out", "aten::bmm")) is None
    assert listed_name(None, ("aten::mm",)) is None


# -- Inductor's custom_should_partition_ops while a wrapper is generated ----------------------


class _Graph:
    """Stands in for the GraphLowering being generated (``V.graph``)."""


def test_partitioning_around_keeps_the_users_own_ops_and_gives_them_back():
    graph = _Graph()
    with inductor_config.patch(custom_should_partition_ops=["mylib::mine"]):
        with V.set_graph_handler(graph):
            not_captured_ops.partitioning_around((FLASH_ATTENTION, "mylib::mine"))
            during = list(inductor_config.custom_should_partition_ops)
            not_captured_ops.restore()
        assert during[:2] == ["mylib::mine", FLASH_ATTENTION]
        assert inductor_config.custom_should_partition_ops == ["mylib::mine"]


def test_inductor_is_given_every_overload_of_an_op_listed_without_one():
    names = not_captured_ops.inductor_names(("aten::add", "aten::mm.out", "no::such_op"))

    # Inductor matches "aten::add" with aten.add.default only, aten.add.Tensor by its name
    assert names[0] == "aten::add"
    assert {"aten::add.Tensor", "aten::add.Scalar", "aten::add.out"} <= set(names)
    assert "aten::add.default" not in names
    assert names[-2:] == ["aten::mm.out", "no::such_op"]


def test_an_addition_left_by_a_compile_that_raised_is_undone_by_the_next_one():
    with inductor_config.patch(custom_should_partition_ops=[]):
        with V.set_graph_handler(_Graph()):  # raised before `generate`: never restored
            not_captured_ops.partitioning_around((FLASH_ATTENTION,))
        with V.set_graph_handler(_Graph()):
            not_captured_ops.partitioning_around((TWICE,))
            during = list(inductor_config.custom_should_partition_ops)
            not_captured_ops.restore()
        assert during == [TWICE]
        assert inductor_config.custom_should_partition_ops == []


# -- end to end on the CPU emulator -----------------------------------------------------------


@pytest.fixture
def device(emulator):
    """The CPU emulator only: on a device with partitions the operator is partitioned out,
    which the fake-device codegen tests and the cuda test below check."""
    return emulator


def test_a_graph_running_a_never_captured_op_runs_ungraphed_and_the_others_replay(device):
    with inductor_xpugraph.config.patch(never_capture_ops=(TWICE,)):
        stats = run_compiled(device)

    assert stats["records"] == 2  # the graphs before and after the one running `twice`
    assert stats["replays"] == 4
    (skip,) = skip_events()
    assert skip.reason.startswith(f"{TWICE} is not captured: listed in")
    assert line_of(model, "twice(y)") in skip.source


def test_the_generated_code_names_the_op_above_its_call(device):
    from torch._inductor.utils import run_and_get_code

    def f(x, w):
        return twice(x @ w)

    with inductor_xpugraph.config.patch(never_capture_ops=(TWICE,)):
        compiled = torch.compile(f, mode="reduce-overhead")
        _, (source,) = run_and_get_code(compiled, torch.randn(4, 8), torch.randn(8, 8))
    lines = source.splitlines()
    (index,) = [i for i, line in enumerate(lines) if "= torch.ops.xpugraph_tests.twice" in line]

    comment = lines[index - 1].strip()
    assert comment.startswith("# Not graphed (")
    assert line_of(f, "twice(") + "f): " + TWICE in comment
    assert "# NOT captured, runs un-graphed: " + TWICE in source


def test_without_graph_partition_a_never_captured_op_keeps_its_graph_uncaptured(device):
    with (
        inductor_config.patch(graph_partition=False),
        inductor_xpugraph.config.patch(never_capture_ops=(TWICE,)),
    ):
        stats = run_compiled(device)

    assert stats["records"] == 2
    (skip,) = skip_events()
    assert "graph_partition is off" in skip.reason


def test_allow_capture_ops_lets_a_device_listed_op_be_captured(device, monkeypatch):
    listing(monkeypatch, device, {TWICE: "a test says so (#0)"})
    stats = run_compiled(device)
    assert stats["records"] == 2 and stats["skips"] == 1
    assert skip_events()[0].reason.startswith(f"{TWICE} is not captured on {device}: a test")

    torch._dynamo.reset()
    inductor_xpugraph.reset()
    with inductor_xpugraph.config.patch(allow_capture_ops=(TWICE,)):
        stats = run_compiled(device)
    assert stats["records"] == 3 and stats["skips"] == 0


def test_changing_the_lists_never_returns_a_wrapper_cached_under_other_lists(device, monkeypatch):
    def compile_and_count(**lists):
        torch._dynamo.reset()
        inductor_xpugraph.reset()
        counters.clear()
        with inductor_xpugraph.config.patch(**lists):
            stats = run_compiled(device, calls=3)
        hits = counters["inductor"]["fxgraph_cache_hit"]
        hits += counters["aot_autograd"]["autograd_cache_hit"]
        return stats["records"], hits

    assert compile_and_count(never_capture_ops=())[0] == 3
    assert compile_and_count(never_capture_ops=(TWICE,))[0] == 2
    records, hits = compile_and_count(never_capture_ops=())
    assert records == 3 and hits >= 1  # the same lists do hit the cache
    listing(monkeypatch, device, {TWICE: "a test says so (#0)"})
    assert compile_and_count()[0] == 2


@pytest.fixture(autouse=True)
def _no_addition_left():
    before = list(inductor_config.custom_should_partition_ops)
    yield
    assert inductor_config.custom_should_partition_ops == before
    assert not not_captured_ops._additions


# -- on cuda: attention partitioned out of real device graphs ----------------------------------

CUDA_ATTENTION = (
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention",
)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a cuda device")
@torch.no_grad()
def test_attention_listed_on_cuda_runs_between_two_graphed_partitions(cuda_device):
    """What xpu's list does to a transformer, on real device graphs: cuda's attention kernels,
    listed, run un-graphed between two captured partitions that replay, and the results are
    eager's."""
    torch.manual_seed(0)
    proj_in = torch.nn.Linear(64, 3 * 64).cuda().half()
    proj_out = torch.nn.Linear(64, 64).cuda().half()

    def block(x):
        q, k, v = proj_in(x).view(2, 128, 3, 4, 16).permute(2, 0, 3, 1, 4)
        attended = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return proj_out(attended.transpose(1, 2).reshape(2, 128, 64)).relu()

    with inductor_xpugraph.config.patch(never_capture_ops=CUDA_ATTENTION):
        compiled = torch.compile(block, mode="reduce-overhead")
        for _ in range(4):
            x = torch.randn(2, 128, 64, device="cuda", dtype=torch.half)
            torch.testing.assert_close(compiled(x), block(x), atol=2e-3, rtol=2e-3)
    stats = inductor_xpugraph.stats()
    assert stats["records"] == 2 and stats["replays"] == 4, stats  # two partitions
    assert stats["capture_failures"] == 0
    (skip,) = skip_events()
    assert "_scaled_dot_product_" in skip.reason and "runs it un-graphed" in skip.reason
