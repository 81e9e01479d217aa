"""The CUDA caching allocator setting ``zero_auto`` switches for its trials and its run, and gives back after."""

from __future__ import annotations

import torch
from lightning.pytorch.utilities import rank_zero_info

from lightning_zero.internals import set_cuda_allocator_settings


def use_expandable_segments(device: torch.device) -> bool:
    """Switch the CUDA caching allocator of this process to expandable segments; whether it was (only on CUDA).

    Without them, freed blocks stay split in fixed segments: GPT-2 XL's run at the micro-batch its trial fitted
    (21.1 GiB peak allocated of 24) ran out of memory in its second step, asking for 4.7 GiB while 4.9 GiB sat
    free in pieces.
    """
    if device.type != "cuda":
        return False
    set_cuda_allocator_settings("expandable_segments:True")
    rank_zero_info(
        "zero_auto: switched the CUDA allocator to expandable segments"
        " (set `expandable_segments: false` to leave it as it is)."
    )
    return True


def restore_fixed_segments() -> None:
    """Undo :func:`use_expandable_segments`: the setting is process-wide, and a later run must not inherit it."""
    set_cuda_allocator_settings("expandable_segments:False")
