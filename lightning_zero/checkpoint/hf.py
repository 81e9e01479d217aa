"""What a checkpoint needs for a Hugging Face ``save_pretrained`` folder: the model's config (with the class names
a classifier was given, ``id2label``), its generation config (models that generate), its class, the attribute it
sits under in the LightningModule, and the tokenizer's files where the module has a tokenizer.

Recorded at save time under :data:`HF_KEY` (a few kB plus the tokenizer files); written out by
``consolidate --hf-dir`` (:mod:`lightning_zero.app.hf_export`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from torch import nn

HF_KEY = "lightning_zero_hf"


def hf_record(module: nn.Module) -> dict[str, Any] | None:
    """Config, generation config, class and attribute of the first Hugging Face model held by ``module``, with the
    files of ``module.tokenizer``."""
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    found = next(((n, m) for n, m in module.named_children() if isinstance(m, PreTrainedModel)), None)
    if found is None:
        return None
    attribute, model = found
    record: dict[str, Any] = {
        "attribute": attribute,
        "class": _transformers_class(model).__name__,
        "config": model.config.to_json_string(use_diff=False),
    }
    if model.can_generate() and model.generation_config is not None:
        # Its own file: what `generate` reads (beam settings, start/end ids of a pretrained model) is not all in
        # the model config that the export is rebuilt from.
        record["generation_config"] = model.generation_config.to_json_string(use_diff=False)
    tokenizer = getattr(module, "tokenizer", None)
    if isinstance(tokenizer, PreTrainedTokenizerBase):
        record["tokenizer"] = _files_of(tokenizer)
    return record


def _transformers_class(model: nn.Module) -> type:
    """The model's own transformers class (FSDP2 puts a generated ``FSDP<Name>`` subclass in front of it)."""
    return next(cls for cls in type(model).__mro__ if cls.__module__.startswith("transformers."))


def _files_of(tokenizer: Any) -> dict[str, bytes]:
    with tempfile.TemporaryDirectory() as directory:
        tokenizer.save_pretrained(directory)
        return {path.name: path.read_bytes() for path in Path(directory).iterdir() if path.is_file()}
