"""What a checkpoint needs for a Hugging Face ``save_pretrained`` folder: the model's config (with the class names
a classifier was given, ``id2label``), its generation config (models that generate), its class, the attribute it
sits under in the LightningModule, and the tokenizer's files where the module has a tokenizer.

Recorded at save time under :data:`HF_KEY` (a few kB plus the tokenizer files); used by ``consolidate --hf-dir``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lightning_zero.packages import TRANSFORMERS, app_extra_error

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


def write_hf_dir(record: dict[str, Any], state: dict[str, torch.Tensor], directory: Path, dtype: torch.dtype) -> None:
    """``save_pretrained`` of the recorded model class with ``state`` (the LightningModule's names), safetensors."""
    if not TRANSFORMERS:
        raise app_extra_error("transformers", "`consolidate --hf-dir`")
    import transformers

    settings = json.loads(record["config"])
    config = transformers.AutoConfig.for_model(settings.pop("model_type"), **settings)
    config.architectures = [record["class"]]
    model_class = getattr(transformers, record["class"])
    prefix = f"{record['attribute']}."
    weights = {name.removeprefix(prefix): tensor for name, tensor in state.items() if name.startswith(prefix)}
    with torch.device("meta"):
        model = model_class(config)
    model.load_state_dict(weights, strict=False, assign=True)
    model.tie_weights()
    missing = [name for name, parameter in model.named_parameters() if parameter.is_meta]
    if missing:
        raise ValueError(f"the checkpoint has no weights for {missing[:3]}")
    if "generation_config" in record:
        model.generation_config = transformers.GenerationConfig.from_dict(json.loads(record["generation_config"]))
    model.to(dtype)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    for name, content in record.get("tokenizer", {}).items():
        (directory / name).write_bytes(content)
