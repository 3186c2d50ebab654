"""The small workloads ``latency.py`` times and ``real_clients.py`` pairs: random weights,
nothing downloaded.

A workload is ``workload(device) -> (make_step, make_inputs)``: ``make_step(compile)`` builds
the callable timed, where ``compile`` turns a function or module into what a variant runs;
``make_inputs()`` gives one call's arguments. ``gpt2_lm``, ``mlp`` and ``next_token_loss`` are
the training clients' models and loss.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def add_one(device: str):
    """``x + 1`` on 16 floats: nothing but overhead."""
    return (lambda compile: compile(lambda x: x + 1)), lambda: (torch.randn(16, device=device),)


def softmax_chain(device: str, static_weights: bool = False):
    """32 × (matmul 64² + softmax) at batch 4: launch-bound. The weights are plain tensors the
    function closes over, copied into the graph at every call; ``static_weights`` marks them
    with ``torch._dynamo.mark_static_address`` (read in place, the user's lever)."""
    torch.manual_seed(0)
    weights = [torch.randn(64, 64, device=device) * 0.1 for _ in range(32)]
    if static_weights:
        for w in weights:
            torch._dynamo.mark_static_address(w)

    def chain(x):
        for w in weights:
            x = torch.softmax(x @ w, dim=-1)
        return x

    return (lambda compile: compile(chain)), lambda: (torch.randn(4, 64, device=device),)


class DecoderLayer(torch.nn.Module):
    def __init__(self, dim: int, heads: int, max_len: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.out = torch.nn.Linear(dim, dim, bias=False)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim)
        )
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        cache_shape = (1, heads, max_len, self.head_dim)
        self.register_buffer("k_cache", torch.zeros(cache_shape))
        self.register_buffer("v_cache", torch.zeros(cache_shape))

    def forward(self, x, pos, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, self.head_dim).transpose(1, 2) for z in (q, k, v))
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        attn = torch.nn.functional.scaled_dot_product_attention(
            q, self.k_cache, self.v_cache, attn_mask=mask
        )
        x = x + self.out(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class TinyDecoder(torch.nn.Module):
    """4 layers × 256 with a static KV cache, gpt-fast style: a call is one decode step."""

    def __init__(self, vocab=5000, dim=256, heads=4, layers=4, max_len=256) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.layers = torch.nn.ModuleList(DecoderLayer(dim, heads, max_len) for _ in range(layers))
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.register_buffer("causal", torch.ones(max_len, max_len, dtype=torch.bool).tril())

    def forward(self, token, pos):
        mask = self.causal[pos].view(1, 1, 1, -1)
        x = self.embed(token)
        for layer in self.layers:
            x = layer(x, pos, mask)
        return self.head(x)


def decode(device: str):
    torch.manual_seed(0)
    model = TinyDecoder().to(device).eval()
    position = iter(range(10**9))

    def inputs():
        pos = next(position) % 256
        return torch.randint(0, 5000, (1, 1), device=device), torch.tensor([pos], device=device)

    return _no_grad(model), inputs


def gpt2_lm(device: str) -> torch.nn.Module:
    """GPT-2, 4 layers × 256, vocabulary 5000, without dropout (runs compare exactly)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=4, n_head=4, n_embd=256, vocab_size=5000, n_positions=128,
        attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0,
    )  # fmt: skip
    return GPT2LMHeadModel(config).to(device)


def next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1)
    )


def mlp(device: str | torch.device, width: int = 1024, layers: int = 4) -> torch.nn.Module:
    torch.manual_seed(0)
    blocks = [m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.GELU())]
    return torch.nn.Sequential(*blocks).to(device)


MODELS = ("gpt2", "bert", "resnet18")


def model_and_inputs(name: str, device: str) -> tuple[torch.nn.Module, tuple]:
    """A small inference model of ``MODELS``, whose synchronized calls are short enough that
    the host's work before the launch shows, and its inputs."""
    torch.manual_seed(0)
    if name == "resnet18":
        import torchvision

        model = torchvision.models.resnet18(weights=None)
        return model.to(device).eval(), (torch.randn(1, 3, 64, 64, device=device),)
    import transformers

    if name == "gpt2":
        config = transformers.GPT2Config(
            n_layer=4, n_head=4, n_embd=256, vocab_size=5000, n_positions=128
        )
        model, shape, vocab = transformers.GPT2Model(config), (1, 32), 5000
    else:
        config = transformers.BertConfig(
            hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512
        )
        model, shape, vocab = transformers.BertModel(config), (2, 48), 30000
    return model.to(device).eval(), (torch.randint(0, vocab, shape, device=device),)


def first_output(model: torch.nn.Module) -> Callable[..., torch.Tensor]:
    """The model's first output tensor (transformers return model outputs)."""

    def forward(*args):
        out = model(*args)
        return out if isinstance(out, torch.Tensor) else out[0]

    return forward


def _model_workload(name: str):
    def workload(device: str):
        model, inputs = model_and_inputs(name, device)
        return _no_grad(first_output(model)), lambda: inputs

    return workload


def _no_grad(model):
    def make_step(compile):
        compiled = compile(model)

        def step(*args):
            with torch.no_grad():
                return compiled(*args)

        return step

    return make_step


WORKLOADS = {
    "add_one": add_one,
    "softmax_chain": softmax_chain,
    "softmax_chain_static": lambda device: softmax_chain(device, static_weights=True),
    "decode": decode,
    **{name: _model_workload(name) for name in MODELS},
}
