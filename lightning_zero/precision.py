"""The 16-bit dtype behind a Trainer precision string."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

_HALF_DTYPES = {"16": torch.float16, "bf16": torch.bfloat16}


def half_dtype(precision: object) -> torch.dtype | None:
    """The 16-bit dtype of a Trainer precision (``"16-mixed"``, ``"bf16-true"``, ...); None for 32 and 64 bits."""
    return _HALF_DTYPES.get(str(precision).split("-")[0])


def mixed_dtype(precision: object) -> torch.dtype | None:
    """The autocast dtype of a mixed precision (``"16-mixed"``, ``"bf16-mixed"``); None for any other."""
    return half_dtype(precision) if str(precision).endswith("-mixed") else None


def autocast(device: torch.device, precision: object) -> contextlib.AbstractContextManager[Any]:
    """The autocast a Trainer precision runs its forward under on ``device`` (none unless mixed)."""
    dtype = mixed_dtype(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
