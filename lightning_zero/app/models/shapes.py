"""Named model shapes for random initialisation: the public configs of the reports' models, and small twins.

A shape is the architecture only (no weights), so a benchmark at the reports' scale needs no download, and a
CPU test can run the same code path on a twin a thousand times smaller.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import BlenderbotConfig, DebertaV2Config, GPT2Config, LlamaConfig, PretrainedConfig, T5Config

from lightning_zero.errors import ZeroConfigError

SHAPE_PREFIX = "shape:"


def _deberta_v2(hidden: int, layers: int, heads: int, ffn: int) -> DebertaV2Config:
    # microsoft/deberta-v2-xlarge's config.json, with the sizes as arguments.
    fields: dict[str, Any] = dict(
        vocab_size=128100,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=ffn,
        max_position_embeddings=512,
        type_vocab_size=0,
        relative_attention=True,
        position_buckets=256,
        norm_rel_ebd="layer_norm",
        share_att_key=True,
        pos_att_type=["p2c", "c2p"],
        layer_norm_eps=1e-7,
        max_relative_positions=-1,
        position_biased_input=False,
        conv_kernel_size=3,
        conv_act="gelu",
    )
    return DebertaV2Config(**fields)


def _blenderbot(d_model: int, encoder_layers: int, decoder_layers: int, heads: int, ffn: int) -> BlenderbotConfig:
    # facebook/blenderbot-400M-distill's config.json, with the sizes as arguments.
    return BlenderbotConfig(
        vocab_size=8008,
        d_model=d_model,
        encoder_layers=encoder_layers,
        decoder_layers=decoder_layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn,
        max_position_embeddings=128,
        activation_function="gelu",
        scale_embedding=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        decoder_start_token_id=1,
    )


def _gpt2(embd: int, layers: int, heads: int) -> GPT2Config:
    return GPT2Config(vocab_size=50257, n_positions=1024, n_embd=embd, n_layer=layers, n_head=heads)


def _t5(d_model: int, d_ff: int, layers: int, heads: int, d_kv: int) -> T5Config:
    return T5Config(vocab_size=32128, d_model=d_model, d_ff=d_ff, num_layers=layers, num_heads=heads, d_kv=d_kv)


def _llama(
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    ffn: int,
    tied: bool,
    rope_factor: float,
    positions: int = 131072,
) -> LlamaConfig:
    # meta-llama/Llama-3.2-3B's and Llama-3.1-8B's config.json, with the sizes as arguments; the Llama 3 RoPE
    # scaling changes no shape, and is kept so that the shapes are the published models'.
    fields: dict[str, Any] = dict(
        vocab_size=128256,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=ffn,
        tie_word_embeddings=tied,
        max_position_embeddings=positions,
        rms_norm_eps=1e-5,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": rope_factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192 if positions > 8192 else positions // 4,
        },
        attn_implementation="sdpa",
    )
    return LlamaConfig(**fields)


SHAPES: dict[str, Callable[[], PretrainedConfig]] = {
    "deberta-v2-xlarge": lambda: _deberta_v2(1536, 24, 24, 6144),
    "blenderbot-400M-distill": lambda: _blenderbot(1280, 2, 12, 32, 5120),
    "gpt2-xl": lambda: _gpt2(1600, 48, 25),
    "t5-large": lambda: _t5(1024, 4096, 24, 16, 64),
    "t5-3b": lambda: _t5(1024, 16384, 24, 32, 128),
    "llama-3.2-3b": lambda: _llama(3072, 28, 24, 8, 8192, tied=True, rope_factor=32.0),
    "llama-3.1-8b": lambda: _llama(4096, 32, 32, 8, 14336, tied=False, rope_factor=8.0),
    "tiny-deberta-v2": lambda: _deberta_v2(64, 2, 4, 128),
    "tiny-blenderbot": lambda: _blenderbot(64, 2, 2, 4, 128),
    "tiny-gpt2": lambda: _gpt2(64, 2, 4),
    "tiny-t5": lambda: _t5(64, 128, 2, 4, 16),
    "tiny-llama": lambda: _llama(64, 2, 4, 2, 128, tied=True, rope_factor=32.0, positions=512),
}


def is_shape(source: str) -> bool:
    """Whether ``source`` names a shape (``shape:gpt2-xl``) rather than pretrained weights."""
    return source.startswith(SHAPE_PREFIX)


def shape_config(source: str, vocab_size: int | None = None) -> PretrainedConfig:
    """The config of shape ``source`` (``shape:NAME`` or ``NAME``), with the vocabulary resized if asked."""
    name = source.removeprefix(SHAPE_PREFIX)
    if name not in SHAPES:
        raise ZeroConfigError(f"Unknown model shape {name!r}: choose one of {sorted(SHAPES)}.")
    config = SHAPES[name]()
    if vocab_size is not None:
        config.vocab_size = vocab_size
    return config
