"""Random numbers under replay: each replay draws new numbers, and a seed reproduces them."""

import torch


def test_a_seed_reproduces_the_numbers_of_replays(impl):
    fn = impl.compile(lambda x: x + torch.rand_like(x))
    x = torch.zeros(20, device=impl.device)
    torch.manual_seed(0)
    first = [fn(x).clone() for _ in range(4)]
    torch.manual_seed(0)
    second = [fn(x).clone() for _ in range(4)]
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b)
    assert impl.counts().replays >= 4


def test_each_replay_draws_new_numbers(impl):
    fn = impl.compile(lambda x: x + torch.rand_like(x))
    x = torch.zeros(1000, device=impl.device)
    draws = [fn(x).clone() for _ in range(5)]
    for previous, current in zip(draws[2:], draws[3:]):  # replays
        assert not torch.equal(previous, current)


def test_dropout_in_training_draws_a_new_mask_each_step(impl):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Dropout(0.5)).to(impl.device)
    compiled = impl.compile(model)
    x = torch.randn(8, 64, device=impl.device)
    masks = []
    for _ in range(5):
        out = compiled(x)
        masks.append((out == 0).clone())
        out.sum().backward()
    assert not torch.equal(masks[3], masks[4])
    for mask in masks:  # about half dropped
        assert 0.3 < mask.float().mean().item() < 0.7
