"""ZeRO-2/3 through PyTorch FSDP2 (``fully_shard``), on CPU (gloo) and CUDA GPUs (nccl).

A thin layer over Lightning's ``ModelParallelStrategy``, which already runs on CPU and saves and loads DTensor
checkpoints (sharded directories through ``torch.distributed.checkpoint``, or one full file). What changes:
it needs no ``configure_model``: each transformer block, then each top-level submodule, is sharded by the
strategy; the mesh is pure data parallel; mixed precision is FSDP2's ``MixedPrecisionPolicy`` from the Trainer's
precision; CPU offload is ``CPUOffloadPolicy``.

Known limits: Lightning refuses ``precision="16-mixed"`` for a ``ModelParallelStrategy`` *instance* (a
``class_path`` in YAML, or ``FSDP2Strategy(...)`` in Python) before the strategy is asked; by preset name
(``strategy="zero3_fsdp"``) it runs, with FSDP2's fp16 parameters and torch's GradScaler (DTensor-aware). CPU
offload on GPUs needs gloo next to nccl for the gradients' collectives: the process group is created as
``cuda:nccl,cpu:gloo`` unless ``process_group_backend`` is given, which only holds when this strategy creates it
(the first Trainer of the process).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from lightning_zero.checkpoint.by_name import load_into_torch_optimizer, read_universal
from lightning_zero.checkpoint.strategy import SafeCheckpoints
from lightning_zero.checkpoint.weights_only import WEIGHTS_ONLY_KEY, load_into_fsdp2, weights_only_checkpoint
from lightning_zero.errors import ZeroConfigError
from lightning_zero.internals import materialize_meta_module, set_parallel_sizes
from lightning_zero.runtime.blocks import transformer_blocks
from lightning_zero.runtime.devices import optimizers_to_device
from lightning_zero.runtime.watchdog import WatchedRanks
from lightning_zero.strategies import cpu_adam
from lightning_zero.strategies.fsdp2_config import FSDP2ZeroConfig, fully_shard_options
from lightning_zero.strategies.shared import ShardedSetup

if TYPE_CHECKING:
    import lightning.pytorch as pl
    import torch
    from torch.distributed.device_mesh import DeviceMesh


class FSDP2Strategy(ShardedSetup, WatchedRanks, SafeCheckpoints, ModelParallelStrategy):
    """ZeRO stage 2 or 3, optionally with CPU offload, through FSDP2, with no model code changes.

    Args:
        zero: The ZeRO settings (a :class:`FSDP2ZeroConfig` or a mapping of its fields).
        accelerator: Set by the Trainer.
        parallel_devices: Set by the Trainer.
        cluster_environment: Set by the Trainer.
        precision_plugin: Set by the Trainer.
        process_group_backend: ``"nccl"`` on GPUs and ``"gloo"`` on CPU unless given.
        timeout: Collective-operation timeout.
    """

    #: The registered name that builds this class with its defaults (stage 3).
    strategy_name = "zero3_fsdp"
    zero_backend = "fsdp2"
    zero: FSDP2ZeroConfig

    # LightningCLI reads this signature: the parameters it shares with the other strategies stay spelled out.
    def __init__(
        self,
        zero: FSDP2ZeroConfig | None = None,
        accelerator: Any = None,
        parallel_devices: list | None = None,
        cluster_environment: Any = None,
        precision_plugin: Any = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
    ) -> None:
        self.zero = FSDP2ZeroConfig.coerce(zero)
        super().__init__(
            save_distributed_checkpoint=self.zero.checkpoint_format == "sharded",
            process_group_backend=process_group_backend,
            timeout=timeout,
        )
        self.accelerator = accelerator
        self.parallel_devices = parallel_devices
        self.cluster_environment = cluster_environment
        self.precision_plugin = precision_plugin

    @property
    def offloads(self) -> bool:
        return self.zero.offload_parameters == "cpu"

    def _get_process_group_backend(self) -> str:
        # CPU offload on GPUs leaves gradients on CPU: their collectives (clipping norms, fp16 inf checks) need gloo.
        if self.process_group_backend is None and self.offloads and self.root_device.type == "cuda":
            return "cuda:nccl,cpu:gloo"
        return super()._get_process_group_backend()

    def setup_environment(self) -> None:
        # Every process is one data-parallel shard (Lightning's default puts them on a tensor-parallel axis).
        set_parallel_sizes(self, data_parallel=self.num_nodes * self.num_processes, tensor_parallel=1)
        super().setup_environment()

    def setup(self, trainer: pl.Trainer) -> None:
        """ModelParallelStrategy's set-up, with the sharding that it expects from ``configure_model`` done here."""
        assert self.accelerator is not None and self.model is not None
        self.apply_memory_budget()
        self.accelerator.setup(trainer)
        self.model = self.precision_plugin.convert_module(self.model)
        if not _is_sharded(self.model):
            self.prepare_blocks()
            count = shard_module(self.model, self.device_mesh["data_parallel"], self._shard_options)
            rank_zero_info(f"FSDP2 stage {self.zero.stage}: {count} modules sharded.")
        materialize_meta_module(self.model, self.root_device)
        self.model_to_device()
        self.barrier()
        fitting = trainer.state.fn == TrainerFn.FITTING
        if fitting:
            self.setup_optimizers(trainer)
            if self.offloads and self.zero.fused_adam_for_offload:
                self._fuse_offloaded_adam()
        self.setup_precision_plugin()
        if fitting and not self.offloads:
            optimizers_to_device(self.optimizers, self.root_device)

    def _fuse_offloaded_adam(self) -> None:
        """Plain torch Adam/AdamW optimizers with no loop chosen (``foreach``/``fused``) become fused ones, their LR
        schedulers following."""
        for index, optimizer in enumerate(self.optimizers):
            chosen = optimizer.defaults.get("fused") or optimizer.defaults.get("foreach")
            if chosen or not cpu_adam.is_swappable(optimizer):
                continue
            fused = cpu_adam.to_fused_adam(optimizer)
            self.optimizers[index] = fused
            for config in self.lr_scheduler_configs:
                if config.scheduler.optimizer is optimizer:
                    cpu_adam.rebind_scheduler(config.scheduler, fused)

    def _shard_options(self, root: bool) -> dict[str, Any]:
        precision = str(self.precision_plugin.precision)
        return fully_shard_options(self.zero, precision, self.root_device.type, root=root)

    def model_to_device(self) -> None:
        """Move the model to its device; under CPU offload only buffers move (sharded parameters stay on CPU)."""
        assert self.model is not None
        if not self.offloads:
            super().model_to_device()
            return
        _move_buffers(self.model, self.root_device)

    def full_state_dict(self) -> dict[str, Any]:
        """The whole model's state dict on global rank 0 (gathered from every shard), ``{}`` elsewhere; collective."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        assert self.model is not None
        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return state if self.is_global_zero else {}

    def load_consolidated_weights(self, module: nn.Module, state_dict: dict[str, Any]) -> None:
        load_into_fsdp2(module, state_dict)

    def load_universal(self, path: Path, universal: Path, weights_only: bool | None) -> dict[str, Any]:
        """A DeepSpeed or FairScale checkpoint into FSDP2 (:func:`load_universal_into_fsdp2`); Lightning restores the
        rest of the dict."""
        module = self.lightning_module
        assert module is not None, "a checkpoint loads into a set-up strategy"
        return load_universal_into_fsdp2(path, universal, module, self.optimizers[0])


def load_universal_into_fsdp2(path: Path, universal: Path, module: nn.Module, optimizer: Any) -> dict[str, Any]:
    """A DeepSpeed or FairScale checkpoint ``path`` into the FSDP2-sharded ``module``: its fp32 master weights, then
    (unless ``optimizer`` is ``None``) the optimizer state by parameter name from ``universal``, its universal form;
    returns the checkpoint's other entries (Lightning's, under Fabric the state's), ``state_dict`` among them."""
    checkpoint = weights_only_checkpoint(path)
    del checkpoint[WEIGHTS_ONLY_KEY]  # the optimizer, its learning rates included, is carried
    load_into_fsdp2(module, checkpoint["state_dict"])
    if optimizer is not None:
        load_into_torch_optimizer(module, optimizer, read_universal(universal))
    return checkpoint


def shard_module(module: nn.Module, mesh: DeviceMesh, options: Any) -> int:
    """``fully_shard`` each transformer block, then each top-level submodule that holds parameters.

    ``options(root)`` gives the ``fully_shard`` keyword arguments. The module itself is not sharded (Lightning
    calls ``training_step``, not ``forward``, so its hooks would not run): parameters held directly by it are
    refused. Returns how many modules were sharded.
    """
    from torch.distributed.fsdp import FSDPModule, fully_shard

    own = [name for name, _ in module.named_parameters(recurse=False)]
    if own:
        raise ZeroConfigError(
            f"FSDP2 presets shard a LightningModule's submodules, but {type(module).__name__} holds parameters"
            f" itself ({own}): move them into a submodule."
        )
    blocks = transformer_blocks(module)
    for block in blocks:
        fully_shard(block, mesh=mesh, **options(False))
    tops = [child for child in module.children() if not isinstance(child, FSDPModule) and _has_parameters(child)]
    for child in tops:
        fully_shard(child, mesh=mesh, **options(True))
    return len(blocks) + len(tops)


def _is_sharded(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(submodule, FSDPModule) for submodule in module.modules())


def _has_parameters(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _move_buffers(module: nn.Module, device: torch.device) -> None:
    for submodule in module.modules():
        for name, buffer in submodule.named_buffers(recurse=False):
            if buffer.device != device:
                setattr(submodule, name, buffer.to(device))  # Module.__setattr__ replaces the registered buffer
