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

import torch

from lightning_zero.app.hf_export import write_hf_dir
from lightning_zero.checkpoint.full_state import read_full_state, write_state
from lightning_zero.checkpoint.hf import HF_KEY
from lightning_zero.checkpoint.validate import check_checkpoint
from lightning_zero.errors import CommandParser, ZeroConfigError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SUFFIXES = (".safetensors", ".pt")


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
