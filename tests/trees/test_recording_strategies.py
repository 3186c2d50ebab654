"""A recording's replay steps, chosen once when it is made (``recording`` module docstring).

Each test builds a ``Recording`` over a scripted graph (its replay is a Python function), so
that what a launch copies, and what a hand-out returns, is seen without a device.
"""

import pytest
import torch

from inductor_xpugraph.trees.inputs import SETTLE_REPLAYS, MovingStorages
from inductor_xpugraph.trees.recording import (
    Launch,
    LaunchWritingBack,
    OverCallersTensors,
    Recording,
)


class ScriptedGraph:
    """A graph whose replay runs ``on_replay`` and counts itself."""

    def __init__(self, on_replay=lambda: None):
        self.on_replay = on_replay
        self.replays = 0

    def replay(self):
        self.replays += 1
        self.on_replay()


def recording_of(graph, outputs, **kwargs):
    kwargs.setdefault("static_inputs", [])
    kwargs.setdefault("copied_inputs", [])
    kwargs.setdefault("input_buffers", [])
    return Recording(graph, captured_outputs=outputs, **kwargs)


def test_a_launch_copies_each_copied_input_into_its_buffer_then_replays_once():
    buffer = torch.zeros(4)
    seen = []
    graph = ScriptedGraph(lambda: seen.append(buffer.clone()))
    recording = recording_of(graph, (torch.empty(4),), copied_inputs=[0], input_buffers=[buffer])
    args = [torch.arange(4.0)]
    recording.launch(args)
    assert graph.replays == 1
    assert torch.equal(seen[0], torch.arange(4.0))
    assert args == []  # consumed


def test_a_recording_without_written_back_inputs_launches_plainly():
    recording = recording_of(ScriptedGraph(), (torch.empty(4),))
    assert type(recording.launch.__self__) is Launch


def test_a_written_back_input_is_copied_in_before_the_graph_and_back_after_it():
    own = torch.zeros(3)
    graph = ScriptedGraph(lambda: own.add_(1))  # the graph writes the recording's tensor
    recording = recording_of(graph, (torch.empty(2),), written_back=[(0, own)])
    assert type(recording.launch.__self__) is LaunchWritingBack
    callers = torch.tensor([10.0, 20.0, 30.0])
    recording.launch([callers])
    assert callers.tolist() == [11.0, 21.0, 31.0]
    assert own.tolist() == [11.0, 21.0, 31.0]


def test_a_forward_recording_hands_out_the_same_object_while_nobody_holds_it():
    recording = recording_of(ScriptedGraph(), (torch.empty(4),))
    first_id = id(recording.replay([])[0])  # the tuple and the object are dropped here
    assert id(recording.replay([])[0]) == first_id


def test_a_forward_recording_hands_out_a_new_object_where_the_caller_holds_the_last():
    recording = recording_of(ScriptedGraph(), (torch.empty(4),))
    (held,) = recording.replay([])
    (again,) = recording.replay([])
    assert again is not held
    assert again.data_ptr() == held.data_ptr()  # over the same memory


def test_a_backward_recording_hands_out_new_objects_at_every_replay():
    recording = recording_of(ScriptedGraph(), [torch.empty(4)], reuse_output_objects=False)
    kept = recording._output_aliases[0]
    first = recording.replay([])
    second = recording.replay([])
    assert isinstance(first, list)  # the captured outputs' container
    assert first[0] is not second[0] and first[0] is not kept


def test_outputs_over_a_moving_input_are_handed_out_over_the_callers_tensor():
    pool_output = torch.zeros(2)
    launched = []
    over_callers = OverCallersTensors(
        launched.append,
        lambda: [pool_output, pool_output],
        aliases=[(1, 0, 2, torch.Size([3]), (1,))],  # position 1 is input 0's [2:5]
        output_is_tuple=True,
    )
    parameter = torch.arange(8.0)
    over_callers.launch([parameter])
    outputs = over_callers.hand_out()
    assert isinstance(outputs, tuple) and outputs[0] is pool_output
    assert outputs[1].untyped_storage().data_ptr() == parameter.untyped_storage().data_ptr()
    assert outputs[1].tolist() == [2.0, 3.0, 4.0]
    assert over_callers._callers == []  # the caller's tensors are not kept past the call


def test_a_recording_whose_copied_weight_settled_matches_no_call_until_told_to_keep_copying():
    weight = torch.arange(4.0)
    recording = recording_of(
        ScriptedGraph(), (torch.empty(4),), copied_inputs=[0], input_buffers=[torch.zeros(4)],
        moving_inputs=[0], watch_settling=MovingStorages(),
    )  # fmt: skip
    for _ in range(SETTLE_REPLAYS):
        assert recording.static_inputs_match([weight])
        assert recording.why_copied().startswith("read in place if it stays put")
        recording.replay([weight])
    assert recording.copies_settled and not recording.static_inputs_match([weight])
    recording.keep_copying("settled, but no capture could replace this graph where it is")
    assert not recording.copies_settled and recording.static_inputs_match([weight])
    recording.replay([weight])
    assert recording.moving_input_bytes() == weight.nbytes
    assert recording.why_copied().startswith("settled, but no capture could replace")


def test_a_released_recording_refuses_to_replay():
    recording = recording_of(ScriptedGraph(), (torch.empty(4),))
    recording.release()
    with pytest.raises(RuntimeError, match="replay of a dropped recording"):
        recording.replay([])
