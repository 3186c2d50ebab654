"""``RecordedState``: the state a recording writes keeps its memory after the caller drops it,
and new state moves in only when nobody could notice (Note [State moved into a recording's
memory]). Plain tensors, no compilation."""

import gc

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from inductor_xpugraph.trees.recorded_state import RecordedState


def cache_tensors():
    """A cache's keys, values and length counter: the state of one request."""
    return [torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4), torch.tensor(5)]


def recorded_after_the_request(args):
    """The state of ``args`` recorded at positions 1, 2, 3, then the request's tensors
    dropped; the addresses the recording writes."""
    state = RecordedState([(i + 1, tensor) for i, tensor in enumerate(args)])
    addresses = [tensor.data_ptr() for tensor in args]
    args.clear()
    gc.collect()
    return state, addresses


def call_args(tensors):
    return [7, *tensors]  # position 0: something that is not state


def test_the_memory_of_dropped_state_stays_the_recordings():
    args = cache_tensors()
    memory = [StorageWeakRef(tensor.untyped_storage()) for tensor in args]
    state, _ = recorded_after_the_request(args)
    assert state.died()
    assert not any(ref.expired() for ref in memory)


def test_new_state_laid_out_the_same_moves_into_the_recordings_memory():
    state, addresses = recorded_after_the_request(cache_tensors())
    new = cache_tensors()
    values = [t.clone() for t in new]
    args = call_args(new)
    assert state.adoptable(args, [1, 2, 3])
    state.adopt(args)
    assert [t.data_ptr() for t in new] == addresses  # the same objects, moved
    for moved, value in zip(new, values):
        assert torch.equal(moved, value)
    assert not state.died()


def test_state_still_alive_does_not_move():
    kept = cache_tensors()
    state = RecordedState([(i + 1, tensor) for i, tensor in enumerate(kept)])
    assert not state.adoptable(call_args(cache_tensors()), [1, 2, 3])


def test_new_state_of_another_layout_does_not_move():
    state, _ = recorded_after_the_request(cache_tensors())
    longer = [torch.randn(1, 2, 16, 4), torch.randn(1, 2, 16, 4), torch.tensor(5)]
    assert not state.laid_out_as(call_args(longer))
    assert not state.adoptable(call_args(longer), [1, 2, 3])


def test_new_state_that_another_tensor_uses_does_not_move():
    """A view of the new keys elsewhere would keep the old memory and diverge."""
    state, _ = recorded_after_the_request(cache_tensors())
    new = cache_tensors()
    view_elsewhere = new[0][:, :1]
    assert not state.adoptable(call_args(new), [1, 2, 3])
    del view_elsewhere


def test_a_view_passed_as_state_does_not_move():
    state, _ = recorded_after_the_request(cache_tensors())
    base = torch.randn(2, 1, 2, 8, 4)
    new = [base[0], torch.randn(1, 2, 8, 4), torch.tensor(5)]
    assert not state.adoptable(call_args(new), [1, 2, 3])


def test_moved_inputs_other_than_the_state_do_not_move():
    state, _ = recorded_after_the_request(cache_tensors())
    assert not state.adoptable(call_args(cache_tensors()), [0, 1, 2, 3])


def test_without_keeping_memory_it_is_freed_and_nothing_moves():
    args = cache_tensors()
    memory = [StorageWeakRef(tensor.untyped_storage()) for tensor in args]
    state = RecordedState([(i + 1, t) for i, t in enumerate(args)], keep_memory=False)
    args.clear()
    gc.collect()
    assert state.died() and all(ref.expired() for ref in memory)
    assert not state.adoptable(call_args(cache_tensors()), [1, 2, 3])
