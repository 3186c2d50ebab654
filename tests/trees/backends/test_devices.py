"""Each device type's record (``trees.backends.devices``): what the runtime and codegen read of
a device comes from it, and a stand-in's record replaces it inside its block, and only there."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from inductor_xpugraph import config
from inductor_xpugraph.trees.backends import (
    accelerator_graphs,
    allocator_checkpoints,
    backend_class,
    unrecordable_ops,
)
from inductor_xpugraph.trees.backends.cpu_emulation import CpuEmulationBackend
from inductor_xpugraph.trees.backends.devices import (
    DEVICES,
    CheckpointBindings,
    Device,
    device,
    standing_in,
)

OP = "aten::_some_cpu_op"
XPU_OP = "aten::_the_xpu_op"


class PlayedBackend(CpuEmulationBackend):
    pass


def record() -> Device:
    return Device(
        "cpu",
        unrecordable_ops={OP: "the stand-in refuses it"},
        backend=PlayedBackend,
        stands_for={OP: XPU_OP},
    )


def test_a_stand_in_answers_for_its_device_inside_its_block_only():
    with standing_in(record()):
        assert backend_class("cpu") is PlayedBackend
        assert unrecordable_ops.listed_ops("cpu") == {OP: "the stand-in refuses it"}
        assert unrecordable_ops.stood_for("cpu") == {OP: XPU_OP}
    assert backend_class("cpu") is CpuEmulationBackend
    assert OP not in unrecordable_ops.listed_ops("cpu")
    assert unrecordable_ops.stood_for("cpu") == {}


def test_allow_capture_ops_takes_the_name_of_the_operator_stood_for():
    with standing_in(record()):
        assert OP in unrecordable_ops.ops_not_to_capture("cpu")
        with config.patch(allow_capture_ops=[XPU_OP]):
            assert OP not in unrecordable_ops.ops_not_to_capture("cpu")


def test_a_stand_in_is_taken_out_when_its_block_raises():
    with pytest.raises(KeyError), standing_in(record()):
        raise KeyError("the block failed")
    assert device("cpu") is DEVICES["cpu"]


def test_a_second_stand_in_for_a_device_raises_and_the_first_stays():
    first = record()
    with standing_in(first):
        with pytest.raises(RuntimeError, match="already stands in for 'cpu'"):
            with standing_in(record()):
                pass
        assert device("cpu") is first


def test_the_checkpoint_bindings_are_those_the_record_names(monkeypatch):
    names = CheckpointBindings(*(f"_scripted_checkpoint_binding_{i}" for i in range(5)))
    for name in names:
        monkeypatch.setattr(torch._C, name, object(), raising=False)
    cuda = dataclasses.replace(DEVICES["cuda"], checkpoint_bindings=names)
    monkeypatch.setitem(DEVICES, "cuda", cuda)
    found = allocator_checkpoints.checkpoint_bindings("cuda")
    assert found == tuple(getattr(torch._C, name) for name in names)
    monkeypatch.delattr(torch._C, names.free_and_remove_deleter)
    assert allocator_checkpoints.checkpoint_bindings("cuda") is None  # all five, or none


def test_the_accelerator_backend_takes_its_allocator_behaviour_from_the_record(monkeypatch):
    flagged = Device("fake_dev", empty_cache_after_pool_drop=True)
    monkeypatch.setitem(DEVICES, "fake_dev", flagged)
    accelerator_graphs.accelerator_backend_class.cache_clear()
    try:
        made = accelerator_graphs.accelerator_backend_class("fake_dev")
        assert made.empty_cache_after_pool_drop and not made.failure_leaves_host_routing
    finally:
        accelerator_graphs.accelerator_backend_class.cache_clear()


def test_a_device_type_without_a_record_has_no_facts_and_no_backend_but_the_accelerators():
    unknown = device("no_such_device")
    assert not unknown.unrecordable_ops and unknown.checkpoint_bindings is None
    assert unrecordable_ops.listed_ops("no_such_device") == {}
    with pytest.raises(ValueError, match="no graph backend for device type 'no_such_device'"):
        backend_class("no_such_device")
