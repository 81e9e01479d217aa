"""PyTorch FSDP2's configuration: our typed dataclass and its translation into ``fully_shard`` options.

Pure functions of their arguments, unit-tested without a process group.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import torch

from lightning_zero.errors import ZeroConfigError
from lightning_zero.precision import mixed_dtype
from lightning_zero.strategies.config import ZeroConfig, require_stages

CheckpointFormat = Literal["sharded", "full"]
_CHECKPOINT_FORMATS = ("sharded", "full")


@dataclasses.dataclass(frozen=True)
class FSDP2ZeroConfig(ZeroConfig):
    """ZeRO through PyTorch FSDP2 (``fully_shard``): stage 2 keeps parameters gathered from forward to backward,
    stage 3 frees them after each block's forward.

    FSDP2 offloads parameters, gradients and the optimizer step to CPU together (``CPUOffloadPolicy``), so
    offload is ``offload_optimizer: cpu`` with ``offload_parameters: cpu`` (stage 3); either alone, and NVMe,
    are refused. ``compile_blocks`` runs without ``activation_checkpointing`` here: recomputing a compiled block
    under FSDP2 can take another compiled graph than its forward did, which torch refuses in the backward pass.

    Args:
        reduce_in_fp32: Under ``bf16-mixed``/``16-mixed``, reduce-scatter gradients in fp32 (more exact); off:
            in the compute dtype (half the traffic).
        checkpoint_format: ``"sharded"``: a directory written by ``torch.distributed.checkpoint``, one file per
            rank, loadable at another world size; ``"full"``: one file with the whole model and optimizer state,
            gathered on rank 0.
        pin_memory: Under CPU offload on GPUs, page-lock the CPU copies (faster transfers, more host memory
            held). CPU-only runs have nothing to pin and never pin.
        fused_adam_for_offload: Under CPU offload, run a plain ``torch.optim.Adam``/``AdamW`` from
            ``configure_optimizers`` with torch's fused kernel (``fused=True``, the same hyper-parameters): the
            step then runs on the CPU in one pass over each tensor instead of torch's default loop.
    """

    stage: int = 3
    reduce_in_fp32: bool = True
    checkpoint_format: CheckpointFormat = "sharded"
    pin_memory: bool = True
    fused_adam_for_offload: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        require_stages(self, "FSDP2", 2, 3, "use zero1 or zero1_fairscale for stage 1, plain `ddp` for stage 0.")
        for name in ("offload_optimizer", "offload_parameters"):
            if getattr(self, name) == "nvme":
                raise ZeroConfigError(
                    f"FSDP2 does not support `{name}: nvme`: set it to 'cpu' or use zero3_offload_nvme (DeepSpeed)."
                )
        if self.offload_optimizer != self.offload_parameters:
            raise ZeroConfigError(
                f"FSDP2 offloads parameters and the optimizer together, got `offload_optimizer:"
                f" {self.offload_optimizer}` with `offload_parameters: {self.offload_parameters}`: set both to 'cpu'"
                " (stage 3), or use zero2_offload (DeepSpeed) for optimizer-only offload."
            )
        if self.compile_blocks and self.activation_checkpointing:
            raise ZeroConfigError(
                "FSDP2 cannot recompute compiled blocks (torch may take another compiled graph in the recomputation"
                " than in the forward pass): set `compile_blocks` or `activation_checkpointing` to false, or use"
                " `zero2` (DeepSpeed), which runs both."
            )
        if self.checkpoint_format not in _CHECKPOINT_FORMATS:
            raise ZeroConfigError(
                f"`checkpoint_format` must be one of {_CHECKPOINT_FORMATS}, got {self.checkpoint_format!r}."
            )


def mixed_precision_dtypes(precision: str, reduce_in_fp32: bool) -> tuple[torch.dtype | None, torch.dtype | None]:
    """``(param_dtype, reduce_dtype)`` for FSDP2's ``MixedPrecisionPolicy`` under a Trainer precision.

    Mixed precision gathers parameters in the half dtype (the sharded fp32 copy stays the master) and reduces
    gradients in fp32 or that dtype. Other precisions (``32-true``, ``bf16-true``...) compute in the dtype the
    parameters are stored in: ``(None, None)``.
    """
    dtype = mixed_dtype(precision)
    if dtype is None:
        return None, None
    return dtype, torch.float32 if reduce_in_fp32 else dtype


def fully_shard_options(config: FSDP2ZeroConfig, precision: str, device_type: str, root: bool) -> dict[str, Any]:
    """Keyword arguments for ``fully_shard`` on a transformer block (``root=False``) or a top-level module.

    Stage 3 frees a block's gathered parameters after its forward; a top-level module's stay gathered, as
    FSDP2 does by default for its root, since backward needs them at once.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

    param_dtype, reduce_dtype = mixed_precision_dtypes(precision, config.reduce_in_fp32)
    offload: OffloadPolicy = (
        CPUOffloadPolicy(pin_memory=config.pin_memory and device_type == "cuda")
        if config.offload_parameters == "cpu"
        else OffloadPolicy()
    )
    return {
        "reshard_after_forward": config.stage == 3 and not root,
        "mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype),
        "offload_policy": offload,
    }
