"""ZeRO-1/2 through FairScale, on CPU (gloo) and CUDA GPUs (nccl).

Lightning 2.x dropped its FairScale strategies; this one builds on ``DDPStrategy``:

* every optimizer from ``configure_optimizers`` becomes a ``fairscale.optim.OSS`` over the same parameter groups
  (optimizer state sharded: ZeRO-1), with LR schedulers re-pointed at it;
* stage 1 wraps the module in DDP, stage 2 in ``ShardedDataParallel`` (gradients reduced to their owner: ZeRO-2);
* checkpoints are one file: each OSS consolidates its state on rank 0 before saving, and loads at any world size;
* gradient clipping by norm goes through ``OSS.clip_grad_norm`` (each rank holds only its shard's gradients);
* fp16 AMP on GPUs uses FairScale's ``ShardedGradScaler``.

FairScale is optional: this module imports it only when a strategy is built, and a missing install is one error.
"""

from __future__ import annotations

import importlib
from collections.abc import Generator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor, nn
from torch.optim import Optimizer

from lightning_zero.checkpoint.by_name import PARAMETER_NAMES_KEY, parameter_names
from lightning_zero.checkpoint.strategy import SafeCheckpoints
from lightning_zero.errors import ZeroConfigError
from lightning_zero.internals import (
    layer_sync,
    sharded_bucket_parameter_ids,
    unwrap_lightning_optimizer,
    wait_for_sharded_reductions,
)
from lightning_zero.runtime.devices import broadcast_module_states, optimizers_to_device
from lightning_zero.runtime.watchdog import WatchedRanks
from lightning_zero.strategies.cpu_adam import rebind_scheduler
from lightning_zero.strategies.fairscale_config import (
    FairScaleZeroConfig,
    ddp_options,
    optimizer_constructor_defaults,
    oss_options,
    sharded_ddp_options,
)
from lightning_zero.strategies.shared import ShardedSetup

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from fairscale.optim import OSS

FAIRSCALE_MISSING = "FairScale is not installed: pip install 'lightning-zero[fairscale]', or pick an FSDP2 preset."


def require_fairscale() -> None:
    """Raise one clear error when FairScale cannot be imported."""
    try:
        importlib.import_module("fairscale")
    except ImportError:
        raise ZeroConfigError(FAIRSCALE_MISSING) from None


class FairScaleStrategy(ShardedSetup, WatchedRanks, SafeCheckpoints, DDPStrategy):
    """ZeRO stage 1 (OSS + DDP) or 2 (OSS + ShardedDataParallel) through FairScale.

    Args:
        zero: The ZeRO settings (a :class:`FairScaleZeroConfig` or a mapping of its fields).
        accelerator: Set by the Trainer.
        parallel_devices: Set by the Trainer.
        cluster_environment: Set by the Trainer.
        precision_plugin: Set by the Trainer.
        process_group_backend: ``"nccl"`` on GPUs and ``"gloo"`` on CPU unless given.
        timeout: Collective-operation timeout.
    """

    #: The registered name that builds this class with its defaults (stage 2).
    strategy_name = "zero2_fairscale"
    zero_backend = "fairscale"
    zero: FairScaleZeroConfig

    # LightningCLI reads this signature: the parameters it shares with the other strategies stay spelled out.
    def __init__(
        self,
        zero: FairScaleZeroConfig | None = None,
        accelerator: Any = None,
        parallel_devices: list | None = None,
        cluster_environment: Any = None,
        precision_plugin: Any = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
    ) -> None:
        self.zero = FairScaleZeroConfig.coerce(zero)
        require_fairscale()
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            precision_plugin=precision_plugin,
            process_group_backend=process_group_backend,
            timeout=timeout,
            **(ddp_options(self.zero) if self.zero.stage == 1 else {}),
        )

    @property
    def sharded_ddp(self) -> Any:
        """The ``ShardedDataParallel`` wrapper (stage 2, while fitting), else ``None``."""
        from fairscale.nn.data_parallel import ShardedDataParallel

        return self.model if isinstance(self.model, ShardedDataParallel) else None

    def setup(self, trainer: pl.Trainer) -> None:
        """DDPStrategy's set-up, but the optimizers are sharded before the model is wrapped (SDP needs them)."""
        assert self.accelerator is not None and self.model is not None
        self.apply_memory_budget()
        self.accelerator.setup(trainer)
        fitting = trainer.state.fn == TrainerFn.FITTING
        sync = layer_sync(self)
        if fitting and sync:
            self.model = sync.apply(self.model)
        self.prepare_blocks()
        self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        if fitting:
            self.setup_optimizers(trainer)
            self._wrap_model()
        else:
            broadcast_module_states(self.model)
        self.setup_precision_plugin()
        self._adapt_precision_plugin()
        if fitting:
            optimizers_to_device(self.optimizers, self.root_device)

    def setup_optimizers(self, trainer: pl.Trainer) -> None:
        """The module's optimizers, each re-created as an OSS over the same groups; schedulers follow them."""
        super().setup_optimizers(trainer)
        sharded = [to_oss(optimizer, self.zero) for optimizer in self.optimizers]
        for config in self.lr_scheduler_configs:
            for old, new in zip(self.optimizers, sharded, strict=True):
                if config.scheduler.optimizer is old:
                    rebind_scheduler(config.scheduler, new)
        self.optimizers = sharded

    def _wrap_model(self) -> None:
        if self.zero.stage == 1:
            self.configure_ddp()
            return
        from fairscale.nn.data_parallel import ShardedDataParallel

        assert self.lightning_module is not None
        options = sharded_ddp_options(self.zero, manual_optimization=not self.lightning_module.automatic_optimization)
        self.model = ShardedDataParallel(self.model, sharded_optimizer=list(self.optimizers), **options)
        for optimizer in self.optimizers:
            optimizer.zero_grad = zero_grad_through(self.model, optimizer)  # type: ignore[method-assign]

    def _adapt_precision_plugin(self) -> None:
        plugin = self.precision_plugin
        plugin.clip_grad_by_norm = _clip_grad_by_norm  # type: ignore[method-assign]
        if isinstance(plugin, MixedPrecision) and plugin.scaler is not None:
            from fairscale.optim.grad_scaler import ShardedGradScaler

            plugin.scaler = ShardedGradScaler()

    @contextmanager
    def block_backward_sync(self) -> Generator[None, None, None]:
        """Skip gradient reduction while accumulating (``no_sync`` of DDP or ShardedDataParallel)."""
        wrapper = self.sharded_ddp
        if wrapper is None:
            with super().block_backward_sync():
                yield
            return
        with wrapper.no_sync():
            yield

    def post_backward(self, closure_loss: Tensor) -> None:
        """Under manual optimization, wait for every gradient reduction of this backward pass before a step."""
        super().post_backward(closure_loss)
        wrapper = self.sharded_ddp
        module = self.lightning_module
        if wrapper is not None and module is not None and not module.automatic_optimization:
            # ShardedDataParallel waits only at the end of the first backward pass after a forward.
            wait_for_sharded_reductions(wrapper)

    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """The whole optimizer state on rank 0 (gathered from every rank's shard), ``{}`` elsewhere; collective."""
        from fairscale.optim import OSS

        inner = unwrap_lightning_optimizer(optimizer)
        if not isinstance(inner, OSS):
            return super().optimizer_state(optimizer)
        inner.consolidate_state_dict(recipient_rank=0)
        return inner.state_dict() if self.is_global_zero else {}

    def full_state_dict(self) -> dict[str, Any]:
        """The whole model's state dict (every rank holds all parameters under ZeRO-1/2)."""
        assert self.lightning_module is not None
        return self.lightning_module.state_dict()

    def teardown(self) -> None:
        if self.sharded_ddp is not None:
            self.model = self.lightning_module
        super().teardown()

    def load_consolidated_weights(self, module: nn.Module, state_dict: dict[str, Any]) -> None:
        """Nothing before Lightning's ``load_model_state_dict``, which loads them: every rank holds all parameters."""

    def add_checkpoint_entries(self, checkpoint: dict[str, Any]) -> None:
        """Its optimizer state is keyed by position: the parameter names make it readable by other backends."""
        assert self.lightning_module is not None, "a set-up strategy saves"
        checkpoint[PARAMETER_NAMES_KEY] = parameter_names(self.lightning_module, self.optimizers[0])


def to_oss(optimizer: Optimizer, config: FairScaleZeroConfig) -> OSS:
    """An OSS that runs ``optimizer``'s class on this rank's shard of its parameter groups."""
    from fairscale.optim import OSS

    if isinstance(optimizer, OSS):
        return optimizer
    if optimizer.state:
        raise ZeroConfigError(
            f"{type(optimizer).__name__} already holds state before training: FairScale presets shard fresh"
            " optimizers; return a new optimizer from `configure_optimizers`."
        )
    optimizer_class = type(optimizer)
    groups = [dict(group) for group in optimizer.param_groups]
    defaults = optimizer_constructor_defaults(optimizer_class, optimizer.defaults)
    return OSS(groups, optim=optimizer_class, **oss_options(config), **defaults)


def zero_grad_through(wrapper: Any, optimizer: OSS) -> Any:
    """``optimizer.zero_grad`` that keeps ShardedDataParallel's gradient buckets intact and clears them.

    ``Optimizer.zero_grad`` would set the gradients that are views into SDP's buckets to ``None``, so later
    gradients miss the buckets, and what other ranks reduced into them piles up across steps: training
    silently diverges. Bucketed gradients are zeroed in place instead; the others follow ``set_to_none``.
    """

    def zero_grad(set_to_none: bool = True) -> None:
        bucketed = sharded_bucket_parameter_ids(wrapper)
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                if parameter.grad is None:
                    continue
                if set_to_none and id(parameter) not in bucketed:
                    parameter.grad = None
                else:
                    parameter.grad.zero_()

    return zero_grad


def _clip_grad_by_norm(optimizer: Optimizer, clip_val: float) -> None:
    """Clip by the norm over all ranks' gradient shards (a local ``clip_grad_norm_`` would see only some)."""
    inner = unwrap_lightning_optimizer(optimizer)
    clip = getattr(inner, "clip_grad_norm", None)
    if clip is None:
        parameters = [p for group in inner.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(parameters, clip_val)
        return
    clip(clip_val)


__all__ = [
    "FAIRSCALE_MISSING",
    "FairScaleStrategy",
    "FairScaleZeroConfig",
    "require_fairscale",
    "to_oss",
    "zero_grad_through",
]
