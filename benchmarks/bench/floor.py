"""The exact-Adam floor of an offload step: DeepSpeed's CPU Adam over N fp32 parameters, nothing else.

Under optimizer offload every step ends with this update on the host (read parameters, gradients and both
moments, write three of them back), so no configuration that keeps exact Adam and offloads the optimizer can
step faster than this at one optimizer step per batch.
"""

from __future__ import annotations

import time
from typing import Any

import torch

#: Parameters per tensor: the update runs tensor by tensor, as over a model's parameters.
CHUNK = 50_000_000


def cpu_adam_floor(parameters: int, steps: int = 3, warmup: int = 1) -> dict[str, Any]:
    """Seconds per DeepSpeedCPUAdam step over ``parameters`` fp32 elements (median of ``steps``)."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    sizes = [CHUNK] * (parameters // CHUNK) + ([parameters % CHUNK] if parameters % CHUNK else [])
    params = [torch.nn.Parameter(torch.zeros(size)) for size in sizes]
    for param in params:
        param.grad = torch.randn(param.shape) * 1e-3
    optimizer = DeepSpeedCPUAdam(params, lr=1e-5)
    times = []
    for step in range(warmup + steps):
        start = time.perf_counter()
        optimizer.step()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    times.sort()
    return {
        "parameters": parameters,
        "threads": torch.get_num_threads(),
        "step_s": times[len(times) // 2],
        "steps_s": [round(t, 3) for t in times],
    }
