"""One skip marker for tests that need hardware or optional packages (in the manner of Lightning's RunIf)."""

from __future__ import annotations

import importlib.util

import pytest
import torch


def RunIf(min_cuda_gpus: int = 0, fairscale: bool = False, datasets: bool = False) -> pytest.MarkDecorator:
    """Skip unless the machine has ``min_cuda_gpus`` CUDA GPUs and the named optional packages."""
    reasons = []
    if min_cuda_gpus and torch.cuda.device_count() < min_cuda_gpus:
        reasons.append(f"needs {min_cuda_gpus} CUDA GPU(s)")
    for name, wanted in (("fairscale", fairscale), ("datasets", datasets)):
        if wanted and importlib.util.find_spec(name) is None:
            reasons.append(f"needs {name}")
    return pytest.mark.skipif(bool(reasons), reason="; ".join(reasons) or "runs here")
