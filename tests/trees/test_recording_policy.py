"""The recording policy: warmups, sizes, variants and the thrash guard (``trees.recording_policy``).

The policy's counting is pinned down on its own first, then through compiled callables on the
CPU emulator everywhere and on cuda (both memory strategies) with ``-m gpu``.
"""

import logging

import pytest
import torch

import inductor_xpugraph
from inductor_xpugraph.trees import graphify, stats
from inductor_xpugraph.trees.per_thread import all_trees
from inductor_xpugraph.trees.recording_policy import (
    RecordingPolicy,
    RecordingSettings,
    upstream_key,
)

# -- the policy on its own ------------------------------------------------------------------


def policy_with(**settings):
    values = dict(warmup_runs=1, rerecord_limit=3, rerecord_window=10, warn_limit=2)
    values.update(settings)
    return RecordingPolicy("call", source=None, settings=RecordingSettings(**values))


@pytest.fixture
def policy():
    return policy_with()


@pytest.fixture
def fresh_stats():
    inductor_xpugraph.reset()
    yield
    inductor_xpugraph.reset()


def call_for(policy, key):
    """A call for sizes ``key``, counted as a decision's preamble counts it: whether it warms up
    (None: its sizes are refused)."""
    answers = policy.answers(key, None, generation=0)
    if answers.size_refusal is not None:
        return None
    policy.count_sizes(key, warmup=answers.warms_up)
    return answers.warms_up


def test_each_size_warms_up_warmup_runs_times_then_records():
    policy = policy_with(warmup_runs=2)
    assert [call_for(policy, (4,)) for _ in range(3)] == [True, True, False]
    assert call_for(policy, (8,)) is True
    assert policy.sizes_seen == 2


def test_no_warmup_records_the_first_call_of_each_size_and_counts_the_size():
    policy = policy_with(warmup_runs=0)
    assert call_for(policy, (4,)) is False and call_for(policy, (8,)) is False
    assert policy.sizes_seen == 2


def test_always_warming_up_never_records_even_with_no_warmups():
    policy = policy_with(warmup_runs=0, always_warm_up=True)
    assert all(call_for(policy, (4,)) for _ in range(5))


def test_only_the_size_past_the_warn_limit_is_one_too_many(policy):
    too_many = []
    for size in (1, 2, 3, 4, 5):
        too_many.append(policy.answers((size,), None, generation=0).one_size_too_many)
        call_for(policy, (size,))
    assert too_many == [False, False, True, False, False]


def test_sizes_one_too_many_are_warned_of_once_through_a_callable(device, caplog):
    f = torch.compile(lambda x: x * 2, mode="reduce-overhead", dynamic=True)
    with (
        inductor_xpugraph.config.patch(dynamic_shape_warn_limit=2),
        caplog.at_level(logging.WARNING, logger="inductor_xpugraph"),
    ):
        for n in (2, 3, 4, 5, 6, 7):
            f(torch.ones(n, device=device))
    assert len([r for r in caplog.records if "distinct sizes" in r.getMessage()]) == 1


def test_no_warn_limit_never_warns():
    policy = policy_with(warn_limit=None)
    for size in range(20):
        assert not policy.answers((size,), None, generation=0).one_size_too_many
        call_for(policy, (size,))


def test_sizes_past_the_size_limit_are_refused_and_sizes_seen_still_admitted():
    policy = policy_with(size_limit=2)
    for size in (1, 2):
        call_for(policy, (size,))
    (reason, level) = policy.answers((3,), None, generation=0).size_refusal
    assert "skip_dynamic_graphs" in reason and level is None
    assert policy.answers((1,), None, generation=0).size_refusal is None  # seen: still admitted


def test_upstreams_size_limit_is_said_in_upstreams_words():
    policy = policy_with(size_limit=1, size_limit_upstream=True)
    call_for(policy, (1,))
    (reason, _) = policy.answers((2,), None, generation=0).size_refusal
    assert (
        "cudagraph_dynamic_shape_rerecord_limit=1; already-recorded shapes still replay" in reason
    )


def test_a_size_limit_of_zero_graphs_nothing_not_even_a_static_graph():
    assert call_for(policy_with(size_limit=0), ()) is None


@pytest.mark.parametrize(
    ("key", "upstream"), [((), None), ((4,), 4), ((2, 3), (2, 3)), ((1, 2, 3), (1, 2, 3))]
)
def test_sizes_are_matched_against_capture_sizes_as_upstream_keys_them(key, upstream):
    assert upstream_key(key) == upstream


@pytest.mark.parametrize(
    ("capture_sizes", "key", "admitted"),
    [
        ((2, 5), (2,), True),  # one int input: its int
        ((2, 5), (3,), False),
        (((2,), 5), (2,), False),  # a 1-tuple never matches one int input
        (((2, 3),), (2, 3), True),  # several: the tuple
        (((2, 3),), (3, 2), False),
        ((2, 5), (), False),  # no int input (a static graph) is never graphed
    ],
)
def test_only_capture_sizes_are_admitted(capture_sizes, key, admitted):
    assert (call_for(policy_with(capture_sizes=capture_sizes), key) is not None) is admitted


def test_a_size_refused_by_capture_sizes_is_said_at_debug_level_only():
    policy = policy_with(capture_sizes=(2,))
    (_, level) = policy.answers((3,), None, generation=0).size_refusal
    assert level == logging.DEBUG
    assert call_for(policy, (3,)) is None and policy.sizes_seen == 0  # nor toward the limits


# -- where the settings come from --------------------------------------------------------------

TRITON = torch._inductor.config.triton


def needs_upstream(name):
    return pytest.mark.skipif(not hasattr(TRITON, name), reason=f"torch without triton.{name}")


def upstream(**values):
    return torch._inductor.config.patch({f"triton.{k}": v for k, v in values.items()})


def test_by_default_the_settings_are_ours():
    with inductor_xpugraph.config.patch(
        warmup_runs=3, rerecord_limit=5, rerecord_window=7, dynamic_shape_warn_limit=4
    ):
        assert RecordingSettings.current() == RecordingSettings(
            warmup_runs=3, warn_limit=4, rerecord_limit=5, rerecord_window=7
        )
    with inductor_xpugraph.config.patch(dynamic_shape_warn_limit=4, skip_dynamic_graphs=True):
        current = RecordingSettings.current()
    assert (current.size_limit, current.size_limit_upstream) == (4, False)


@needs_upstream("cudagraph_capture_sizes")
def test_capture_sizes_are_upstreams():
    with upstream(cudagraph_capture_sizes=[2, (3, 4)]):
        assert RecordingSettings.current().capture_sizes == (2, (3, 4))


@needs_upstream("skip_cudagraph_warmup")
def test_skipping_upstreams_warmup_means_no_warmup_runs_and_forcing_it_wins():
    with inductor_xpugraph.config.patch(warmup_runs=3), upstream(skip_cudagraph_warmup=True):
        current = RecordingSettings.current()
        assert (current.warmup_runs, current.always_warm_up) == (0, False)
        with upstream(force_cudagraphs_warmup=True):
            assert RecordingSettings.current().always_warm_up


@needs_upstream("cudagraph_dynamic_shape_rerecord_limit")
def test_upstreams_size_limit_replaces_ours_where_set():
    with inductor_xpugraph.config.patch(skip_dynamic_graphs=True, dynamic_shape_warn_limit=4):
        with upstream(cudagraph_dynamic_shape_rerecord_limit=2):
            current = RecordingSettings.current()
            assert (current.size_limit, current.size_limit_upstream) == (2, True)
        with upstream(cudagraph_dynamic_shape_rerecord_limit=None):  # upstream's default
            assert RecordingSettings.current().size_limit == 4  # ours


@needs_upstream("cudagraph_dynamic_shape_warn_limit")
@pytest.mark.parametrize(("value", "warn_limit"), [(3, 3), (None, None), (0, None)])
def test_upstreams_warn_limit_replaces_ours_where_set(value, warn_limit):
    with inductor_xpugraph.config.patch(dynamic_shape_warn_limit=5):
        with upstream(cudagraph_dynamic_shape_warn_limit=value):
            assert RecordingSettings.current().warn_limit == warn_limit


def test_graphify_reads_the_settings_on_the_loading_thread_or_takes_them_baked_in():
    with inductor_xpugraph.config.patch(warmup_runs=4):
        read = graphify(lambda args: args, device="cpu:0")
    baked = graphify(lambda args: args, device="cpu:0", recording={"warmup_runs": 2})
    assert read.policy.settings.warmup_runs == 4
    assert baked.policy.settings == RecordingSettings(warmup_runs=2)


def test_more_rerecords_than_the_limit_within_the_window_stop_recording(policy):
    assert [policy.note_rerecord(generation) for generation in range(4)] == [False] * 3 + [True]
    assert policy.rerecords == 3
    assert policy.rerecord_span() == 4


def test_rerecords_spread_over_more_than_the_window_never_stop_recording(policy):
    assert not any(policy.note_rerecord(generation) for generation in range(0, 200, 4))
    assert policy.rerecords == 50


def test_an_address_set_recorded_once_is_answered_as_seen(policy):
    policy.note_recorded((1, 2))
    seen = policy.answers((), None, generation=0).address_sets_seen
    assert (1, 2) in seen and (1, 3) not in seen


# -- through compiled callables ----------------------------------------------------------------


def swap_to(model, weight):
    model.weight = weight  # a different Parameter object: another address


def test_a_new_weight_at_a_freed_weights_address_replays_that_recording(device):
    """A new parameter the allocator places where an old one was: the recording for that
    address reads it there, so it replays (cuda's caching allocator does this at once)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8).to(device)
    compiled = torch.compile(model, mode="reduce-overhead")
    x = torch.randn(4, 16, device=device)
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
        address = model.weight.data_ptr()
        storage = model.weight.untyped_storage()
        swap_to(model, torch.nn.Parameter(torch.randn_like(model.weight)))
        compiled(x)  # a variant for the new address
        # The old weight's memory gets new values and comes back as the weight.
        storage.copy_(torch.randn_like(model.weight).untyped_storage())
        swap_to(model, torch.nn.Parameter(torch.empty(0, device=device).set_(storage).view(8, 16)))
        assert model.weight.data_ptr() == address
        torch.testing.assert_close(compiled(x), model(x))
    assert inductor_xpugraph.stats()["records"] == 2


def test_a_parameter_set_that_comes_back_replays_its_recording(device):
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8).to(device)
    compiled = torch.compile(model, mode="reduce-overhead")
    first, second = model.weight, torch.nn.Parameter(torch.randn_like(model.weight))
    x = torch.randn(4, 16, device=device)
    with torch.no_grad():
        for _ in range(3):  # warmup, record, replay
            compiled(x)
        swap_to(model, second)
        compiled(x)  # a new address set: a variant is recorded
        for weight in (first, second, first, second):  # both come back: replays only
            swap_to(model, weight)
            torch.testing.assert_close(compiled(x), model(x))
    stats = inductor_xpugraph.stats()
    assert (stats["records"], stats["rerecords"], stats["replays"]) == (2, 1, 5)


def test_variants_are_bounded_and_a_dropped_one_records_again_as_a_rerecord(device):
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8).to(device)
    compiled = torch.compile(model, mode="reduce-overhead")
    weights = [model.weight] + [
        torch.nn.Parameter(torch.randn_like(model.weight)) for _ in range(2)
    ]
    x = torch.randn(4, 16, device=device)
    with inductor_xpugraph.config.patch(static_input_variants=2), torch.no_grad():
        compiled(x)  # warmup
        for weight in weights:  # three address sets, two kept: the first is dropped
            swap_to(model, weight)
            compiled(x)
        swap_to(model, weights[0])
        torch.testing.assert_close(compiled(x), model(x))  # recorded again
        (tree,) = [tree for tree in all_trees() if tree.nodes()]
        assert len(tree.nodes()) == 2
    stats = inductor_xpugraph.stats()
    assert (stats["records"], stats["rerecords"], stats["fallbacks"]) == (4, 3, 0)
    # Toward the fallback limit count the two new address sets and the dropped one.
    (report,) = [c for c in inductor_xpugraph.report().callables if c.rerecords]
    assert report.rerecords == 3


def test_variants_evicted_and_recorded_again_too_often_fall_back(device):
    """Three weights in turn with two variants kept: each call evicts the recording the
    next one needs. After rerecord_limit such records the callable runs un-graphed,
    instead of capturing at every call."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8).to(device)
    compiled = torch.compile(model, mode="reduce-overhead")
    weights = [torch.nn.Parameter(torch.randn_like(model.weight)) for _ in range(3)]
    x = torch.randn(4, 16, device=device)
    limit = inductor_xpugraph.config.rerecord_limit
    with inductor_xpugraph.config.patch(static_input_variants=2), torch.no_grad():
        for step in range(30):
            swap_to(model, weights[step % 3])
            torch.testing.assert_close(compiled(x), model(x))
    stats = inductor_xpugraph.stats()
    assert stats["fallbacks"] == 1 and stats["replays"] == 0
    assert stats["records"] == 1 + limit  # the first, then limit re-records
    reasons = [e.reason for e in inductor_xpugraph.report().events if e.kind.name == "FALLBACK"]
    assert any("dropped to keep at most 2 variants" in reason for reason in reasons)


def test_a_graph_recorded_below_a_cycling_one_falls_back_too(device):
    """The second graph of a step is recorded below whichever variant of the first ran,
    at a place where it has no recording to be a variant of; when the first graph's
    variants are evicted, the second graph's recordings go with them. It too must not
    capture at every step."""
    torch.manual_seed(0)
    first, second = torch.nn.Linear(16, 16).to(device), torch.nn.Linear(16, 8).to(device)

    def step(x):
        hidden = first(x)
        torch._dynamo.graph_break()
        return second(hidden)

    compiled = torch.compile(step, mode="reduce-overhead")
    weights = [torch.nn.Parameter(torch.randn_like(first.weight)) for _ in range(3)]
    x = torch.randn(4, 16, device=device)
    with inductor_xpugraph.config.patch(static_input_variants=2), torch.no_grad():
        for i in range(40):
            swap_to(first, weights[i % 3])
            torch.testing.assert_close(compiled(x), step(x))
        records, replays = (inductor_xpugraph.stats()[k] for k in ("records", "replays"))
        for i in range(6):
            swap_to(first, weights[i % 3])
            compiled(x)
    stats = inductor_xpugraph.stats()
    assert stats["records"] == records  # nothing records at every step any more
    # The first graph stopped; the second, now first of its step, replays at every step.
    assert stats["fallbacks"] == 1 and stats["replays"] == replays + 6


def test_weights_loaded_in_place_reach_the_next_replay(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU()).to(device)
    compiled = torch.compile(model, mode="reduce-overhead")
    x = torch.randn(4, 16, device=device)
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
        other = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU()).to(device)
        model.load_state_dict(other.state_dict())  # copies into the same tensors
        torch.testing.assert_close(compiled(x), other(x))
    stats = inductor_xpugraph.stats()
    assert (stats["records"], stats["rerecords"], stats["replays"]) == (1, 0, 2)


def gather_again(tensor: torch.Tensor, held: list) -> None:
    """What FSDP2 does to a layer's gathered parameters at each step: free the memory
    (``resize_(0)``) and gather the values again into the same storage, which the allocator
    places anywhere. ``held`` keeps the memory it had, so that it cannot come back there."""
    storage, values, before = tensor.untyped_storage(), tensor.detach().clone(), tensor.data_ptr()
    while tensor.data_ptr() == before:
        nbytes = storage.nbytes()
        storage.resize_(0)
        held.append(torch.empty(nbytes, dtype=torch.uint8, device=tensor.device))
        storage.resize_(nbytes)
    with torch.no_grad():
        tensor.copy_(values)


def compiled_linear(device):
    """A Linear 16 -> 8 (seeded), its compiled form, and an input for it."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8).to(device)
    return model, torch.compile(model, mode="reduce-overhead"), torch.randn(4, 16, device=device)


def test_a_parameter_whose_memory_moves_in_place_at_every_call_is_copied_and_replays(device):
    (model, compiled, x), held = compiled_linear(device), []
    with torch.no_grad():
        for _ in range(12):  # more calls than the thrash guard's limit
            gather_again(model.weight, held)
            torch.testing.assert_close(compiled(x), model(x))
    stats = inductor_xpugraph.stats()
    # Seen moving between the warmup and the record: copied from the first recording.
    assert (stats["records"], stats["rerecords"], stats["replays"]) == (1, 0, 10)
    (recording,) = [node.recording for tree in all_trees() for node in tree.nodes()]
    assert recording.moving_input_bytes() == model.weight.nbytes


def test_memory_that_starts_moving_after_the_recording_costs_one_more_record(device):
    (model, compiled, x), held = compiled_linear(device), []
    with torch.no_grad():
        for _ in range(3):  # warmup, record, replay where it lies
            compiled(x)
        for _ in range(12):
            gather_again(model.weight, held)
            torch.testing.assert_close(compiled(x), model(x))
    stats = inductor_xpugraph.stats()
    assert (stats["records"], stats["rerecords"], stats["fallbacks"]) == (2, 1, 0)
    assert stats["replays"] == 1 + 11
    # The copying recording replaces the one that read the weight where it lay.
    assert len([node for tree in all_trees() for node in tree.nodes()]) == 1


def test_memory_that_moved_once_and_settled_is_read_where_it_lies_again(device):
    (model, compiled, x), held = compiled_linear(device), []
    with torch.no_grad():
        compiled(x)  # the warmup
        gather_again(model.weight, held)  # as FSDP2's gathers move once the optimizer has state
        for _ in range(8):
            torch.testing.assert_close(compiled(x), model(x))
    stats = inductor_xpugraph.stats()
    # Copied from the record; put for its own replay and two more: recorded again in place,
    # and the last four calls replay that recording.
    assert (stats["records"], stats["rerecords"], stats["replays"]) == (2, 1, 2 + 4)
    (recording,) = [node.recording for tree in all_trees() for node in tree.nodes()]
    assert recording.moving_input_bytes() == 0 and recording.moving_inputs == ()


def test_memory_that_moves_again_after_it_settled_is_copied_for_good(device):
    (model, compiled, x), held = compiled_linear(device), []
    with torch.no_grad():
        compiled(x)
        gather_again(model.weight, held)
        for _ in range(4):  # recorded copying, then in place
            compiled(x)
        for _ in range(6):
            gather_again(model.weight, held)
            torch.testing.assert_close(compiled(x), model(x))
        for _ in range(5):  # still again: copied all the same, never recorded again
            torch.testing.assert_close(compiled(x), model(x))
    stats = inductor_xpugraph.stats()
    assert (stats["records"], stats["rerecords"], stats["fallbacks"]) == (3, 2, 0)
    (recording,) = [node.recording for tree in all_trees() for node in tree.nodes()]
    assert recording.moving_input_bytes() == model.weight.nbytes
    assert recording.why_copied() == "moved again after it had settled"


def test_a_settled_recording_for_other_parameters_never_replays_this_call(device):
    """Two biases in turn (two variants), over a weight that moved once: both recordings copy
    the weight and see it settle. When it then moves again, each call replays the recording
    for its own bias, not another settled one."""
    (model, compiled, x), held = compiled_linear(device), []
    biases = [model.bias, torch.nn.Parameter(torch.randn_like(model.bias))]
    with torch.no_grad():
        compiled(x)
        gather_again(model.weight, held)
        for i in range(6):  # both recorded copying; both settled at their last replay
            model.bias = biases[i % 2]
            torch.testing.assert_close(compiled(x), model(x))
        assert all(node.recording.copies_settled for tree in all_trees() for node in tree.nodes())
        gather_again(model.weight, held)
        for i in range(4):
            model.bias = biases[i % 2]
            torch.testing.assert_close(compiled(x), model(x))


def test_memory_that_starts_moving_below_a_graph_that_lent_memory_is_recorded_and_replays(device):
    """The second graph's recording reused memory of the first's dead output. When its weight
    first moves after that, its new recording goes below the first graph beside the old one:
    with allocator checkpointing that is one more record; with owned outputs (portable) the
    lent memory cannot be reserved again, so the tree records both graphs once more, without
    lending. Either way every later step replays both."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 64).to(device)
    first = torch.compile(lambda x: ((x * 2).relu(), x + 1), mode="reduce-overhead")
    second = torch.compile(layer, mode="reduce-overhead")
    x, held, counts = torch.randn(64, 64, device=device), [], []
    with torch.no_grad():
        for step in range(8):  # warmup, record, replay, then the weight moves at every step
            inductor_xpugraph.mark_step_begin()
            if step >= 3:
                gather_again(layer.weight, held)
            a, b = first(x)
            del a  # dead when `second` is recorded: its capture may reuse the memory
            torch.testing.assert_close(second(b), layer(x + 1))
            stats = inductor_xpugraph.stats()
            counts.append((stats["records"], stats["replays"]))
    (tree,) = [tree for tree in all_trees() if tree.nodes()]
    records = {"allocator_checkpointing": 3, "owned_outputs": 4}[tree.memory.name]
    assert (stats["records"], stats["fallbacks"]) == (records, 0), counts
    assert [replays for _, replays in counts[-3:]] == [counts[-4][1] + 2 * n for n in (1, 2, 3)]


def test_training_with_a_parameter_whose_memory_moves_replays_with_eager_gradients(device):
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64).to(device)
    reference = torch.nn.Linear(64, 64).to(device)
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, mode="reduce-overhead")
    held = []
    for _ in range(5):
        x = torch.randn(4, 64, device=device)
        gather_again(model.weight, held)
        compiled(x).square().sum().backward()
        reference(x).square().sum().backward()
        torch.testing.assert_close(model.weight.grad, reference.weight.grad)
        model.zero_grad(), reference.zero_grad()
    stats = inductor_xpugraph.stats()
    assert (stats["records"], stats["replays"], stats["rerecords"]) == (2, 6, 0)


# Written as Inductor writes a wrapper's ``call`` (the emulator captures only such code): a
# forward that returns a view of its weight for the backward, as AOTAutograd's forwards may.
RETURNS_ITS_WEIGHT = """
def call(args):
    x, w = args
    args.clear()
    out = empty_strided_cpu((4, 8), (8, 1), torch.float32) if x.is_cpu else x.new_empty(4, 8)
    torch.mm(x, w.t(), out=out)
    return [out, w.t()]
"""


def test_an_output_over_a_moving_parameter_is_the_callers_memory_not_a_copy(device):
    """Over a parameter whose memory moves, an output that is the parameter or a view of it
    is built over the caller's tensor, as without graphs: it reads the parameter as it is
    when read (FSDP2 gathers it again for the backward), and the graph's copy is scratch."""
    from inductor_xpugraph.trees import graphify

    module = {"torch": torch, "empty_strided_cpu": _empty_strided_cpu}
    exec(RETURNS_ITS_WEIGHT, module)
    graphed = graphify(module["call"], device=f"{device}:0", static_inputs=(1,), name="fwd")
    weight, held = torch.randn(8, 16, device=device), []
    for _ in range(5):
        x = torch.randn(4, 16, device=device)
        gather_again(weight, held)
        out, saved = graphed([x, weight])
        torch.testing.assert_close(out, x @ weight.t())
        assert saved.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr()
        gather_again(weight, held)  # freed and gathered again before it is read
        torch.testing.assert_close(saved, weight.t())
    (node,) = inductor_xpugraph.report().nodes()
    assert (node.replays, node.output_bytes) == (3, out.nbytes)  # no copy of the weight kept


def _empty_strided_cpu(size, stride, dtype):
    return torch.empty_strided(size, stride, dtype=dtype)


def test_a_written_buffer_whose_memory_moves_is_recorded_again_not_copied(device):
    """A copy would take the write: a written input is never copied, its moves are
    re-records for the thrash guard to count."""

    class Counting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros(4))

        def forward(self, x):
            self.calls.add_(1)
            return x + self.calls

    model = Counting().to(device)
    compiled = torch.compile(model, mode="reduce-overhead")
    x, held = torch.randn(4, device=device), []
    with torch.no_grad():
        for call in range(1, 6):
            gather_again(model.calls, held)
            torch.testing.assert_close(compiled(x), x + call)
    assert model.calls.tolist() == [5.0] * 4
    stats = inductor_xpugraph.stats()
    assert stats["rerecords"] + stats["fallbacks"] >= 2 and not any(
        node.recording.moving_inputs for tree in all_trees() for node in tree.nodes()
    )


def test_the_report_says_which_inputs_move_and_what_copying_them_costs(device):
    (model, compiled, x), held = compiled_linear(device), []
    with torch.no_grad():
        for _ in range(5):
            gather_again(model.weight, held)
            compiled(x)
    (graphed,) = [c for c in inductor_xpugraph.report().callables if c.moving_inputs]
    assert graphed.moving_inputs.startswith("input ")  # which one, and where it is read
    assert (graphed.moving_bytes, graphed.moving_replays) == (model.weight.nbytes, 3)
    assert graphed.moving_why == "moved after this graph was recorded"
    assert "memory moves in place between calls" in str(inductor_xpugraph.report())


def test_a_static_input_recreated_once_per_request_stays_graphed(device):
    """A KV cache allocated per ``generate`` call (a ``mark_static_address`` tensor the graph
    writes into) is a new address set per request: one recording each, never a fallback,
    while the same number of new sets on consecutive steps is thrash and falls back."""

    def decode_step(token, cache):
        cache.mul_(0.5).add_(token)  # written in place, as a KV cache is
        return cache.sum(dim=0)

    compiled = torch.compile(decode_step, mode="reduce-overhead")
    caches = []  # every cache stays alive (as results kept by a caller): all addresses new
    with inductor_xpugraph.config.patch(rerecord_limit=2, rerecord_window=8):
        for _request in range(6):
            caches.append(torch.zeros(4, 32, device=device))
            torch._dynamo.mark_static_address(caches[-1])
            expected = torch.zeros(4, 32, device=device)
            for _step in range(5):
                token = torch.randn(4, 32, device=device)
                expected = expected * 0.5 + token
                torch.testing.assert_close(compiled(token, caches[-1]), expected.sum(dim=0))
        stats = inductor_xpugraph.stats()
        assert (stats["records"], stats["rerecords"], stats["fallbacks"]) == (6, 5, 0)
        assert stats["replays"] == 6 * 5 - 6 - 1  # every step but the records and the warmup
        for _step in range(3):  # a new cache on every step: thrash
            caches.append(torch.zeros(4, 32, device=device))
            torch._dynamo.mark_static_address(caches[-1])
            compiled(torch.randn(4, 32, device=device), caches[-1])
    assert inductor_xpugraph.stats()["fallbacks"] == 1


class RunningState:
    """State a caller keeps and a compiled step writes in place (a cache of one request)."""

    def __init__(self, device):
        self.total = torch.zeros(4, 32, device=device)


def run_requests(device, requests: int, steps: int):
    """``requests`` requests of ``steps`` steps, each with state of its own, dropped after
    it (as ``generate`` drops the cache it made); every step's result checked."""

    def step(state, token):
        state.total.mul_(0.5).add_(token)  # written in place, as a KV cache is
        return state.total.sum(dim=0)

    compiled = torch.compile(step, mode="reduce-overhead")
    state = None
    for _request in range(requests):
        # Made while the last one lives, so that it lies elsewhere (a caching allocator would
        # hand it the memory just freed, where the last recording replays as it is).
        state, previous = RunningState(device), state
        del previous
        expected = torch.zeros(4, 32, device=device)
        for _step in range(steps):
            token = torch.randn(4, 32, device=device)
            expected = expected * 0.5 + token
            torch.testing.assert_close(compiled(state, token), expected.sum(dim=0))


def test_new_state_per_request_moves_into_the_recording_of_the_last(device):
    """Each request's state, laid out as the last one's, moves into the memory the recording
    kept (Note [State moved into a recording's memory]): recorded once, every step of the
    later requests replayed, nothing counted by the guard."""
    with inductor_xpugraph.config.patch(rerecord_limit=2, rerecord_window=64):
        run_requests(device, requests=12, steps=4)
    counts = inductor_xpugraph.stats()
    assert (counts["fallbacks"], counts["rerecords"], counts["records"]) == (0, 0, 1), counts
    assert counts["adoptions"] == 11 and counts["replays"] == 2 + 11 * 4, counts
    (tree,) = all_trees()
    assert len(tree.nodes()) == 1


def test_a_recording_whose_state_died_after_it_replayed_is_replaced_not_counted(device):
    """Without keeping the state's memory: each request's first step runs un-graphed (the
    state is new there; the first request warms up instead), the second records, the rest
    replay. A request's recording pays off, so the next request's replaces it without
    counting against the guard, for as many requests as there are, and the dropped
    recordings do not pile up."""
    with inductor_xpugraph.config.patch(
        rerecord_limit=2, rerecord_window=64, keep_state_memory=False
    ):
        run_requests(device, requests=12, steps=4)
    counts = inductor_xpugraph.stats()
    assert (counts["fallbacks"], counts["rerecords"]) == (0, 0), counts
    assert counts["replacements"] == 11 and counts["replays"] == 12 * 2, counts
    (tree,) = all_trees()
    assert len(tree.nodes()) == 1


def test_state_that_dies_before_its_recording_ever_replays_is_churn_the_guard_stops(device):
    """Without keeping the state's memory, two steps per request: the recording never
    replays before its state dies. Those re-records count, and the fallback names who held
    the state and the fix."""
    with inductor_xpugraph.config.patch(
        rerecord_limit=2, rerecord_window=64, keep_state_memory=False
    ):
        run_requests(device, requests=6, steps=2)
    counts = inductor_xpugraph.stats()
    assert counts["fallbacks"] == 1 and counts["replacements"] == 0, counts
    (reason,) = [e.reason for e in stats.events.values() if e.kind is stats.EventKind.FALLBACK]
    assert "held as `total` of a RunningState" in reason and "one such object" in reason
    assert len(reason) < 600, reason


def test_new_and_dropped_address_sets_in_turn_share_one_limit(device):
    """Weights that alternate between sets never seen before and sets the bound on variants
    dropped record at every call: the guard counts both kinds on one clock, so the callable
    stops after ``rerecord_limit`` re-records."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8).to(device)
    compiled = torch.compile(model, mode="reduce-overhead")
    weights = [torch.nn.Parameter(torch.randn_like(model.weight)) for _ in range(8)]
    order = [0, 1, 2, 0, 3, 1, 4, 2, 5, 0, 6, 1, 7, 2]  # with 2 kept, none is kept when it comes
    x = torch.randn(4, 16, device=device)
    with inductor_xpugraph.config.patch(static_input_variants=2, rerecord_limit=4):
        with torch.no_grad():
            compiled(x)  # warmup
            for index in order:
                swap_to(model, weights[index])
                torch.testing.assert_close(compiled(x), model(x))
    stats = inductor_xpugraph.stats()
    assert (stats["records"], stats["replays"], stats["fallbacks"]) == (1 + 4, 0, 1)


class _Run(torch.nn.Module):
    def forward(self, module, x):
        return module(x)


def test_a_new_module_passed_in_at_every_call_stops_recording_within_the_limit(device):
    """``run(module, x)`` compiled once and given a new ``nn.Linear`` at every call: its
    parameters are graph inputs at new (or recycled) addresses every time. Recording at every
    call and never replaying is what the guard exists to stop."""
    run = torch.compile(_Run(), mode="reduce-overhead")
    x = torch.randn(4, 8, device=device)
    limit = inductor_xpugraph.config.rerecord_limit
    with torch.no_grad():
        for seed in range(14):
            torch.manual_seed(seed)
            module = torch.nn.Linear(8, 8).to(device)
            torch.testing.assert_close(run(module, x), module(x))
    stats = inductor_xpugraph.stats()
    assert stats["records"] <= 1 + limit
    assert stats["fallbacks"] == 1 or stats["replays"] > 0


def test_settings_set_on_the_compiling_thread_hold_for_a_backward_on_another_thread(device):
    """Settings set in code are per thread (torch >= 2.13): a backward run by another thread
    (autograd's device thread on a GPU, here a Python thread) reads defaults. The graphs keep
    what was set where they were compiled: three warmups here, where the default is one."""
    import threading

    model = torch.nn.Linear(8, 8).to(device)
    compiled = torch.compile(model, mode="reduce-overhead")
    x = torch.randn(4, 8, device=device)
    with inductor_xpugraph.config.patch(warmup_runs=3):
        compiled(x).sum().backward()  # compiles the forward and the backward: a warmup each
    records = []

    def train_steps():
        for _ in range(3):
            compiled(x).sum().backward()
            records.append(inductor_xpugraph.stats()["records"])

    worker = threading.Thread(target=train_steps)
    worker.start()
    worker.join()
    assert records == [0, 0, 2]  # two more warmups, then the forward and backward record


# -- another warmup, asked for from inside one ---------------------------------------------------

# Calls still unsettled of the autotuner below; it asks for another warmup while any are left.
_unsettled = {"calls": 0, "ask": None}


@torch.library.custom_op("inductor_xpugraph_tests::autotuned_double", mutates_args=())
def autotuned_double(x: torch.Tensor) -> torch.Tensor:
    """An op whose autotuner settles after a few calls, asking for another warmup until then."""
    if _unsettled["calls"]:
        _unsettled["calls"] -= 1
        _unsettled["ask"]()
    return x * 2


@autotuned_double.register_fake
def _(x):
    return torch.empty_like(x)


def run_autotuned(device, calls, unsettled, ask):
    """``calls`` steps of a compiled function around the op; our counters after them."""
    _unsettled.update(calls=unsettled, ask=ask)
    compiled = torch.compile(lambda x: autotuned_double(x + 1), mode="reduce-overhead")
    x = torch.ones(8, device=device)
    for _ in range(calls):
        torch.compiler.cudagraph_mark_step_begin()
        torch.testing.assert_close(compiled(x), (x + 1) * 2)
    stats = inductor_xpugraph.stats()
    return stats["warmups"], stats["records"], stats["replays"]


def test_a_warmup_that_asks_for_another_runs_again_before_recording(device):
    """An autotuner that has not settled, running inside the compiled code, keeps the graph
    warming up (upstream's ``torch.compiler.cudagraph_mark_warmup_incomplete()``)."""
    assert run_autotuned(device, 5, 2, inductor_xpugraph.mark_warmup_incomplete) == (3, 1, 1)


def test_asking_for_another_warmup_outside_one_does_nothing(device):
    inductor_xpugraph.mark_warmup_incomplete()
    assert run_autotuned(device, 3, 0, None) == (1, 1, 1)


@pytest.mark.skipif(
    not hasattr(torch.compiler, "cudagraph_mark_warmup_incomplete"),
    reason="this torch has no torch.compiler.cudagraph_mark_warmup_incomplete",
)
def test_upstreams_call_asks_ours_for_another_warmup_too(device):
    ask = torch.compiler.cudagraph_mark_warmup_incomplete
    assert run_autotuned(device, 3, 1, ask) == (2, 1, 0)


@needs_upstream("cudagraph_unexpected_rerecord_limit")
def test_upstreams_unexpected_rerecord_limit_replaces_ours_where_set():
    with inductor_xpugraph.config.patch(rerecord_limit=5, rerecord_window=7):
        assert RecordingSettings.current().rerecord_limit == 5
        with upstream(cudagraph_unexpected_rerecord_limit=2):
            settings = RecordingSettings.current()
    assert (settings.rerecord_limit, settings.rerecord_window) == (2, None)
    assert "cudagraph_unexpected_rerecord_limit=2" in RecordingPolicy("f", None, settings).limits[1]


def test_with_no_window_re_records_count_for_the_life_of_the_process():
    policy = policy_with(rerecord_limit=2, rerecord_window=None)
    assert [policy.note_rerecord(generation) for generation in (0, 1000, 2000)] == [
        False,
        False,
        True,
    ]


@needs_upstream("cudagraph_unexpected_rerecord_limit")
def test_past_upstreams_unexpected_rerecord_limit_the_fallback_names_it(device, caplog):
    with upstream(cudagraph_unexpected_rerecord_limit=2):
        _consume_each_output_in_turn(device, 8, managed_input_rerecord_limit=0)
    assert inductor_xpugraph.stats()["fallbacks"] == 1
    said = [r.getMessage() for r in caplog.records if "un-graphed from now on" in r.getMessage()]
    assert said and "triton.cudagraph_unexpected_rerecord_limit=2" in said[0]


@needs_upstream("force_cudagraph_sync")
def test_with_force_cudagraph_sync_every_call_synchronizes_the_device(device, monkeypatch):
    from inductor_xpugraph.trees.per_thread import tree_for

    synchronized = []
    backend_type = type(tree_for(device).backend)
    monkeypatch.setattr(backend_type, "synchronize", lambda self: synchronized.append(self))
    with upstream(force_cudagraph_sync=True):
        compiled = torch.compile(lambda x: x.sin(), mode="reduce-overhead")
        for _ in range(4):  # a warmup, a record, two replays
            x = torch.randn(8, device=device)
            torch.testing.assert_close(compiled(x), x.sin())
    assert len(synchronized) == 4 and inductor_xpugraph.stats()["replays"] == 2


@needs_upstream("fast_path_cudagraph_asserts")
def test_upstreams_fast_path_asserts_check_the_outputs_the_caller_holds(device):
    with upstream(fast_path_cudagraph_asserts=True), torch.no_grad():
        first = torch.compile(lambda x: x * 2, mode="reduce-overhead")
        second = torch.compile(lambda y: y + 1, mode="reduce-overhead")
        x = torch.randn(8, device=device)
        for _ in range(3):
            torch.compiler.cudagraph_mark_step_begin()
            held = first(x)
            torch.testing.assert_close(second(held), x * 2 + 1)
    assert inductor_xpugraph.stats()["outputs_checked"] > 0


def test_a_graph_without_debugging_aids_is_a_plain_graphed_callable():
    from inductor_xpugraph.trees.debug_checks import graphed_type
    from inductor_xpugraph.trees.graphed_callable import GraphedCallable

    assert graphed_type(RecordingSettings()) is GraphedCallable


def test_an_upstream_setting_that_has_no_effect_here_says_so_once(monkeypatch, caplog):
    monkeypatch.setattr(stats, "_said", set())
    name = "cudagraph_trees_objgraph"
    if not hasattr(torch._inductor.config.triton, name):
        pytest.skip(f"torch {torch.__version__} has no triton.{name}")
    with torch._inductor.config.patch({f"triton.{name}": True}):
        RecordingSettings.current()
        RecordingSettings.current()
    said = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert len(said) == 1 and "has no effect here" in said[0] and "report()" in said[0]
    RecordingSettings.current()  # back at its default: nothing more is said
    assert len([r for r in caplog.records if name in r.getMessage()]) == 1


# -- the pool's initial allocation -------------------------------------------------------------


def _pool_segment_bytes(tree) -> int:
    """Bytes of the device segments in ``tree``'s pool (cuda), or what the emulated pool was
    asked to reserve."""
    if not hasattr(tree._pool, "handle"):
        return tree._pool.reserved_bytes
    handle = tuple(tree._pool.handle)
    return sum(
        segment["total_size"]
        for segment in torch.cuda.memory_snapshot()
        if tuple(segment.get("segment_pool_id", ())) == handle
    )


def _pool_bytes_after_three_calls(device, **settings) -> int:
    """``_pool_segment_bytes`` of the tree of a Linear compiled and called three times."""
    model = torch.nn.Linear(8, 8).to(device)
    with inductor_xpugraph.config.patch(**settings):
        compiled = torch.compile(model, mode="reduce-overhead")
        x = torch.randn(4, 8, device=device)
        with torch.no_grad():
            for _ in range(3):
                torch.testing.assert_close(compiled(x), model(x))
    (tree,) = [tree for tree in all_trees() if tree.nodes()]
    return _pool_segment_bytes(tree)


def test_the_pool_reserves_the_initial_allocation_when_it_is_made(device):
    assert _pool_bytes_after_three_calls(device, initial_pool_allocation_gb=0.25) >= 2**28


def test_without_an_initial_allocation_the_pool_reserves_nothing_up_front(device):
    assert _pool_bytes_after_three_calls(device) < 2**28


@needs_upstream("cudagraph_initial_mempool_allocation_gb")
def test_upstreams_initial_mempool_allocation_replaces_ours_where_set():
    with inductor_xpugraph.config.patch(initial_pool_allocation_gb=1.0):
        assert RecordingSettings.current().initial_pool_bytes == 2**30
        with upstream(cudagraph_initial_mempool_allocation_gb=0.5):
            assert RecordingSettings.current().initial_pool_bytes == 2**29


def test_a_pool_that_cannot_reserve_says_so_once_and_grows_as_graphs_record(
    emulator, monkeypatch, caplog
):
    from inductor_xpugraph.trees.backends.cpu_emulation import CpuEmulationBackend

    def out_of_memory(self, pool, nbytes):
        raise torch.OutOfMemoryError("out of memory")

    monkeypatch.setattr(CpuEmulationBackend, "reserve_in_pool", out_of_memory)
    monkeypatch.setattr(stats, "_said", set())
    with inductor_xpugraph.config.patch(initial_pool_allocation_gb=64.0):
        compiled = torch.compile(lambda x: x.sin() * 2, mode="reduce-overhead")
        for _ in range(3):
            x = torch.randn(8)
            torch.testing.assert_close(compiled(x), x.sin() * 2)
        assert inductor_xpugraph.stats()["records"] == 1
        inductor_xpugraph.reset()
        for _ in range(2):  # a new pool, which cannot reserve either: not said again
            compiled(x)
    said = [
        r.getMessage() for r in caplog.records if "initial_pool_allocation_gb" in r.getMessage()
    ]
    assert len(said) == 1 and "64.00 GiB failed" in said[0]


# -- inputs an earlier graph produced, moving -----------------------------------------------------


def _consume_each_output_in_turn(device, steps, **settings):
    """Each step: one graph makes six outputs, a second graph reads one of them, a different
    one each step (same step: ``mark_step_begin``), so its input moves at every call. Returns
    the (records, replays) counts after each step."""
    counts = []
    with inductor_xpugraph.config.patch(**settings):
        produce = torch.compile(lambda x: tuple(x + i for i in range(6)), mode="reduce-overhead")
        consume = torch.compile(lambda y: y * 2, mode="reduce-overhead")
        x = torch.randn(8, device=device)
        for step in range(steps):
            torch.compiler.cudagraph_mark_step_begin()
            outputs = produce(x)
            torch.testing.assert_close(consume(outputs[step % 6]), (x + step % 6) * 2)
            stats = inductor_xpugraph.stats()
            counts.append((stats["records"], stats["replays"]))
    return counts


def test_an_input_an_earlier_graph_produced_that_keeps_moving_is_copied_after_the_limit(device):
    counts = _consume_each_output_in_turn(device, 20, managed_input_rerecord_limit=5)
    stats = inductor_xpugraph.stats()
    assert (stats["rerecords"], stats["fallbacks"]) == (5, 0)
    records, replays = counts[-7]
    assert counts[-1] == (records, replays + 2 * 6)  # both graphs replay at every step


def test_with_the_skip_action_the_reader_runs_ungraphed_there_after_the_limit(device):
    counts = _consume_each_output_in_turn(
        device, 20, managed_input_rerecord_limit=5, managed_input_rerecord_action="skip"
    )
    stats = inductor_xpugraph.stats()
    (reason,) = stats["skip_reasons"]
    assert "moved 5 times here" in reason and "'skip'" in reason
    assert stats["fallbacks"] == 0
    assert counts[-1][0] == counts[-7][0]  # nothing records any more


def test_without_a_managed_input_limit_the_thrash_guard_stops_the_reader(device):
    _consume_each_output_in_turn(device, 20, managed_input_rerecord_limit=0)
    assert inductor_xpugraph.stats()["fallbacks"] == 1


@needs_upstream("cudagraph_managed_input_rerecord_limit")
def test_upstreams_managed_input_settings_replace_ours_where_set():
    with inductor_xpugraph.config.patch(managed_input_rerecord_limit=2):
        assert RecordingSettings.current().managed_limit == 2
        with upstream(
            cudagraph_managed_input_rerecord_limit=3, cudagraph_managed_input_rerecord_action="skip"
        ):
            settings = RecordingSettings.current()
    assert (settings.managed_limit, settings.managed_action) == (3, "skip")
