"""One skip marker for every test that needs hardware or optional pieces (in the manner of Lightning's RunIf)."""

from __future__ import annotations

import importlib.util

import pytest
import torch


def _libaio_builds() -> bool:
    """Whether DeepSpeed's async I/O op (NVMe offload) can be built: it needs libaio (Debian: libaio-dev)."""
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("AsyncIOBuilder")
    return builder is not None and bool(builder.is_compatible(verbose=False))


def RunIf(
    min_cuda_gpus: int = 0, fairscale: bool = False, datasets: bool = False, libaio: bool = False
) -> pytest.MarkDecorator:
    """Skip unless the machine has ``min_cuda_gpus`` CUDA GPUs, the named optional packages, and libaio."""
    reasons = []
    if min_cuda_gpus and torch.cuda.device_count() < min_cuda_gpus:
        reasons.append(f"needs {min_cuda_gpus} CUDA GPU(s)")
    for name, wanted in (("fairscale", fairscale), ("datasets", datasets)):
        if wanted and importlib.util.find_spec(name) is None:
            reasons.append(f"needs {name}")
    if libaio and not _libaio_builds():
        reasons.append("needs libaio (libaio-dev) for DeepSpeed's async I/O op")
    return pytest.mark.skipif(bool(reasons), reason="; ".join(reasons) or "runs here")
