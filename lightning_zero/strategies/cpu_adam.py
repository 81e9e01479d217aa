"""Swap a module's plain torch Adam/AdamW for a CPU-fast one when the optimizer step is offloaded.

A torch Adam stepping on CPU with its default per-tensor loop is several times slower than a fused one (one
pass over each tensor). Under DeepSpeed the swap is to DeepSpeed's CPU Adam (DeepSpeed refuses a client
optimizer under offload unless told otherwise); under FSDP2 to torch's own fused kernel, which steps FSDP2's
sharded parameters. The user's model code keeps returning ``torch.optim.AdamW``; the strategy makes the swap,
with the same hyper-parameters.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.optim import Optimizer

from lightning_zero.internals import track_steps_for_scheduler
from lightning_zero.runtime.ops import wait_for_op
from lightning_zero.strategies.deepspeed_config import DeepSpeedZeroConfig

# torch-only switches that have no meaning for DeepSpeed's CPU Adam.
_TORCH_ONLY_GROUP_KEYS = (
    "foreach",
    "maximize",
    "capturable",
    "differentiable",
    "fused",
    "amsgrad",
    "decoupled_weight_decay",
)


def is_swappable(optimizer: Optimizer) -> bool:
    """Plain torch Adam/AdamW without amsgrad (DeepSpeed's CPU Adam does not implement it)."""
    return type(optimizer) in (torch.optim.Adam, torch.optim.AdamW) and not optimizer.defaults.get("amsgrad")


def _decouples_weight_decay(optimizer: Optimizer) -> bool:
    return isinstance(optimizer, torch.optim.AdamW) or bool(optimizer.defaults.get("decoupled_weight_decay"))


def to_cpu_adam(
    optimizer: Optimizer, bf16_states: bool = False, zenflow: bool = False, overlap_step: bool = False
) -> Optimizer:
    """A ``DeepSpeedCPUAdam`` over the same parameter groups and hyper-parameters as ``optimizer``.

    Args:
        optimizer: A plain torch Adam/AdamW (see :func:`is_swappable`).
        bf16_states: Keep the Adam moments in the parameters' dtype (bf16) instead of fp32, as DeepSpeed's
            ``bf16_optimizer_states`` requires.
        zenflow: Build DeepSpeed's ``ZenFlowCPUAdam``, the CPU Adam its ZenFlow optimizer steps.
        overlap_step: ZenFlow's ``overlap_step`` (the CPU step in a separate process).
    """
    from deepspeed.ops.adam import DeepSpeedCPUAdam, ZenFlowCPUAdam

    wait_for_op("CPUAdamBuilder")
    groups = [
        {key: value for key, value in group.items() if key not in _TORCH_ONLY_GROUP_KEYS}
        for group in optimizer.param_groups
    ]
    defaults = optimizer.defaults
    adamw_mode = _decouples_weight_decay(optimizer)
    kind, extra = (ZenFlowCPUAdam, {"overlap_step": overlap_step}) if zenflow else (DeepSpeedCPUAdam, {})
    cpu_adam = kind(
        groups,
        lr=defaults["lr"],
        betas=defaults["betas"],
        eps=defaults["eps"],
        weight_decay=defaults["weight_decay"],
        adamw_mode=adamw_mode,
        fp32_optimizer_states=not bf16_states,
        **extra,
    )
    rank_zero_info(
        f"Optimizer offload: running `{type(optimizer).__name__}` as {kind.__name__}(adamw_mode={adamw_mode},"
        f" fp32_optimizer_states={not bf16_states}) with"
        f" lr={defaults['lr']}, betas={tuple(defaults['betas'])}, eps={defaults['eps']},"
        f" weight_decay={defaults['weight_decay']}."
    )
    return cpu_adam


def for_deepspeed(optimizer: Optimizer, scheduler: Any, zero: DeepSpeedZeroConfig) -> Optimizer:
    """``optimizer`` as a DeepSpeed engine of ``zero`` should step it, ``scheduler`` (if any) rebound to it.

    Under optimizer offload with ``zero.cpu_adam_for_offload``, a plain torch Adam/AdamW becomes DeepSpeed's CPU
    Adam (bf16 moments, or ZenFlow's, as ``zero`` asks); anything else is returned as it is.
    """
    if not (zero.offload_optimizer != "none" and zero.cpu_adam_for_offload and is_swappable(optimizer)):
        return optimizer
    swapped = to_cpu_adam(optimizer, zero.bf16_optimizer_states, zero.zenflow, zero.zenflow_overlap_step)
    if scheduler is not None:
        rebind_scheduler(scheduler, swapped)
    return swapped


def to_fused_adam(optimizer: Optimizer) -> Optimizer:
    """The same torch Adam/AdamW over the same parameter groups and hyper-parameters, with ``fused=True``."""
    kind = torch.optim.AdamW if _decouples_weight_decay(optimizer) else torch.optim.Adam
    groups = [_without_loop_choice(group) for group in optimizer.param_groups]
    fused = kind(groups, **_without_loop_choice(optimizer.defaults), fused=True)
    rank_zero_info(f"Optimizer offload: running `{type(optimizer).__name__}` with torch's fused kernel (fused=True).")
    return fused


def _without_loop_choice(options: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in options.items() if key not in ("foreach", "fused", "decoupled_weight_decay")}


def rebind_scheduler(scheduler: Any, optimizer: Optimizer) -> None:
    """Point an LR scheduler built for another optimizer at ``optimizer``.

    Does what ``LRScheduler.__init__`` does to its optimizer: wrap ``step`` so the scheduler can tell that
    the optimizer stepped before it.
    """
    scheduler.optimizer = optimizer
    track_steps_for_scheduler(optimizer)
