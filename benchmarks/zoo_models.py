"""The zoo's models, built from their configurations with random weights (nothing downloaded).

A builder takes the batch size and returns a ``Workload``: the ``model`` (float32, on the CPU,
with dropout, drop-path, stochastic depth, layer drop and SpecAugment off, so that eager and
compiled runs compute the same thing); ``make_inputs(generator)``, fresh inputs on the
generator's device (keys starting with ``_`` are training targets); ``loss(output, inputs)``.
Hugging Face models have 2 layers (2 + 2 for encoder-decoders), width 256, 4 heads, a
vocabulary of 8192 and 128 tokens; images are 224 × 224; timm and torchvision models are the
libraries' own. The smoke models are the CPU test's.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

VOCAB, SEQ, WIDTH, HEADS, LAYERS, FFN = 8192, 128, 256, 4, 2, 1024
IMAGE, CLASSES = 224, 1000
SUITES = ("hf", "timm", "torchvision", "smoke")


class Workload(NamedTuple):
    model: torch.nn.Module
    make_inputs: Callable[[torch.Generator], dict[str, torch.Tensor]]
    loss: Callable[[Any, dict[str, torch.Tensor]], torch.Tensor]


@dataclass(frozen=True)
class Spec:
    name: str
    suite: str
    requires: str | None  # the package the builder imports
    build: Callable[[int], Workload]
    heavy: bool = False  # over 600 nodes in its Dynamo graph: left out of the default run


MODELS: dict[str, Spec] = {}
# The largest graphs (600 to 1040 Dynamo nodes, against 100 to 560 for the others): a cold
# compile of each takes minutes of the run's budget, so they run when asked for (--heavy).
HEAVY = (
    "tv_densenet121", "tv_swin_t", "tv_inception_v3", "tv_regnet_y_400mf",
    "timm_ghostnet_100", "timm_levit_128s", "timm_mobilevit_xxs",
)  # fmt: skip


def _add(name: str, suite: str, requires: str | None, build: Callable[[int], Workload]) -> None:
    MODELS[name] = Spec(name, suite, requires, build, heavy=name in HEAVY)


def missing_dependency(spec: Spec) -> str | None:
    """Why the spec's package cannot be imported here, or None."""
    if spec.requires is None:
        return None
    try:
        importlib.import_module(spec.requires)
    except Exception as error:  # an ImportError, or a broken install (a wheel for another torch)
        return f"{spec.requires}: {type(error).__name__}: {str(error)[:120]}"
    return None


def model_inputs(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What the model is called with: the inputs without the training targets."""
    return {k: v for k, v in inputs.items() if not k.startswith("_")}


def quiet(model: torch.nn.Module) -> torch.nn.Module:
    """Dropout, drop-path and stochastic depth off in every module, however the library
    spells them, so that a training step is deterministic."""
    for module in model.modules():
        name = type(module).__name__
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) or name == "StochasticDepth":
            module.p = 0.0
        for attr in ("drop_prob", "dropout", "attention_dropout", "layerdrop", "drop_path_rate"):
            if isinstance(getattr(module, attr, None), float):
                setattr(module, attr, 0.0)
    return model


def first_tensor(output: Any) -> torch.Tensor:
    """The logits: ``.logits`` of a Hugging Face output, the first element of a tuple (timm's
    distilled heads, torchvision's Inception in training), or the tensor itself."""
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "logits"):
        return output.logits
    return first_tensor(output[0])


def _wide(t: torch.Tensor) -> torch.Tensor:
    """float32, or float64 for the float64 reference."""
    return t if t.dtype == torch.float64 else t.float()


def cross_entropy(output: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy of the logits against ``inputs["_labels"]`` (per token or per sample)."""
    logits = _wide(first_tensor(output))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), inputs["_labels"].reshape(-1))


def binary_cross_entropy(output: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = _wide(first_tensor(output))
    return F.binary_cross_entropy_with_logits(logits, inputs["_labels"].to(logits.dtype))


# -- Hugging Face -------------------------------------------------------------------------------


def _text(batch: int, labels: str, classes: int = VOCAB, decoder: bool = False):
    """Token ids and an attention mask (the second half of the batch padded by an eighth);
    ``decoder``: decoder ids of half the length. Labels: ``tokens`` (one per target token),
    ``sequence`` (one per sample) or ``binary`` (0/1 per token)."""

    def make(gen: torch.Generator) -> dict[str, torch.Tensor]:
        device = gen.device
        ids = torch.randint(4, VOCAB, (batch, SEQ), device=device, generator=gen)
        mask = torch.ones(batch, SEQ, dtype=torch.long, device=device)
        mask[batch // 2 :, SEQ - SEQ // 8 :] = 0
        inputs = {"input_ids": ids, "attention_mask": mask}
        target_len = SEQ
        if decoder:
            target_len = SEQ // 2
            shape = (batch, target_len)
            inputs["decoder_input_ids"] = torch.randint(
                4, VOCAB, shape, device=device, generator=gen
            )
        if labels == "sequence":
            inputs["_labels"] = torch.randint(0, classes, (batch,), device=device, generator=gen)
        else:
            high = 2 if labels == "binary" else classes
            shape = (batch, target_len)
            inputs["_labels"] = torch.randint(0, high, shape, device=device, generator=gen)
        return inputs

    return make


def _images(batch: int, size: int = IMAGE, key: str = "pixel_values"):
    def make(gen: torch.Generator) -> dict[str, torch.Tensor]:
        device = gen.device
        pixels = torch.randn(batch, 3, size, size, device=device, generator=gen)
        labels = torch.randint(0, CLASSES, (batch,), device=device, generator=gen)
        return {key: pixels, "_labels": labels}

    return make


def _quiet_config(config: Any) -> Any:
    """Every dropout-like probability of a transformers config to 0 (read at construction)."""
    for attr, value in list(vars(config).items()):
        if isinstance(value, float) and ("drop" in attr or attr.endswith("_pdrop")):
            setattr(config, attr, 0.0)
    return config


def _hf(name: str, config_class: str, model_class: str, inputs, loss=cross_entropy, **config):
    """A transformers model from ``config_class(**config)``; ``inputs(batch)`` makes the
    inputs factory."""

    def build(batch: int) -> Workload:
        import transformers

        made = _quiet_config(getattr(transformers, config_class)(**config))
        model = getattr(transformers, model_class)(made)
        return Workload(model, inputs(batch), loss)

    _add(name, "hf", "transformers", build)


def _tokens(batch):
    return _text(batch, "tokens")


def _seq2seq(batch):
    return _text(batch, "tokens", decoder=True)


def _without(options: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k not in keys}


_BERT_LIKE = dict(
    vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
    intermediate_size=FFN, max_position_embeddings=512,
)  # fmt: skip
_DECODER = dict(
    vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
    intermediate_size=FFN, max_position_embeddings=512, use_cache=False,
)  # fmt: skip
_BART_LIKE = dict(
    vocab_size=VOCAB, d_model=WIDTH, encoder_layers=LAYERS, decoder_layers=LAYERS,
    encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=FFN,
    decoder_ffn_dim=FFN, max_position_embeddings=512, use_cache=False,
    pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
)  # fmt: skip

# Encoders
_hf("hf_bert", "BertConfig", "BertForMaskedLM", _tokens, **_BERT_LIKE)
_hf(
    "hf_roberta", "RobertaConfig", "RobertaForSequenceClassification",
    lambda b: _text(b, "sequence", classes=3),
    **{**_BERT_LIKE, "max_position_embeddings": 514}, num_labels=3, pad_token_id=1,
)  # fmt: skip
_hf(
    "hf_distilbert", "DistilBertConfig", "DistilBertForMaskedLM", _tokens,
    vocab_size=VOCAB, dim=WIDTH, n_layers=LAYERS, n_heads=HEADS, hidden_dim=FFN,
)  # fmt: skip
_hf("hf_albert", "AlbertConfig", "AlbertForMaskedLM", _tokens, **_BERT_LIKE, embedding_size=128)
_hf(
    "hf_deberta_v2", "DebertaV2Config", "DebertaV2ForMaskedLM", _tokens, **_BERT_LIKE,
    relative_attention=True, position_buckets=256, pos_att_type=["p2c", "c2p"],
    norm_rel_ebd="layer_norm", share_att_key=True, max_relative_positions=-1,
    position_biased_input=False,
)  # fmt: skip
_hf(
    "hf_electra", "ElectraConfig", "ElectraForPreTraining", lambda b: _text(b, "binary"),
    binary_cross_entropy, **_BERT_LIKE, embedding_size=128,
)  # fmt: skip
_hf(
    "hf_mobilebert", "MobileBertConfig", "MobileBertForMaskedLM", _tokens,
    vocab_size=VOCAB, num_hidden_layers=4, max_position_embeddings=512,
)  # fmt: skip

# Decoders
_hf(
    "hf_gpt2", "GPT2Config", "GPT2LMHeadModel", _tokens,
    vocab_size=VOCAB, n_positions=512, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS,
    use_cache=False, bos_token_id=0, eos_token_id=0,
)  # fmt: skip
_hf(
    "hf_gpt_neo", "GPTNeoConfig", "GPTNeoForCausalLM", _tokens,
    **_without(_DECODER, "num_hidden_layers", "num_attention_heads"), num_layers=LAYERS,
    num_heads=HEADS,
    attention_types=[[["global", "local"], LAYERS // 2]], window_size=64, bos_token_id=0,
    eos_token_id=0,
)  # fmt: skip
_hf(
    "hf_opt", "OPTConfig", "OPTForCausalLM", _tokens,
    **_without(_DECODER, "intermediate_size"), ffn_dim=FFN, word_embed_proj_dim=WIDTH,
)  # fmt: skip
_hf(
    "hf_bloom", "BloomConfig", "BloomForCausalLM", _tokens,
    vocab_size=VOCAB, hidden_size=WIDTH, n_layer=LAYERS, n_head=HEADS, use_cache=False,
)  # fmt: skip
_hf("hf_llama", "LlamaConfig", "LlamaForCausalLM", _tokens, **_DECODER, num_key_value_heads=4)
_hf(
    "hf_mistral", "MistralConfig", "MistralForCausalLM", _tokens, **_DECODER,
    num_key_value_heads=2, sliding_window=64,
)  # fmt: skip
_hf("hf_qwen2", "Qwen2Config", "Qwen2ForCausalLM", _tokens, **_DECODER, num_key_value_heads=2)
_hf("hf_gpt_neox", "GPTNeoXConfig", "GPTNeoXForCausalLM", _tokens, **_DECODER, rotary_pct=0.25)
_hf("hf_phi", "PhiConfig", "PhiForCausalLM", _tokens, **_DECODER, partial_rotary_factor=0.5)
_hf(
    "hf_gemma", "GemmaConfig", "GemmaForCausalLM", _tokens, **_DECODER,
    num_key_value_heads=1, head_dim=WIDTH // HEADS,
)  # fmt: skip

# Encoder-decoders
_hf(
    "hf_t5", "T5Config", "T5ForConditionalGeneration", _seq2seq,
    vocab_size=VOCAB, d_model=WIDTH, d_kv=WIDTH // HEADS, d_ff=FFN, num_layers=LAYERS,
    num_decoder_layers=LAYERS, num_heads=HEADS, use_cache=False, decoder_start_token_id=0,
)  # fmt: skip
_hf("hf_bart", "BartConfig", "BartForConditionalGeneration", _seq2seq, **_BART_LIKE)
_hf("hf_marian", "MarianConfig", "MarianMTModel", _seq2seq, **_BART_LIKE)
_hf("hf_pegasus", "PegasusConfig", "PegasusForConditionalGeneration", _seq2seq, **_BART_LIKE)

# Vision
_hf(
    "hf_vit", "ViTConfig", "ViTForImageClassification", _images,
    hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
    intermediate_size=FFN, image_size=IMAGE, patch_size=16, num_labels=CLASSES,
)  # fmt: skip
_hf(
    "hf_convnext", "ConvNextConfig", "ConvNextForImageClassification", _images,
    hidden_sizes=[48, 96, 192, 384], depths=[2, 2, 2, 2], num_labels=CLASSES,
)  # fmt: skip


# Audio
def _audio(batch: int, frames: int, samples: int = 16000):
    """One second of 16 kHz audio per sample, and a label per output frame."""

    def make(gen: torch.Generator) -> dict[str, torch.Tensor]:
        device = gen.device
        audio = torch.randn(batch, samples, device=device, generator=gen)
        labels = torch.randint(0, 32, (batch, frames), device=device, generator=gen)
        return {"input_values": audio, "_labels": labels}

    return make


_hf(
    "hf_wav2vec2", "Wav2Vec2Config", "Wav2Vec2ForCTC", lambda b: _audio(b, frames=49),
    vocab_size=32, hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
    intermediate_size=FFN, conv_dim=(256,) * 7, num_conv_pos_embeddings=64,
    apply_spec_augment=False,
)  # fmt: skip


def _mel(batch: int, frames: int):
    """Log-mel features (80 bins) and decoder ids with their next-token labels."""

    def make(gen: torch.Generator) -> dict[str, torch.Tensor]:
        device = gen.device
        features = torch.randn(batch, 80, frames, device=device, generator=gen)
        ids = torch.randint(4, VOCAB, (batch, SEQ // 2), device=device, generator=gen)
        labels = torch.randint(0, VOCAB, (batch, SEQ // 2), device=device, generator=gen)
        return {"input_features": features, "decoder_input_ids": ids, "_labels": labels}

    return make


_hf(
    "hf_whisper", "WhisperConfig", "WhisperForConditionalGeneration",
    lambda b: _mel(b, frames=2 * 750),
    vocab_size=VOCAB, num_mel_bins=80, d_model=WIDTH, encoder_layers=LAYERS,
    decoder_layers=LAYERS, encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
    encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, max_source_positions=750,
    max_target_positions=SEQ, use_cache=False, pad_token_id=0, bos_token_id=1,
    eos_token_id=2, decoder_start_token_id=1,
)  # fmt: skip


# -- timm ----------------------------------------------------------------------------------------


def _timm(name: str) -> None:
    def build(batch: int) -> Workload:
        import timm

        return Workload(
            timm.create_model(name, pretrained=False), _images(batch, key="x"), cross_entropy
        )

    _add(f"timm_{name}", "timm", "timm", build)


for _name in (
    "resnet18", "resnet26d", "efficientnet_b0", "mobilenetv3_large_100", "vit_tiny_patch16_224",
    "convnext_atto", "regnetx_002", "mixer_s16_224", "lcnet_050", "dla34", "mobilenetv4_conv_small",
    "levit_128s", "mobilevit_xxs", "ghostnet_100",
):  # fmt: skip
    _timm(_name)


# -- torchvision ---------------------------------------------------------------------------------


def _torchvision(name: str, **options: Any) -> None:
    def build(batch: int) -> Workload:
        import torchvision

        model = getattr(torchvision.models, name)(weights=None, **options)
        return Workload(model, _images(batch, key="x"), cross_entropy)

    _add(f"tv_{name}", "torchvision", "torchvision", build)


for _name in (
    "resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0",
    "densenet121", "swin_t", "vit_b_16", "convnext_tiny", "regnet_y_400mf", "squeezenet1_1",
    "shufflenet_v2_x1_0",
):  # fmt: skip
    _torchvision(_name)
# PyTorch's default initialization: torchvision's own (truncated normal, std 0.1) makes the
# random model's logits reach 1e11. In training it returns (logits, aux logits).
_torchvision("inception_v3", init_weights=False)


# -- smoke models: tiny, for the CPU test of the script ------------------------------------------


def _mlp(batch: int) -> Workload:
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 128), torch.nn.GELU(),
        torch.nn.Linear(128, 10),
    )  # fmt: skip

    def make(gen: torch.Generator) -> dict[str, torch.Tensor]:
        x = torch.randn(batch, 64, device=gen.device, generator=gen)
        return {
            "input": x,
            "_labels": torch.randint(0, 10, (batch,), device=gen.device, generator=gen),
        }

    return Workload(model, make, cross_entropy)


def _convnet(batch: int) -> Workload:
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10),
    )  # fmt: skip

    def make(gen: torch.Generator) -> dict[str, torch.Tensor]:
        x = torch.randn(batch, 3, 16, 16, device=gen.device, generator=gen)
        return {
            "input": x,
            "_labels": torch.randint(0, 10, (batch,), device=gen.device, generator=gen),
        }

    return Workload(model, make, cross_entropy)


def _tiny_bert(batch: int) -> Workload:
    from transformers import BertConfig, BertForSequenceClassification

    config = _quiet_config(
        BertConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=64, max_position_embeddings=SEQ, num_labels=2,
        )
    )  # fmt: skip
    return Workload(
        BertForSequenceClassification(config), _text(batch, "sequence", 2), cross_entropy
    )


_add("mlp", "smoke", None, _mlp)
_add("convnet", "smoke", None, _convnet)
_add("tiny_bert", "smoke", "transformers", _tiny_bert)
