"""A stand-in replaces what a device type is (backend, do-not-capture list, the names its
operators stand for) inside its block, and only there (``trees.backends.stand_ins``)."""

from __future__ import annotations

import pytest

from inductor_xpugraph import config
from inductor_xpugraph.trees.backends import backend_class, unrecordable_ops
from inductor_xpugraph.trees.backends.cpu_emulation import CpuEmulationBackend
from inductor_xpugraph.trees.backends.stand_ins import StandIn, stand_in, standing_in

OP = "aten::_some_cpu_op"
XPU_OP = "aten::_the_xpu_op"


class PlayedBackend(CpuEmulationBackend):
    pass


def record() -> StandIn:
    return StandIn(PlayedBackend, {OP: "the stand-in refuses it"}, {OP: XPU_OP})


def test_a_stand_in_answers_for_its_device_inside_its_block_only():
    with standing_in("cpu", record()):
        assert backend_class("cpu") is PlayedBackend
        assert unrecordable_ops.listed_ops("cpu") == {OP: "the stand-in refuses it"}
        assert unrecordable_ops.stood_for("cpu") == {OP: XPU_OP}
    assert backend_class("cpu") is CpuEmulationBackend
    assert OP not in unrecordable_ops.listed_ops("cpu")
    assert unrecordable_ops.stood_for("cpu") == {}


def test_allow_capture_ops_takes_the_name_of_the_operator_stood_for():
    with standing_in("cpu", record()):
        assert OP in unrecordable_ops.ops_not_to_capture("cpu")
        with config.patch(allow_capture_ops=[XPU_OP]):
            assert OP not in unrecordable_ops.ops_not_to_capture("cpu")


def test_a_stand_in_is_taken_out_when_its_block_raises():
    with pytest.raises(KeyError), standing_in("cpu", record()):
        raise KeyError("the block failed")
    assert stand_in("cpu") is None


def test_a_second_stand_in_for_a_device_raises_and_the_first_stays():
    first = record()
    with standing_in("cpu", first):
        with pytest.raises(RuntimeError, match="already stands in for 'cpu'"):
            with standing_in("cpu", record()):
                pass
        assert stand_in("cpu") is first
