"""Memory that moves under its tensor (``trees.inputs``): seen moving, watched until it settles,
and restless once it moves off where it settled. Plain tensors on the CPU, no tree."""

from __future__ import annotations

import torch

from inductor_xpugraph.trees.inputs import SETTLE_REPLAYS, MovingStorages, SettlingWatch


def move(tensor: torch.Tensor, held: list) -> None:
    """Give ``tensor``'s memory back and take it again elsewhere, in the same storage (as FSDP2
    gathers a layer's parameters); ``held`` keeps the old memory taken."""
    storage, before = tensor.untyped_storage(), tensor.data_ptr()
    while tensor.data_ptr() == before:
        nbytes = storage.nbytes()
        storage.resize_(0)
        held.append(torch.empty(nbytes, dtype=torch.uint8))
        storage.resize_(nbytes)


def moved_once(weight: torch.Tensor, held: list) -> MovingStorages:
    storages = MovingStorages()
    storages.note([weight], [0])
    move(weight, held)
    storages.note([weight], [0])
    return storages


def test_a_storage_seen_at_two_addresses_moved():
    weight, held = torch.randn(64), []
    storages = MovingStorages()
    storages.note([weight], [0])
    assert not storages.moved(weight)
    move(weight, held)
    storages.note([weight], [0])
    assert storages.moved(weight)


def test_copied_inputs_settle_after_replays_at_the_records_addresses():
    weight, held = torch.randn(64), []
    storages, settled = moved_once(weight, held), []
    watch = SettlingWatch([0], storages, lambda: settled.append(True))
    for _ in range(SETTLE_REPLAYS - 1):
        watch([weight])
    assert settled == [] and storages.moved(weight)
    for _ in range(3):
        watch([weight])
    assert settled == [True]  # once
    assert not storages.moved(weight)  # read where it lies from now on


def test_memory_that_moves_after_the_record_is_never_settled():
    weight, held = torch.randn(64), []
    storages, settled = moved_once(weight, held), []
    watch = SettlingWatch([0], storages, lambda: settled.append(True))
    watch([weight])  # the record's replay
    move(weight, held)
    for _ in range(2 * SETTLE_REPLAYS):
        watch([weight])
    assert settled == [] and storages.moved(weight)


def test_a_storage_seen_off_where_it_settled_is_restless_and_copied_for_good():
    weight, held = torch.randn(64), []
    storages = moved_once(weight, held)
    storages.settle([weight])
    move(weight, held)
    storages.note([weight], [0])
    assert storages.moved(weight) and not storages.may_settle(weight)
    storages.settle([weight])  # a watch made before: ignored
    assert storages.moved(weight)


def test_a_storage_settles_at_each_address_a_graph_reads_it_at():
    """FSDP2 may gather a layer's parameters for the backward elsewhere than for the forward:
    the forward's recording and the backward's each see it settle at their own address."""
    weight, held = torch.randn(64), []
    storages = moved_once(weight, held)
    storages.settle([weight])  # the forward's
    move(weight, held)
    storages.settle([weight])  # the backward's, seen by its watch before any slow path
    storages.note([weight], [0])
    assert not storages.moved(weight) and storages.may_settle(weight)
