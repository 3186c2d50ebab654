"""no_grad, inference mode, autocast, eval/train switches and threads."""

import threading

import torch


def test_no_grad_and_grad_calls_of_one_module(impl):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8).to(impl.device)
    compiled = impl.compile(model)
    for _ in range(3):
        x = torch.randn(2, 8, device=impl.device)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))
        out = compiled(x)
        assert out.requires_grad
        out.sum().backward()
        model.zero_grad(set_to_none=True)


def test_inference_mode(impl):
    fn = impl.compile(lambda x: x.tanh() * 2)
    with torch.inference_mode():
        for _ in range(4):
            x = torch.randn(8, device=impl.device)
            torch.testing.assert_close(fn(x), x.tanh() * 2)


def test_autocast(impl):
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16).to(impl.device)
    compiled = impl.compile(model)
    dtype = torch.bfloat16
    with torch.no_grad(), torch.autocast(impl.device, dtype=dtype):
        for _ in range(4):
            x = torch.randn(4, 16, device=impl.device)
            out = compiled(x)
            assert out.dtype == dtype
            torch.testing.assert_close(out, model(x), rtol=2e-2, atol=2e-2)


def test_eval_and_train_switches(impl):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)).to(impl.device)
    compiled = impl.compile(model)
    x = torch.randn(4, 8, device=impl.device)
    for _ in range(3):
        model.eval()
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))
        model.train()
        compiled(x).sum().backward()
        model.zero_grad(set_to_none=True)


def test_threads_each_get_their_own_graphs(impl):
    # The inputs are drawn before the threads start: on cuda a random op in one thread while
    # another captures fails in torch's generator ("Offset increment outside graph capture"),
    # with either implementation (README, limits).
    fn = impl.compile(lambda x: x * 3 + 1)
    inputs = [[torch.randn(8, device=impl.device) for _ in range(5)] for _ in range(2)]
    errors = []

    def work(xs):
        try:
            for x in xs:
                torch.testing.assert_close(fn(x), x * 3 + 1)
        except Exception as error:  # reported below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(xs,)) for xs in inputs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
