"""The exact-Adam floor of an offload step: a CPU Adam over N fp32 parameters, nothing else.

Under optimizer offload every step ends with this update on the host (read parameters, gradients and both
moments, write three of them back), so no configuration that keeps exact Adam and offloads the optimizer can
step faster than the fastest of these at one optimizer step per batch. ``deepspeed`` is what DeepSpeed's offload
runs (ours swaps it in), ``fused`` what FSDP2's offload runs (torch's fused kernel, ours swaps it in), ``torch``
a plain ``torch.optim.AdamW`` (torch's default per-tensor loop, what a CPU step gets without either swap).
"""

from __future__ import annotations

import time
from typing import Any

import torch

#: Parameters per tensor: the update runs tensor by tensor, as over a model's parameters.
CHUNK = 50_000_000


OPTIMIZERS = ("deepspeed", "fused", "torch")


def _optimizer(kind: str, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if kind == "deepspeed":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(params, lr=1e-5)
    return torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0, fused=kind == "fused")


def cpu_adam_floor(parameters: int, steps: int = 3, warmup: int = 1, kind: str = "deepspeed") -> dict[str, Any]:
    """Seconds per CPU Adam step (``kind``: one of :data:`OPTIMIZERS`) over ``parameters`` fp32 elements (median
    of ``steps``)."""
    sizes = [CHUNK] * (parameters // CHUNK) + ([parameters % CHUNK] if parameters % CHUNK else [])
    params = [torch.nn.Parameter(torch.zeros(size)) for size in sizes]
    for param in params:
        param.grad = torch.randn(param.shape) * 1e-3
    optimizer = _optimizer(kind, params)
    times = []
    for step in range(warmup + steps):
        start = time.perf_counter()
        optimizer.step()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    times.sort()
    return {
        "optimizer": kind,
        "parameters": parameters,
        "threads": torch.get_num_threads(),
        "step_s": times[len(times) // 2],
        "steps_s": [round(t, 3) for t in times],
    }
