"""Build Hugging Face models and tokenizers from a local folder, a shipped model, a hub name, or a shape."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase

from lightning_zero.app.models.shapes import is_shape, shape_config
from lightning_zero.app.models.source import resolve_pretrained
from lightning_zero.errors import ZeroConfigError
from lightning_zero.internals import auto_class_model_classes


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """A tokenizer from a folder, a shipped model or the hub; refuses one with an empty vocabulary."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_pretrained(name_or_path))
    if len(tokenizer) == 0:
        raise ZeroConfigError(f"Tokenizer {name_or_path!r} loaded with an empty vocabulary: point it at a folder.")
    return tokenizer


def build_model(auto_class: Any, source: str, vocab_size: int | None = None, **config_overrides: Any) -> nn.Module:
    """``auto_class`` (e.g. ``AutoModelForSequenceClassification``) from pretrained weights or a random shape.

    Args:
        auto_class: A transformers ``AutoModelFor...`` class.
        source: A local folder, a hub name, or ``shape:NAME`` (see :mod:`lightning_zero.app.models.shapes`).
        vocab_size: For shapes, the tokenizer's vocabulary size; ignored for pretrained weights.
        config_overrides: Config fields, e.g. ``num_labels=2``.

    Pretrained weights load in fp32 whatever dtype they were saved in (transformers would keep a bf16 or fp16
    checkpoint's dtype): the precision plugin or DeepSpeed casts what runs in 16 bits, and mixed precision keeps
    the weights the optimizer updates in fp32.
    """
    if is_shape(source):
        config = shape_config(source, vocab_size=vocab_size)
        for key, value in config_overrides.items():
            setattr(config, key, value)
        return auto_class.from_config(config)
    return auto_class.from_pretrained(resolve_pretrained(source), **{"dtype": torch.float32, **config_overrides})


def import_model_class(auto_class: Any, source: str) -> type[nn.Module] | None:
    """The class ``build_model(auto_class, source)`` builds, its modeling module imported now (``None`` for a
    model the auto class does not list, such as remote code).

    Some modeling modules script functions with ``torch.jit.script`` as they are imported (DeBERTa-v2 in
    transformers 5.17). Imported first inside DeepSpeed's ``zero.Init``, which swaps torch's tensor constructors
    for wrappers TorchScript cannot compile, the import fails; tasks call this in ``setup``, which Lightning runs
    before ``configure_model``.
    """
    config = shape_config(source) if is_shape(source) else AutoConfig.from_pretrained(resolve_pretrained(source))
    return auto_class_model_classes(auto_class).get(type(config), None)
