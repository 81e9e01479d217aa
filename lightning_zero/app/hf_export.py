"""A Hugging Face ``save_pretrained`` folder from a consolidated state and the record a checkpoint holds
(:mod:`lightning_zero.checkpoint.hf`): what ``lightning-zero consolidate --hf-dir`` writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from lightning_zero.packages import TRANSFORMERS, app_extra_error


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
