"""ZeRO through DeepSpeed under Lightning Fabric, on CUDA GPUs (nccl) and on CPU (gloo).

A thin layer over Fabric's ``DeepSpeedStrategy`` that shares everything with the Trainer's
:class:`~lightning_zero.strategies.deepspeed.DeepSpeedZeroStrategy`: the typed config and its translation (one
:class:`~lightning_zero.strategies.deepspeed_settings.DeepSpeedSettings`), the CPU set-up, the engine's
initialisation, DeepSpeed's CPU Adam under optimizer offload, the memory budget, the rank watchdog and the
checkpoint format (:mod:`lightning_zero.fabric.checkpoints`).
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.strategies import DDPStrategy, DeepSpeedStrategy
from lightning.fabric.utilities.seed import reset_seed
from torch.nn import Module
from torch.optim import Optimizer

from lightning_zero.errors import ZeroConfigError
from lightning_zero.fabric import checkpoints
from lightning_zero.fabric.trainer_format import load_with_schedulers
from lightning_zero.fabric.watched import FabricWatchedRanks
from lightning_zero.internals import (
    configure_fabric_activation_checkpointing,
    format_fabric_config_once,
    init_deepspeed_distributed,
    set_fabric_deepspeed_engine,
    set_fabric_world_ranks,
    zero3_consolidated_state_dict,
)
from lightning_zero.memory.budget import apply_memory_budget, lift_memory_budget
from lightning_zero.runtime.blocks import prepare_blocks
from lightning_zero.runtime.ops import wait_for_op
from lightning_zero.strategies import cpu_adam
from lightning_zero.strategies.deepspeed import (
    forget_zero3_modules,
    initialize_engine,
    release_engine,
    strategy_settings,
    use_deepspeed_cpu_accelerator,
)
from lightning_zero.strategies.deepspeed_config import DeepSpeedZeroConfig, TrainerValues
from lightning_zero.strategies.deepspeed_settings import ReadOnlyConfig, config_change_error

if TYPE_CHECKING:
    import deepspeed


def remote_device(zero: DeepSpeedZeroConfig) -> str | None:
    """Where ``fabric.init_module()`` builds a ZeRO-3 model: the parameters' offload device, or the GPU (``None``)."""
    return zero.offload_parameters if zero.offload_parameters != "none" else None


class _FabricDeepSpeedOnCpu(DeepSpeedStrategy):
    """Fabric's ``DeepSpeedStrategy`` on CPU as well: it refuses anything but CUDA at set-up and checks device
    indices that are ``None`` on CPU; DeepSpeed itself runs there (the Trainer's strategy lifts the same checks)."""

    _replaced_accelerator: Any = None

    @property
    def on_cpu(self) -> bool:
        return self.root_device.type == "cpu"

    def setup_environment(self) -> None:
        # Fabric's DeepSpeed strategy refuses anything but CUDA here; DeepSpeed itself runs on CPU.
        if self.on_cpu:
            self._replaced_accelerator = use_deepspeed_cpu_accelerator()
        DDPStrategy.setup_environment(self)

    def _setup_distributed(self) -> None:
        if not self.on_cpu:
            super()._setup_distributed()
            return
        # Fabric's checks device indices, which are None on CPU.
        reset_seed()
        set_fabric_world_ranks(self)
        wait_for_op("ShareMemCommBuilder")  # DeepSpeed loads it on CPU at init, through torch's build lock
        init_deepspeed_distributed(self)
        format_fabric_config_once(self)

    def teardown(self) -> None:
        super().teardown()
        if self._replaced_accelerator is not None:  # DeepSpeed's accelerator is process-wide: give it back
            from deepspeed.accelerator import set_accelerator

            set_accelerator(self._replaced_accelerator)
            self._replaced_accelerator = None


class FabricZeroStrategy(FabricWatchedRanks, _FabricDeepSpeedOnCpu):
    """ZeRO stages 0-3 with optional CPU/NVMe offload through DeepSpeed, for ``Fabric(strategy=...)``.

    The same settings as the Trainer's ``ZeroStrategy``: pass ``zero`` (a :class:`DeepSpeedZeroConfig` or a
    mapping of its fields) or a full ``deepspeed_config`` (dict or JSON/YAML path), not both. Fabric has no
    Trainer values to fill ``"auto"`` with: the micro-batch size is 1 for DeepSpeed's bookkeeping, gradient
    accumulation is the loop's own (``fabric.no_backward_sync``), and ``gradient_clipping`` resolves to 0 unless
    the config sets it (Fabric's ``clip_gradients`` is refused by DeepSpeed's Fabric strategy).

    Args:
        zero: The ZeRO settings.
        deepspeed_config: A full DeepSpeed config instead.
        accelerator: Set by Fabric.
        parallel_devices: Set by Fabric.
        cluster_environment: Set by Fabric.
        precision: Set by Fabric.
        process_group_backend: ``"nccl"`` on GPUs and ``"gloo"`` on CPU unless given.
        timeout: Collective-operation timeout.
        load_full_weights: Stage 3: load a single consolidated checkpoint file rather than a sharded directory.
        logging_level: DeepSpeed's logging level.
    """

    #: The registered name that builds this class with its defaults (stage 2).
    strategy_name = "zero2"
    zero_backend = "deepspeed"

    def __init__(
        self,
        zero: DeepSpeedZeroConfig | dict[str, Any] | None = None,
        deepspeed_config: str | Path | dict[str, Any] | None = None,
        accelerator: Any = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: Any = None,
        precision: Any = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
        load_full_weights: bool = False,
        logging_level: int = logging.WARN,
    ) -> None:
        #: The run's typed and DeepSpeed configs, in one frozen value (the Trainer strategy's).
        self.settings = strategy_settings(zero, deepspeed_config, "FabricZeroStrategy")
        super().__init__(
            accelerator=accelerator,
            config=self.settings.deepspeed_dict(),
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            precision=precision,
            process_group_backend=process_group_backend,
            timeout=timeout,
            load_full_weights=load_full_weights,
            logging_level=logging_level,
            remote_device=remote_device(self.zero),
        )

    @property
    def zero(self) -> DeepSpeedZeroConfig:
        """The typed config the run has (from :attr:`settings`)."""
        return self.settings.zero

    @property
    def config(self) -> ReadOnlyConfig:
        """The DeepSpeed config the run has (from :attr:`settings`), to read: a change is an error."""
        return self.settings.read_only()

    @config.setter
    def config(self, value: Any) -> None:
        # Fabric's `__init__` stores the config it was given, which is the settings' own: nothing else may.
        if value != self.settings.read_only():
            raise config_change_error()

    @property
    def precision_plugin(self) -> Any:
        """Fabric's precision plugin, under the Trainer's name the memory budget reads."""
        return self.precision

    def _format_config(self) -> None:
        # Fabric knows the precision only; the rest of the Trainer's values have their Fabric meaning (docstring).
        self.settings = self.settings.with_trainer(
            TrainerValues(micro_batch_size=1, precision=str(self.precision.precision))
        )

    def setup_module_and_optimizers(
        self, module: Module, optimizers: list[Optimizer], scheduler: Any = None
    ) -> tuple[deepspeed.DeepSpeedEngine, list[Optimizer], Any]:
        """The memory budget and block preparation, then DeepSpeed's engine over ``module`` and one optimizer (a
        torch Adam/AdamW becomes DeepSpeed's CPU Adam under optimizer offload)."""
        if len(optimizers) != 1:
            raise ZeroConfigError(f"DeepSpeed steps one optimizer, but `fabric.setup` got {len(optimizers)}: pass one.")
        self.prepare_module(module)
        optimizer = cpu_adam.for_deepspeed(optimizers[0], scheduler, self.zero)
        engine, ds_optimizer = initialize_engine(
            module, self.settings.deepspeed_dict(), self._device_rank, optimizer, scheduler
        )
        set_fabric_deepspeed_engine(self, engine)
        configure_fabric_activation_checkpointing(self)
        return engine, [ds_optimizer], engine.lr_scheduler

    def setup_module(self, module: Module) -> deepspeed.DeepSpeedEngine:
        """An engine for inference (no optimizer)."""
        self.prepare_module(module)
        engine, _ = initialize_engine(module, self.settings.deepspeed_dict(), self._device_rank)
        set_fabric_deepspeed_engine(self, engine)
        return engine

    def module_sharded_context(self) -> AbstractContextManager[Any]:
        """ZeRO-3's partitioned construction (``fabric.init_module()``), given a config DeepSpeed may change."""
        import deepspeed

        return deepspeed.zero.Init(
            enabled=self.zero_stage_3,
            remote_device=self.remote_device,
            config_dict_or_path=self.settings.deepspeed_dict(),
        )

    def prepare_module(self, module: Module) -> None:
        """Apply the memory budget for ``module`` and prepare its blocks (checkpointing, compiling)."""
        apply_memory_budget(self, self.zero_backend, module)
        prepare_blocks(module, self.zero.activation_checkpointing, self.zero.compile_blocks)

    @property
    def _device_rank(self) -> int:
        index = self.root_device.index
        return self.local_rank if index is None else index

    def save_checkpoint(
        self, path: Any, state: dict[str, Any], storage_options: Any = None, filter: Any = None
    ) -> None:
        """Fabric's DeepSpeed save (the Trainer's directory format), written atomically with a manifest."""
        if storage_options is not None or filter is not None:
            return super().save_checkpoint(path, state, storage_options, filter)  # Fabric's refusal of both
        checkpoints.save(
            self,
            path,
            state,
            lambda ckpt, partial: super(FabricZeroStrategy, self).save_checkpoint(
                partial, ckpt, storage_options=storage_options, filter=filter
            ),
        )

    def load_checkpoint(
        self, path: Any, state: Any = None, strict: bool = True, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """A checkpoint of Fabric or the Trainer, checked first; at another stage or world size through its
        universal form, or its weights alone where the optimizer state cannot be carried; LR schedulers in
        ``state`` from the checkpoint's ``lr_schedulers``."""
        if not isinstance(state, dict) or (self.load_full_weights and self.zero_stage_3):
            return super().load_checkpoint(path, state, strict, weights_only)
        where = Path(self.broadcast(str(path)))

        def load(others: dict[str, Any]) -> dict[str, Any]:
            def read(directory: Path) -> dict[str, Any]:
                return super(FabricZeroStrategy, self).load_checkpoint(directory, others, strict, weights_only)

            return checkpoints.load(self, where, others, read, strict)

        return load_with_schedulers(state, strict, load)

    def full_state_dict(self, model: Module) -> dict[str, Any]:
        """The whole state dict of ``model`` (as ``fabric.setup`` returned it) on global rank 0, gathered across
        ranks under ZeRO-3; collective."""
        engine = checkpoints.deepspeed_engine({"model": model})
        if not self.zero_stage_3:
            state: dict[str, Any] = engine.module.state_dict()
            return state
        gathered = zero3_consolidated_state_dict(engine)
        return gathered if gathered is not None else {}

    def teardown(self) -> None:
        import deepspeed

        engine = self.model
        if isinstance(engine, deepspeed.DeepSpeedEngine):
            release_engine(engine, self.zero_stage_3)
            if self.zero_stage_3:
                forget_zero3_modules(engine)
        lift_memory_budget(self)
        super().teardown()

    @staticmethod
    def end_process_groups() -> None:
        """DeepSpeed's destroy first, then what every strategy does (as the Trainer's strategy)."""
        from lightning_zero.strategies.deepspeed import DeepSpeedZeroStrategy

        DeepSpeedZeroStrategy.end_process_groups()
