"""ZeRO-1/2 through FairScale under Lightning Fabric, on CPU (gloo) and CUDA GPUs (nccl).

A thin layer over Fabric's ``DDPStrategy`` with the Trainer's
:class:`~lightning_zero.strategies.fairscale.FairScaleStrategy` pieces: the typed config and its translation, each
optimizer re-created as a ``fairscale.optim.OSS`` over the same groups (:func:`~lightning_zero.strategies.fairscale.
to_oss`), stage 1 wrapped in DDP and stage 2 in ``ShardedDataParallel`` (gradients cleared through its buckets),
clipping by the norm over every rank's shard, and the Trainer's checkpoint file: one ``torch.save`` of the model's
``state_dict``, the OSS states consolidated on rank 0 under ``optimizer_states`` with their parameters' names, LR
schedulers under ``lr_schedulers``, atomic with its manifest.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.plugins.precision import MixedPrecision
from lightning.fabric.strategies import DDPStrategy
from torch import Tensor, nn
from torch.optim import Optimizer

from lightning_zero.checkpoint.atomic import save_module_atomically
from lightning_zero.checkpoint.by_name import PARAMETER_NAMES_KEY, parameter_names
from lightning_zero.checkpoint.manifest import checkpoint_manifest
from lightning_zero.checkpoint.reshard import WEIGHTS_ONLY, resume_route
from lightning_zero.checkpoint.validate import check_checkpoint
from lightning_zero.checkpoint.weights_only import WEIGHTS_ONLY_KEY, weights_only_of_another_backend
from lightning_zero.errors import ZeroConfigError
from lightning_zero.fabric.trainer_format import (
    OPTIMIZERS,
    WEIGHTS,
    load_with_schedulers,
    optimizers_of,
    plain,
    restore_entries,
    saved_optimizer_states,
    the_module,
    with_trainer_keys,
)
from lightning_zero.fabric.watched import FabricWatchedRanks
from lightning_zero.internals import BackwardSyncControl, set_backward_sync_control, wait_for_sharded_reductions
from lightning_zero.memory.budget import apply_memory_budget, lift_memory_budget
from lightning_zero.runtime.blocks import prepare_blocks
from lightning_zero.strategies.cpu_adam import rebind_scheduler
from lightning_zero.strategies.fairscale import require_fairscale, to_oss, zero_grad_through
from lightning_zero.strategies.fairscale_config import FairScaleZeroConfig, ddp_options, sharded_ddp_options

if TYPE_CHECKING:
    from fairscale.optim import OSS


class FabricFairScaleStrategy(FabricWatchedRanks, DDPStrategy):
    """ZeRO stage 1 (OSS + DDP) or 2 (OSS + ShardedDataParallel) through FairScale, for ``Fabric(strategy=...)``.

    Args:
        zero: The ZeRO settings (a :class:`FairScaleZeroConfig` or a mapping of its fields), as for the Trainer.
        accelerator: Set by Fabric.
        parallel_devices: Set by Fabric.
        cluster_environment: Set by Fabric.
        precision: Set by Fabric.
        process_group_backend: ``"nccl"`` on GPUs and ``"gloo"`` on CPU unless given.
        timeout: Collective-operation timeout.
    """

    #: The registered name that builds this class with its defaults (stage 2).
    strategy_name = "zero2_fairscale"
    zero_backend = "fairscale"

    def __init__(
        self,
        zero: FairScaleZeroConfig | dict[str, Any] | None = None,
        accelerator: Any = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: Any = None,
        precision: Any = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
    ) -> None:
        self.zero = FairScaleZeroConfig.coerce(zero)
        require_fairscale()
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            precision=precision,
            process_group_backend=process_group_backend,
            timeout=timeout,
            **(ddp_options(self.zero) if self.zero.stage == 1 else {}),
        )
        if self.zero.stage == 2:
            set_backward_sync_control(self, _ShardedBackwardSyncControl())

    @property
    def precision_plugin(self) -> Any:
        """Fabric's precision plugin, under the Trainer's name the memory budget reads."""
        return self.precision

    @property
    def model(self) -> nn.Module | None:
        """``None``: Fabric's strategy holds no model (each call is given it, the memory budget too)."""
        return None

    def setup_module_and_optimizers(
        self, module: nn.Module, optimizers: list[Optimizer], scheduler: Any = None
    ) -> tuple[nn.Module, list[Optimizer], Any]:
        """The memory budget and block preparation, each optimizer re-created as an OSS (a scheduler given to
        ``fabric.setup`` follows it), then the model wrapped in DDP (stage 1) or ShardedDataParallel (stage 2)."""
        apply_memory_budget(self, self.zero_backend, module)
        prepare_blocks(module, self.zero.activation_checkpointing, self.zero.compile_blocks)
        sharded = [to_oss(optimizer, self.zero) for optimizer in optimizers]
        if scheduler is not None:
            for old, new in zip(optimizers, sharded, strict=True):
                if scheduler.optimizer is old:
                    rebind_scheduler(scheduler, new)
        wrapped = self._wrap(module, sharded)
        self._adapt_precision()
        return wrapped, list(sharded), scheduler

    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        """Refused: the optimizer is sharded as the model is wrapped (``fabric.setup_optimizers`` after
        ``fabric.setup(model)`` would train it unsharded, as plain DDP)."""
        raise ZeroConfigError(
            "FairScale presets shard the optimizer as they wrap the model: set both up together, with"
            " `fabric.setup(model, optimizer)`."
        )

    def _wrap(self, module: nn.Module, optimizers: list[OSS]) -> nn.Module:
        if self.zero.stage == 1:
            return super().setup_module(module)
        from fairscale.nn.data_parallel import ShardedDataParallel

        # A Fabric loop may make several backward passes per step, as the Trainer's manual optimization does.
        options = sharded_ddp_options(self.zero, manual_optimization=len(optimizers) > 1)
        wrapper = ShardedDataParallel(module, sharded_optimizer=optimizers, **options)
        for optimizer in optimizers:
            _clear_through(wrapper, optimizer)
        return wrapper

    def _adapt_precision(self) -> None:
        if isinstance(self.precision, MixedPrecision) and self.precision.scaler is not None:
            from fairscale.optim.grad_scaler import ShardedGradScaler

            self.precision.scaler = ShardedGradScaler()

    def backward(self, tensor: Tensor, module: nn.Module | None, *args: Any, **kwargs: Any) -> None:
        """Fabric's backward, then (stage 2) a wait for every gradient reduction it started: ShardedDataParallel
        waits only at the end of the first backward pass after a forward."""
        super().backward(tensor, module, *args, **kwargs)
        if module is not None and _is_sharded_ddp(module):
            wait_for_sharded_reductions(module)

    def clip_gradients_norm(
        self,
        module: nn.Module,
        optimizer: Optimizer,
        max_norm: float | int,
        norm_type: float | int = 2.0,
        error_if_nonfinite: bool = True,
    ) -> Tensor:
        """Clip by the norm over every rank's gradient shard (a local ``clip_grad_norm_`` sees only some)."""
        self.precision.unscale_gradients(optimizer)
        norm: Tensor = optimizer.clip_grad_norm(max_norm, norm_type=norm_type)  # type: ignore[attr-defined]
        if error_if_nonfinite and not torch.isfinite(norm):
            raise RuntimeError(f"The total norm of order {norm_type} of the gradients is non-finite: {norm}.")
        return norm

    def get_optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """The whole optimizer state on rank 0 (gathered from every rank's shard), ``{}`` elsewhere; collective."""
        from fairscale.optim import OSS

        if not isinstance(optimizer, OSS):
            return super().get_optimizer_state(optimizer)
        optimizer.consolidate_state_dict(recipient_rank=0)
        return optimizer.state_dict() if self.is_global_zero else {}

    def full_state_dict(self, model: nn.Module) -> dict[str, Any]:
        """The whole state dict of ``model`` (as ``fabric.setup`` returned it): every rank holds all parameters."""
        state: dict[str, Any] = _unwrapped(model).state_dict()
        return state

    def save_checkpoint(
        self, path: Any, state: dict[str, Any], storage_options: Any = None, filter: Any = None
    ) -> None:
        """The Trainer's FairScale checkpoint file, written atomically with a manifest; collective."""
        if filter is not None:
            raise ZeroConfigError("FairScale presets save whole checkpoints: remove `filter` from `fabric.save`.")
        module = _unwrapped(the_module(state)[1])
        optimizers = [optimizer for _, optimizer in optimizers_of(state)]
        checkpoint = self._trainer_checkpoint(module, optimizers, state)
        precision = str(self.precision.precision)

        def write(checkpoint: dict[str, Any], partial: Path) -> None:
            if self.is_global_zero:
                self.checkpoint_io.save_checkpoint(checkpoint, partial, storage_options=storage_options)

        save_module_atomically(self, module, precision, checkpoint, path, write, self.zero_backend, self.zero.stage)

    def _trainer_checkpoint(
        self, module: nn.Module, optimizers: list[Optimizer], state: dict[str, Any]
    ) -> dict[str, Any]:
        rest = {key: value for key, value in state.items() if not isinstance(value, (nn.Module, Optimizer))}
        checkpoint = plain(with_trainer_keys(rest))
        checkpoint[WEIGHTS] = module.state_dict()
        checkpoint[OPTIMIZERS] = [self.get_optimizer_state(optimizer) for optimizer in optimizers]
        if optimizers:  # its optimizer state is keyed by position: the names make it readable by other backends
            checkpoint[PARAMETER_NAMES_KEY] = parameter_names(module, optimizers[0])
        return checkpoint

    def load_checkpoint(
        self, path: Any, state: Any = None, strict: bool = True, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """A FairScale checkpoint of Fabric or the Trainer, at any world size, checked first; a checkpoint of
        another backend resumes its weights alone, with one warning saying why."""
        if not isinstance(state, dict) or not state:
            return super().load_checkpoint(path, state, strict, weights_only)  # Fabric's own errors and raw loads
        where = Path(self.broadcast(str(path)))
        module = _unwrapped(the_module(state)[1])
        check_checkpoint(where, module)

        def load(others: dict[str, Any]) -> dict[str, Any]:
            manifest = checkpoint_manifest(where)
            route = resume_route(manifest, self.zero_backend, self.zero.stage, self.world_size)
            if route == WEIGHTS_ONLY:
                checkpoint = weights_only_of_another_backend(where, self.zero_backend, self.zero.stage)
            else:
                checkpoint = self.checkpoint_io.load_checkpoint(where, weights_only=weights_only)
            module.load_state_dict(checkpoint.pop(WEIGHTS), strict=strict)
            if checkpoint.pop(WEIGHTS_ONLY_KEY, False):
                del checkpoint[OPTIMIZERS]  # none: the optimizers start afresh
            else:
                for optimizer, optimizer_state in saved_optimizer_states(checkpoint, optimizers_of(others), strict):
                    optimizer.load_state_dict(optimizer_state)  # OSS keeps this rank's shard
            checkpoint.pop(PARAMETER_NAMES_KEY, None)
            return restore_entries(checkpoint, others, strict)

        return load_with_schedulers(state, strict, load)

    def teardown(self) -> None:
        lift_memory_budget(self)
        super().teardown()


class _ShardedBackwardSyncControl(BackwardSyncControl):
    """``fabric.no_backward_sync`` through ShardedDataParallel's ``no_sync`` (Fabric's DDP control takes DDP only)."""

    def no_backward_sync(self, module: nn.Module, enabled: bool) -> AbstractContextManager[Any]:
        if not enabled:
            return nullcontext()
        if not _is_sharded_ddp(module):
            raise ZeroConfigError(
                f"`no_backward_sync` needs the model `fabric.setup` returned, got {type(module).__name__}."
            )
        context: AbstractContextManager[Any] = module.no_sync()  # type: ignore[operator]
        return context


def _clear_through(wrapper: Any, optimizer: OSS) -> None:
    """Make ``optimizer.zero_grad`` clear gradients through ShardedDataParallel's buckets, on its class: Fabric's
    optimizer wrapper finds ``zero_grad`` on the class, not on the instance."""
    clear = zero_grad_through(wrapper, optimizer)

    def zero_grad(self: Any, set_to_none: bool = True) -> None:
        clear(set_to_none)

    optimizer.__class__ = type(type(optimizer).__name__, (type(optimizer),), {"zero_grad": zero_grad})


def _is_sharded_ddp(module: nn.Module) -> bool:
    from fairscale.nn.data_parallel import ShardedDataParallel

    return isinstance(module, ShardedDataParallel)


def _unwrapped(model: nn.Module) -> nn.Module:
    """The user's module of a model ``fabric.setup`` returned or ``fabric.save`` was given (DDP or
    ShardedDataParallel around it)."""
    from fairscale.nn.data_parallel import ShardedDataParallel
    from lightning.fabric.wrappers import is_wrapped
    from torch.nn.parallel import DistributedDataParallel

    module = model.module if is_wrapped(model) else model
    while isinstance(module, (DistributedDataParallel, ShardedDataParallel)):
        module = module.module
    assert isinstance(module, nn.Module)
    return module
