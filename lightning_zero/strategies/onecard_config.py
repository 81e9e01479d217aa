"""The typed config of the one-card levers (:class:`~lightning_zero.strategies.onecard.OneCardStrategy`): no
sharding, the memory won back on one accelerator by the optimizer and the activations instead."""

from __future__ import annotations

import dataclasses
from typing import Literal

from lightning_zero.errors import ZeroConfigError
from lightning_zero.strategies.config import ZeroConfig

LowMemoryOptimizer = Literal["none", "adamw8bit", "adamw4bit", "adamw_bf16", "paged_adamw8bit"]
LOW_MEMORY_OPTIMIZERS = ("none", "adamw8bit", "adamw4bit", "adamw_bf16", "paged_adamw8bit")


@dataclasses.dataclass(frozen=True)
class OneCardConfig(ZeroConfig):
    """One accelerator, no ZeRO sharding (``stage: 0``); the inherited fields keep their meaning, and
    ``offload_optimizer: cpu`` is torchao's ``CPUOffloadOptimizer`` (exact AdamW on the host, each gradient copied
    out as soon as it is complete, the copies and the host step overlapped with backward).

    Args:
        optimizer_in_backward: Step each parameter as soon as its gradient is complete (a
            ``register_post_accumulate_grad_hook`` per parameter), then free that gradient: the full set of
            gradients never exists. Exact (the same optimizer, one parameter at a time); gradient clipping and
            accumulation are refused (both need every gradient at once); schedulers step as usual.
        low_memory_optimizer: Replace the module's ``torch.optim.AdamW`` by one with smaller states on the
            accelerator: torchao's ``adamw8bit``, ``adamw4bit`` or ``adamw_bf16`` (states in the parameters' dtype,
            bf16 stochastic rounding; needs ``bf16-true``), or bitsandbytes' ``paged_adamw8bit``. Approximate.
        activation_offload: Keep the tensors saved for backward in (pinned) host memory during the forward
            (``torch.autograd.graph.save_on_cpu``), so a larger micro-batch fits.
        approximate: Allow the levers that do not reproduce exact AdamW (``low_memory_optimizer``).
        expandable_segments: On CUDA, switch the caching allocator to expandable segments for the run (what
            ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` does) and give the user's setting back after: near
            the budget, fixed segments leave gigabytes free in pieces that no allocation can use.
    """

    stage: int = 0
    optimizer_in_backward: bool = False
    low_memory_optimizer: LowMemoryOptimizer = "none"
    activation_offload: bool = False
    approximate: bool = False
    expandable_segments: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.stage != 0:
            raise ZeroConfigError(
                f"The one-card strategy shards nothing, got stage {self.stage}: set `stage: 0` or use a ZeRO preset."
            )
        if self.offload_optimizer == "nvme":
            raise ZeroConfigError(
                "The one-card strategy offloads the optimizer to `cpu` only: use `zero3_offload_nvme`."
            )
        if self.low_memory_optimizer not in LOW_MEMORY_OPTIMIZERS:
            raise ZeroConfigError(
                f"`low_memory_optimizer` must be one of {LOW_MEMORY_OPTIMIZERS}, got {self.low_memory_optimizer!r}."
            )
        if self.low_memory_optimizer != "none" and not self.approximate:
            raise ZeroConfigError(
                f"`low_memory_optimizer: {self.low_memory_optimizer}` is not exact AdamW: set `approximate: true`"
                " to accept it, or `low_memory_optimizer: none`."
            )
        if self.low_memory_optimizer != "none" and self.offload_optimizer == "cpu":
            raise ZeroConfigError(
                "`low_memory_optimizer` keeps the optimizer on the accelerator and `offload_optimizer: cpu` moves it"
                " to the host: choose one."
            )
        if self.optimizer_in_backward and self.offload_optimizer == "cpu":
            raise ZeroConfigError(
                "`offload_optimizer: cpu` (torchao's CPUOffloadOptimizer) already moves each gradient out as it is"
                " complete: set `optimizer_in_backward: false`."
            )
