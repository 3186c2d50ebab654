"""Dynamic shapes: one recording per size, and the switch that skips symbolic graphs."""

import torch


def test_a_dynamic_graph_records_once_per_size_and_replays_each(impl):
    fn = impl.compile(lambda x: x * 2, dynamic=True)
    for size in (3, 5, 7, 3, 5, 7, 3, 5, 7):
        x = torch.randn(size, device=impl.device)
        torch.testing.assert_close(fn(x), x * 2)
    counts = impl.counts()
    assert counts.records == 3
    assert counts.replays == 3


def test_symbolic_graphs_are_skipped_when_asked_and_say_so(impl):
    with impl.skip_dynamic_graphs():
        fn = impl.compile(lambda x, y: x + y, dynamic=True)
        for size in (4, 6, 4):
            x, y = torch.randn(size, device=impl.device), torch.randn(size, device=impl.device)
            torch.testing.assert_close(fn(x, y), x + y)
    assert impl.counts().records == 0
    assert any(
        "symbolic" in message or "sizes" in message or "dynamic" in message
        for message in impl.skip_messages()
    )


def test_automatic_dynamic_shapes_keep_values_right(impl):
    fn = impl.compile(lambda x: x.softmax(-1))
    for size in (8, 9, 10, 8, 9, 10):
        x = torch.randn(2, size, device=impl.device)
        torch.testing.assert_close(fn(x), x.softmax(-1))
