"""Allocator checkpoints where torch has the bindings (``trees.backends.allocator_checkpoints``).

xpu gets ``CheckpointedPool`` exactly when the installed torch has all five ``_xpu_*``
checkpoint bindings (torch 2.15), and owned outputs otherwise; the operations call those
bindings with the arguments cuda's have always had. No XPU build is here: the bindings are
scripted functions put into ``torch._C``, and the backend runs over a device module that only
answers what its constructor asks. The cuda backend, over the same code, is checked the same
way against its ``_cuda_*`` names.
"""

from __future__ import annotations

import pytest
import torch

from inductor_xpugraph import config
from inductor_xpugraph.trees.backends import cuda as cuda_backend
from inductor_xpugraph.trees.backends.allocator_checkpoints import checkpoint_bindings
from inductor_xpugraph.trees.backends.cpu_emulation import CpuEmulationBackend
from inductor_xpugraph.trees.backends.cuda import CudaGraphBackend
from inductor_xpugraph.trees.backends.device_graphs import DevicePool
from inductor_xpugraph.trees.backends.devices import DEVICES, CheckpointBindings
from inductor_xpugraph.trees.backends.xpu import XpuGraphBackend
from inductor_xpugraph.trees.memory import CheckpointedPool, OwnedOutputs, memory_strategy

POOL = DevicePool(handle=(0, 7), keeper=None)


class DeviceModuleForConstruction:
    """What ``DeviceGraphBackend.__init__`` asks of a device module, and nothing more."""

    def __init__(self, name: str) -> None:
        self.__name__ = name  # capture streams are cached per module name

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 2

    def Stream(self, device: int) -> object:  # noqa: N802 - torch's name
        return object()

    def is_current_stream_capturing(self) -> bool:
        return False


class ScriptedBindings:
    """The five checkpoint bindings of one device, logging each call as (name, *args)."""

    def __init__(self, names: CheckpointBindings) -> None:
        self.names = names
        self.calls: list[tuple] = []
        self.standard_deleters = True  # what has_standard_deleter answers
        self.holds_exactly = True  # what check_pool_live_allocations answers

    def install(self, monkeypatch, leave_out: str | None = None) -> None:
        for field, name in zip(CheckpointBindings._fields, self.names):
            if field == leave_out:
                monkeypatch.delattr(torch._C, name, raising=False)
            else:
                monkeypatch.setattr(torch._C, name, self._binding(name, field), raising=False)

    def _binding(self, name, field):
        answers = {
            "get_checkpoint_state": lambda: f"state of {self.names[0][:5]} pool",
            "has_standard_deleter": lambda: self.standard_deleters,
            "check_pool_live_allocations": lambda: self.holds_exactly,
        }

        def binding(*args):
            self.calls.append((name, *args))
            return answers.get(field, lambda: None)()

        return binding


def remove_bindings(monkeypatch, device_type: str) -> None:
    for name in DEVICES[device_type].checkpoint_bindings:
        monkeypatch.delattr(torch._C, name, raising=False)


@pytest.fixture
def make_xpu_backend(monkeypatch):
    monkeypatch.setattr(
        XpuGraphBackend, "device_module", DeviceModuleForConstruction("xpu_for_checkpoints")
    )
    return XpuGraphBackend


@pytest.fixture
def make_cuda_backend(monkeypatch):
    """``CudaGraphBackend`` without its cuBLAS workspace set-up (it needs a device)."""
    monkeypatch.setattr(
        CudaGraphBackend, "device_module", DeviceModuleForConstruction("cuda_for_checkpoints")
    )
    policy = cuda_backend.WorkspacePolicy.FREE_AS_INTERMEDIATE
    monkeypatch.setattr(cuda_backend, "_workspace_policy", lambda backend: policy)
    return CudaGraphBackend


@pytest.fixture
def xpu_bindings(monkeypatch):
    bindings = ScriptedBindings(DEVICES["xpu"].checkpoint_bindings)
    bindings.install(monkeypatch)
    return bindings


def test_the_xpu_bindings_are_named_like_torch_2_15s():
    assert DEVICES["xpu"].checkpoint_bindings == (
        "_xpu_getCheckpointState",
        "_xpu_setCheckpointPoolState",
        "_xpu_checkPoolLiveAllocations",
        "_xpu_has_standard_deleter",
        "_xpu_free_and_remove_deleter",
    )


def test_the_cuda_bindings_are_the_ones_the_cuda_backend_always_called():
    assert DEVICES["cuda"].checkpoint_bindings == (
        "_cuda_getCheckpointState",
        "_cuda_setCheckpointPoolState",
        "_cuda_checkPoolLiveAllocations",
        "_has_Standard_Deleter",
        "_free_And_Remove_DeleterFn",
    )


def test_xpu_keeps_owned_outputs_on_a_torch_without_the_bindings(monkeypatch, make_xpu_backend):
    remove_bindings(monkeypatch, "xpu")
    backend = make_xpu_backend(0)
    assert backend.supports_pool_checkpoints is False
    assert isinstance(memory_strategy(backend), OwnedOutputs)


@pytest.mark.parametrize("missing", CheckpointBindings._fields)
def test_one_missing_binding_keeps_owned_outputs(monkeypatch, make_xpu_backend, missing):
    ScriptedBindings(DEVICES["xpu"].checkpoint_bindings).install(monkeypatch, leave_out=missing)
    assert checkpoint_bindings("xpu") is None
    assert make_xpu_backend(0).supports_pool_checkpoints is False


def test_xpu_checkpoints_where_torch_has_every_binding(make_xpu_backend, xpu_bindings):
    backend = make_xpu_backend(0)
    assert backend.supports_pool_checkpoints is True
    assert isinstance(memory_strategy(backend), CheckpointedPool)
    with config.patch(allocator_checkpointing=False):
        assert isinstance(memory_strategy(backend), OwnedOutputs)


def test_xpu_checkpoint_calls_go_to_the_xpu_bindings(make_xpu_backend, xpu_bindings):
    backend = make_xpu_backend(1)
    owners = [torch.UntypedStorage(8), torch.UntypedStorage(8)]
    addresses = [owner._cdata for owner in owners]

    assert backend.checkpoint_pool(POOL) == "state of _xpu_ pool"
    backend.restore_pool(POOL, "the checkpoint", owners)
    backend.free_storages(owners[:1])
    assert backend.pool_holds_exactly(POOL, owners) is True

    assert xpu_bindings.calls == [
        ("_xpu_getCheckpointState", 1, (0, 7)),
        ("_xpu_setCheckpointPoolState", 1, "the checkpoint", [], addresses),
        ("_xpu_has_standard_deleter", addresses[0]),
        ("_xpu_has_standard_deleter", addresses[1]),
        ("_xpu_free_and_remove_deleter", addresses[0]),
        ("_xpu_checkPoolLiveAllocations", 1, (0, 7), {owner.data_ptr() for owner in owners}),
    ]


def test_a_restore_that_leaves_an_owner_without_its_block_raises(make_xpu_backend, xpu_bindings):
    backend = make_xpu_backend(0)
    xpu_bindings.standard_deleters = False
    with pytest.raises(RuntimeError, match="restoring a xpu pool checkpoint did not re-allocate"):
        backend.restore_pool(POOL, "the checkpoint", [torch.UntypedStorage(8)])


def test_cuda_checkpoint_calls_are_unchanged(monkeypatch, make_cuda_backend):
    bindings = ScriptedBindings(DEVICES["cuda"].checkpoint_bindings)
    bindings.install(monkeypatch)
    backend = make_cuda_backend(1)
    assert backend.supports_pool_checkpoints is True
    owner = torch.UntypedStorage(8)

    backend.checkpoint_pool(POOL)
    backend.restore_pool(POOL, "the checkpoint", [owner])
    backend.free_storages([owner])
    backend.pool_holds_exactly(POOL, [owner])

    assert bindings.calls == [
        ("_cuda_getCheckpointState", 1, (0, 7)),
        ("_cuda_setCheckpointPoolState", 1, "the checkpoint", [], [owner._cdata]),
        ("_has_Standard_Deleter", owner._cdata),
        ("_free_And_Remove_DeleterFn", owner._cdata),
        ("_cuda_checkPoolLiveAllocations", 1, (0, 7), {owner.data_ptr()}),
    ]


def test_cuda_without_its_bindings_keeps_owned_outputs(monkeypatch, make_cuda_backend):
    remove_bindings(monkeypatch, "cuda")
    assert make_cuda_backend(0).supports_pool_checkpoints is False


def test_the_emulator_has_no_checkpoints():
    assert CpuEmulationBackend.supports_pool_checkpoints is False
