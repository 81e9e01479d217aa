"""FairScale's configuration: our typed dataclass and its translation into OSS / DDP / ShardedDataParallel options.

Pure functions of their arguments, importable and unit-tested without FairScale installed.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from lightning_zero.errors import ZeroConfigError
from lightning_zero.strategies.config import ZeroConfig, reject_unsupported, require_stages

#: ShardedDataParallel's own default bucket size (elements) under automatic optimization.
DEFAULT_REDUCE_BUFFER_SIZE = 2**23


@dataclasses.dataclass(frozen=True)
class FairScaleZeroConfig(ZeroConfig):
    """ZeRO through FairScale: stage 1 is OSS + DDP, stage 2 is OSS + ShardedDataParallel.

    FairScale keeps everything on the accelerator and has no stage 3 that runs off CUDA (its FSDP), so
    ``stage: 3``, ``offload_optimizer`` and ``offload_parameters`` are refused: use an FSDP2 or DeepSpeed preset.

    Args:
        find_unused_parameters: Stage 1: let DDP tolerate parameters that get no gradient in a backward pass
            (needed, e.g., by a GAN trained with manual optimization). Stage 2's ShardedDataParallel always
            tolerates them, so the flag changes nothing there.
        reduce_buffer_size: Stage 2: elements of small gradients packed into one reduce call. ``None``:
            FairScale's default (``2**23``) under automatic optimization, and 0 (no buckets) under manual
            optimization, where several backward passes per step would re-send half-filled buckets.
            Stage 1 refuses a value.
        broadcast_fp16: Send updated parameter shards between ranks in fp16 (less traffic, slightly less exact;
            meant for mixed precision).
    """

    find_unused_parameters: bool = False
    reduce_buffer_size: int | None = None
    broadcast_fp16: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        require_stages(
            self, "FairScale", 1, 2, "use zero3_fsdp or a DeepSpeed preset for stage 3, plain `ddp` for stage 0."
        )
        reject_unsupported(self, "FairScale", offload_optimizer="none", offload_parameters="none")
        if self.reduce_buffer_size is not None and self.stage == 1:
            raise ZeroConfigError(
                "`reduce_buffer_size` sets ShardedDataParallel's buckets (stage 2); stage 1 reduces through DDP:"
                " remove it or set `stage: 2`."
            )
        if self.reduce_buffer_size is not None and self.reduce_buffer_size < 0:
            raise ZeroConfigError(f"`reduce_buffer_size` must be >= 0, got {self.reduce_buffer_size}.")


def ddp_options(config: FairScaleZeroConfig) -> dict[str, Any]:
    """Keyword arguments for ``DistributedDataParallel`` (stage 1)."""
    return {"find_unused_parameters": config.find_unused_parameters}


def oss_options(config: FairScaleZeroConfig) -> dict[str, Any]:
    """Keyword arguments for ``fairscale.optim.OSS`` besides the parameters and the optimizer class."""
    return {"broadcast_fp16": config.broadcast_fp16}


def sharded_ddp_options(config: FairScaleZeroConfig, manual_optimization: bool) -> dict[str, Any]:
    """Keyword arguments for ``fairscale.nn.ShardedDataParallel`` (stage 2).

    Raises when a bucket size is set for manual optimization: a bucket holding gradients of two optimizers'
    parameters would be sent by the first backward pass, half filled, and again by the second.
    """
    size = config.reduce_buffer_size
    if manual_optimization and size:
        raise ZeroConfigError(
            f"`reduce_buffer_size: {size}` cannot be used with manual optimization (several backward passes per"
            " step): remove it, and buckets are off."
        )
    if size is None:
        size = 0 if manual_optimization else DEFAULT_REDUCE_BUFFER_SIZE
    return {"reduce_buffer_size": size, "broadcast_buffers": True}


def optimizer_constructor_defaults(optimizer_class: type, defaults: dict[str, Any]) -> dict[str, Any]:
    """The entries of an optimizer's ``defaults`` that its constructor accepts.

    ``OSS`` re-creates the user's optimizer class on each rank's shard from these; some ``defaults`` entries
    (e.g. AdamW's ``decoupled_weight_decay``) are not constructor arguments.
    """
    parameters = inspect.signature(optimizer_class).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(defaults)
    return {key: value for key, value in defaults.items() if key in parameters}
