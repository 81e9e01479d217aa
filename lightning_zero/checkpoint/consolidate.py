"""One full state dict from any lightning-zero checkpoint, written as safetensors, a torch file, or a Hugging Face
folder.

    lightning-zero consolidate runs/last.ckpt model.safetensors
    lightning-zero consolidate runs/last.ckpt model.pt --dtype bf16 --hf-dir export/

Sources: DeepSpeed directories (any stage and world size, through DeepSpeed's own ``zero_to_fp32`` helpers, which
read each rank's fp32 partitions), FSDP2 sharded directories (``torch.distributed.checkpoint`` metadata, then only
the model's tensors are read, without a process group), and single files (DDP, FairScale, FSDP2 ``full``).

``OUT.pt`` is a plain ``{name: tensor}`` mapping (``torch.load(OUT, weights_only=True)``), with the
LightningModule's parameter names (``model.transformer.wte.weight``...). ``OUT.safetensors`` holds the same (tied
weights stored once each under every name). ``--hf-dir`` writes ``save_pretrained`` output (config with a
classifier's class names, safetensors, the generation config of models that generate, the tokenizer's files when
the module had a tokenizer) that ``AutoModel...from_pretrained(DIR)`` and ``transformers.pipeline`` load without
lightning-zero. Floating-point tensors are cast to ``--dtype`` (fp32 by default); integer buffers keep theirs.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from lightning_zero.checkpoint.atomic import partial_path, publish, remove_path
from lightning_zero.checkpoint.hf import HF_KEY, write_hf_dir
from lightning_zero.checkpoint.validate import DCP_METADATA, DEEPSPEED_TAG_FILE, check_checkpoint
from lightning_zero.errors import CommandParser, ZeroConfigError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SUFFIXES = (".safetensors", ".pt")
_LIGHTNING_META = "meta.pt"  # the rest of a Lightning FSDP2 sharded checkpoint, next to the DCP files
#: What DeepSpeed itself stores in ``*model_states.pt`` next to Lightning's entries: weights and optimizer state.
_DEEPSPEED_OWN_STATE = ("module", "optimizer", "lr_scheduler")


def consolidate(
    checkpoint: str | Path, out: str | Path | None = None, dtype: str = "fp32", hf_dir: str | Path | None = None
) -> dict[str, torch.Tensor]:
    """The full state dict of ``checkpoint`` in ``dtype``; also written to ``out`` and/or ``hf_dir`` when given."""
    if dtype not in DTYPES:
        raise ZeroConfigError(f"Unknown dtype {dtype!r}: use one of {list(DTYPES)}.")
    if out is not None and Path(out).suffix not in SUFFIXES:
        raise ZeroConfigError(f"Output '{out}' must end in .safetensors or .pt (the format is taken from it).")
    check_checkpoint(checkpoint)
    state, extras = read_full_state(Path(checkpoint), DTYPES[dtype])
    if out is not None:
        write_state(state, Path(out))
    if hf_dir is not None:
        record = extras.get(HF_KEY)
        if record is None:
            raise ZeroConfigError(
                f"Checkpoint '{checkpoint}' holds no Hugging Face model record (its module has no transformers"
                " model as a direct child, or it was not saved by a lightning-zero strategy): use OUT instead."
            )
        write_hf_dir(record, state, Path(hf_dir), DTYPES[dtype])
    return state


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


def build_parser() -> argparse.ArgumentParser:
    """The ``consolidate`` command's options."""
    parser = CommandParser(
        prog="lightning-zero consolidate",
        description="One full state dict from any lightning-zero checkpoint (safetensors, torch, Hugging Face).",
    )
    parser.add_argument("checkpoint", help="a checkpoint file or directory that a Trainer saved")
    parser.add_argument("out", nargs="?", help="OUT.safetensors or OUT.pt")
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp32")
    parser.add_argument("--hf-dir", help="also write a Hugging Face save_pretrained folder here")
    return parser


def main(argv: Sequence[str]) -> int:
    """``lightning-zero consolidate CKPT OUT [--dtype fp32|bf16|fp16] [--hf-dir DIR]``."""
    parser = build_parser()
    args = parser.parse_args(list(argv))
    if args.out is None and args.hf_dir is None:
        parser.error("give OUT, --hf-dir, or both")
    state = consolidate(args.checkpoint, args.out, args.dtype, args.hf_dir)
    count = sum(tensor.numel() for tensor in state.values())
    print(
        f"{len(state)} tensors, {count:,} elements ({args.dtype}) -> {', '.join(filter(None, [args.out, args.hf_dir]))}"
    )
    return 0
