"""The full state dict of any lightning-zero checkpoint, read without a process group: DeepSpeed directories (any
stage and world size, through DeepSpeed's own ``zero_to_fp32`` helpers, which read each rank's fp32 partitions),
FSDP2 sharded directories (``torch.distributed.checkpoint`` metadata, then only the model's tensors) and single files
(DDP, FairScale, FSDP2 ``full``). Resuming weights-only and ``lightning-zero consolidate`` read checkpoints here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lightning_zero.checkpoint.atomic import partial_path, publish, remove_path
from lightning_zero.checkpoint.validate import DCP_METADATA, DEEPSPEED_TAG_FILE

_LIGHTNING_META = "meta.pt"  # the rest of a Lightning FSDP2 sharded checkpoint, next to the DCP files
#: What DeepSpeed itself stores in ``*model_states.pt`` next to Lightning's entries: weights and optimizer state.
_DEEPSPEED_OWN_STATE = ("module", "optimizer", "lr_scheduler")


def read_full_state(path: Path, dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``(state dict, the checkpoint's other top-level entries)`` of any checkpoint kind: Lightning's loop state,
    callbacks, LR schedulers, hyper-parameters... (the optimizer state only in a single file; nothing is read into
    memory that is not needed: files are memory-mapped)."""
    if path.is_dir() and (path / DEEPSPEED_TAG_FILE).is_file():
        return _deepspeed_state(path, dtype), _deepspeed_extras(path)
    if path.is_dir() and (path / DCP_METADATA).is_file():
        return _dcp_state(path, dtype), dcp_extras(path)
    content = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    state = {name: _cast(tensor, dtype) for name, tensor in content.pop("state_dict").items()}
    return state, content


def _cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return tensor.to(dtype) if tensor.is_floating_point() else tensor


def _deepspeed_state(path: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint, to_torch_tensor

    # Lazy: each tensor is gathered from the ranks' (memory-mapped) partitions only when converted.
    lazy = get_fp32_state_dict_from_zero_checkpoint(str(path), lazy_mode=True)
    return dict(to_torch_tensor(lazy, dtype=dtype))


def _deepspeed_extras(path: Path) -> dict[str, Any]:
    tag = (path / DEEPSPEED_TAG_FILE).read_text().strip()
    files = sorted((path / tag).glob("*model_states.pt"))
    # DeepSpeed's own format pickles Python objects (its config, enums): it cannot be read with weights_only.
    content = torch.load(files[0], map_location="cpu", weights_only=False, mmap=True)
    return {key: value for key, value in content.items() if key not in _DEEPSPEED_OWN_STATE}


def _dcp_state(path: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = dcp.FileSystemReader(str(path))
    entries = reader.read_metadata().state_dict_metadata
    prefix = "state_dict."
    state = {
        key.removeprefix(prefix): torch.empty(entry.size, dtype=entry.properties.dtype)
        for key, entry in entries.items()
        if key.startswith(prefix) and isinstance(entry, TensorStorageMetadata)
    }
    dcp.load({"state_dict": state}, storage_reader=reader, no_dist=True)
    return {name: _cast(tensor, dtype) for name, tensor in state.items()}


def dcp_extras(path: Path) -> dict[str, Any]:
    """What Lightning saved next to the tensors of a sharded FSDP2 checkpoint: loops, callbacks, schedulers..."""
    meta = path / _LIGHTNING_META
    content: dict[str, Any] = torch.load(meta, map_location="cpu", weights_only=True) if meta.is_file() else {}
    return content


def write_state(state: dict[str, torch.Tensor], out: Path) -> None:
    """Write ``state`` to ``out`` (format from its suffix), through a temporary name."""
    temporary = partial_path(out)
    remove_path(temporary)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(_unshared(state), str(temporary), metadata={"format": "pt"})
    else:
        torch.save(state, temporary)
    publish(temporary, out)


def _unshared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors that share memory (tied weights): later names get their own copy."""
    seen: set[int] = set()
    result = {}
    for name, tensor in state.items():
        pointer = tensor.untyped_storage().data_ptr()
        result[name] = tensor.clone() if pointer in seen else tensor.contiguous()
        seen.add(pointer)
    return result
