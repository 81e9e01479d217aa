"""ZeRO through DeepSpeed, on CUDA GPUs (nccl) and on CPU (gloo).

A thin layer over Lightning's ``DeepSpeedStrategy``: its engine set-up, precision plugin and checkpointing
are used as they are. What changes: a typed config instead of dozens of keyword arguments, ``"auto"``
values filled from the Trainer, no silent gradient clipping, CPU runs, and a plain torch Adam/AdamW from
``configure_optimizers`` working under optimizer offload.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
from collections.abc import Generator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch import LightningModule
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy
from lightning.pytorch.strategies.deepspeed import remove_module_hooks
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.nn import Module
from torch.optim import Optimizer
from torchmetrics import Metric

from lightning_zero.checkpoint.reshard import repair_universal_load
from lightning_zero.checkpoint.strategy import SafeCheckpoints
from lightning_zero.checkpoint.weights_only import load_into_deepspeed
from lightning_zero.errors import ZeroConfigError
from lightning_zero.internals import (
    attached_trainer,
    auto_micro_batch_size,
    init_deepspeed_config,
    init_deepspeed_distributed,
    init_optimizers_and_schedulers,
    lightning_deepspeed_optimizer,
    load_universal_checkpoint_next,
    wrap_launcher,
    zero3_consolidated_state_dict,
    zero3_gradient_hooks,
)
from lightning_zero.packages import TRANSFORMERS
from lightning_zero.runtime.ops import wait_for_op
from lightning_zero.runtime.watchdog import WatchedRanks, end_process_groups
from lightning_zero.strategies import cpu_adam
from lightning_zero.strategies.deepspeed_config import DeepSpeedZeroConfig, TrainerValues
from lightning_zero.strategies.deepspeed_settings import (
    DeepSpeedSettings,
    OptimizerValues,
    ReadOnlyConfig,
    config_change_error,
)
from lightning_zero.strategies.launch_checks import preflight_launcher
from lightning_zero.strategies.shared import ShardedSetup

if TYPE_CHECKING:
    import deepspeed
    from lightning.pytorch.core.optimizer import LRSchedulerConfig


def metrics_to_device(module: Module, device: torch.device) -> None:
    """Move the module's torchmetrics metrics to ``device``.

    DeepSpeed does not move a module whose parameters ZeRO-3 created partitioned (a model built in
    ``configure_model``), so metrics built in ``__init__`` would stay in host memory and refuse device inputs.
    """
    for submodule in module.modules():
        if isinstance(submodule, Metric):
            submodule.to(device)


def forget_zero3_modules(module: Module) -> None:
    """Take ``module`` and its sub-modules off the module-level stack that DeepSpeed's ZeRO-3 keeps of the modules
    it runs.

    Each ZeRO-3 engine puts its root module there for good, and a forward pass that an exception cut short leaves
    its sub-modules there; ``engine.destroy()`` takes none of them off. Without this, a finished run's or a trial's
    model would stay in device and host memory for the rest of the process.
    """
    from deepspeed.runtime.zero import parameter_offload

    ours = {id(submodule) for submodule in module.modules()}
    stack = parameter_offload.FWD_MODULE_STACK
    stack[:] = [entry for entry in stack if id(entry) not in ours]


def release_engine(engine: deepspeed.DeepSpeedEngine, zero_stage_3: bool) -> None:
    """Let a finished run's engine, optimizer state and model be freed, leaving the model usable after ``fit``.

    A ZeRO optimizer puts a hook on each parameter's gradient accumulation; torch keeps those in a C++ table that
    Python's garbage collector cannot see, and each reaches the optimizer, the engine and so the model, which would
    stay in memory for the rest of the process. ``engine.destroy()`` removes them and the other links from the
    parameters to the optimizer (the hooks alone left a ZeRO-2 offload run's model alive); under ZeRO-3 it would
    also remove the hooks that gather parameters for a forward pass (generation, a later ``validate``), so there
    only the gradient hooks go.
    """
    if not zero_stage_3:
        engine.destroy()
        return
    for hook in zero3_gradient_hooks(engine.optimizer):
        hook.remove()


def engine_optimizer(module: LightningModule, zero: DeepSpeedZeroConfig) -> tuple[Optimizer, LRSchedulerConfig | None]:
    """The optimizer and scheduler of ``module.configure_optimizers()`` as an engine of ``zero`` steps them.

    The run and each of ``zero_auto``'s trials build theirs here, so they cannot differ: under optimizer offload a
    plain torch Adam/AdamW becomes DeepSpeed's CPU Adam (:func:`~lightning_zero.strategies.cpu_adam.for_deepspeed`).
    """
    # Lightning's own reading of the many forms `configure_optimizers` may return, as its DeepSpeedStrategy does.
    optimizers, schedulers = init_optimizers_and_schedulers(module)
    if len(optimizers) != 1 or len(schedulers) > 1:
        raise ZeroConfigError(
            f"DeepSpeed steps one optimizer and at most one scheduler, but `configure_optimizers` returned"
            f" {len(optimizers)} and {len(schedulers)}: return one of each."
        )
    scheduler_config = schedulers[0] if schedulers else None
    scheduler = scheduler_config.scheduler if scheduler_config is not None else None
    return cpu_adam.for_deepspeed(optimizers[0], scheduler, zero), scheduler_config


def zenflow_optimizer_section(ds_config: Mapping[str, Any], optimizer: Optimizer | None) -> dict[str, Any]:
    """``ds_config`` with the ``optimizer`` section DeepSpeed's ZenFlow needs beside a client optimizer.

    ZenFlow's accelerator-side optimizer (an AdamW over the selected columns) takes its hyper-parameters from the
    config's ``optimizer.params`` only; DeepSpeed 0.19.8 fails without them (TypeError) and ignores that section
    otherwise when it is given a client optimizer. They are the client optimizer's defaults.
    """
    config = dict(ds_config)
    zenflow = (config.get("zero_optimization") or {}).get("zenflow")
    if not zenflow or optimizer is None or "optimizer" in config:
        return config
    defaults = optimizer.defaults
    params: dict[str, Any] = {name: defaults[name] for name in ("lr", "eps", "weight_decay") if name in defaults}
    if "betas" in defaults:
        params["betas"] = list(defaults["betas"])
    config["optimizer"] = {"type": "AdamW", "params": params}
    return config


def initialize_engine(
    model: Module,
    ds_config: Mapping[str, Any],
    device_rank: int,
    optimizer: Optimizer | None = None,
    lr_scheduler: Any = None,
    parameters: list[Any] | None = None,
) -> tuple[deepspeed.DeepSpeedEngine, Optimizer]:
    """``deepspeed.initialize`` as the strategy calls it, for the run and for ``zero_auto``'s trials.

    ``device_rank`` is the device index (the local rank on CPU, where Lightning's ``None`` fails in DeepSpeed);
    ``parameters`` defaults to the model's trainable ones.
    """
    import deepspeed

    if parameters is None:
        parameters = [p for p in model.parameters() if p.requires_grad]
    engine, ds_optimizer, _, _ = deepspeed.initialize(
        args=argparse.Namespace(device_rank=device_rank),
        config=zenflow_optimizer_section(ds_config, optimizer),
        model=model,
        model_parameters=parameters,
        optimizer=optimizer,
        lr_scheduler=lr_scheduler,
        dist_init_required=False,
    )
    return engine, ds_optimizer


class _DeepSpeedOnCpu(DeepSpeedStrategy):
    """Lightning's ``DeepSpeedStrategy`` on CPU as well: it refuses anything but CUDA at set-up and gives DeepSpeed a
    device index that is ``None`` on CPU; DeepSpeed itself runs there."""

    _replaced_accelerator: Any = None

    @property
    def on_cpu(self) -> bool:
        return self.root_device.type == "cpu"

    def setup_environment(self) -> None:
        if self.on_cpu:
            self._replaced_accelerator = use_deepspeed_cpu_accelerator()
        DDPStrategy.setup_environment(self)

    def teardown(self) -> None:
        super().teardown()
        if self._replaced_accelerator is not None:  # DeepSpeed's accelerator is process-wide: give it back
            from deepspeed.accelerator import set_accelerator

            set_accelerator(self._replaced_accelerator)
            self._replaced_accelerator = None

    def setup_distributed(self) -> None:
        if not self.on_cpu:
            super().setup_distributed()
            return
        reset_seed()
        self.set_world_ranks()
        wait_for_op("ShareMemCommBuilder")  # DeepSpeed loads it on CPU at init, through torch's build lock
        init_deepspeed_distributed(self)

    @property
    def _device_rank(self) -> int:
        index = self.root_device.index
        return self.local_rank if index is None else index

    def _setup_model_and_optimizer(
        self, model: Module, optimizer: Optimizer | None, lr_scheduler: Any = None
    ) -> tuple[deepspeed.DeepSpeedEngine, Optimizer]:
        # Lightning's passes `device_rank=root_device.index`, None on CPU, where DeepSpeed fails comparing it.
        assert self.config is not None
        return initialize_engine(model, copy.deepcopy(self.config), self._device_rank, optimizer, lr_scheduler)

    def _deepspeed_initialize(
        self,
        model: Module,
        config: Any,
        parameters: list[Any],
        optimizer: Optimizer | None = None,
        lr_scheduler: Any = None,
    ) -> tuple[deepspeed.DeepSpeedEngine, Optimizer]:
        return initialize_engine(model, config, self._device_rank, optimizer, lr_scheduler, parameters)


def strategy_settings(
    zero: DeepSpeedZeroConfig | Mapping[str, Any] | None,
    deepspeed_config: str | Path | Mapping[str, Any] | None,
    owner: str,
) -> DeepSpeedSettings:
    """The settings a strategy is given: a typed config (or its fields), a DeepSpeed config, or Lightning's
    ``PL_DEEPSPEED_CONFIG_PATH`` file when neither is."""
    if zero is not None and deepspeed_config is not None:
        raise ZeroConfigError(f"Pass either `zero` or `deepspeed_config` to {owner}, not both.")
    if deepspeed_config is None:
        deepspeed_config = lightning_config_path(zero)
    if deepspeed_config is None:
        return DeepSpeedSettings.from_zero(DeepSpeedZeroConfig.coerce(zero))
    return DeepSpeedSettings.from_deepspeed(deepspeed_config)


def lightning_config_path(zero: Any) -> str | None:
    """The DeepSpeed config file named by Lightning's ``PL_DEEPSPEED_CONFIG_PATH``, read as Lightning's
    ``DeepSpeedStrategy`` reads it: when no config is given. Given ``zero`` settings (a preset), it is not read,
    with one warning."""
    path = os.environ.get(DeepSpeedStrategy.DEEPSPEED_ENV_VAR)
    if not path:
        return None
    if zero is not None:
        rank_zero_warn(
            f"{DeepSpeedStrategy.DEEPSPEED_ENV_VAR} is set but not read: this strategy has its own `zero` settings."
            f" To run from that file, use `ZeroStrategy(deepspeed_config={path!r})`."
        )
        return None
    if not Path(path).is_file():
        raise ZeroConfigError(
            f"{DeepSpeedStrategy.DEEPSPEED_ENV_VAR} is '{path}', which is not a file: point it at a DeepSpeed JSON"
            " or YAML config, or unset it."
        )
    rank_zero_info(f"DeepSpeed config from {DeepSpeedStrategy.DEEPSPEED_ENV_VAR}: {path}")
    return path


class DeepSpeedZeroStrategy(ShardedSetup, WatchedRanks, SafeCheckpoints, _DeepSpeedOnCpu):
    """ZeRO stages 0-3 with optional CPU/NVMe offload, through DeepSpeed (also known as ``ZeroStrategy``).

    Args:
        zero: The ZeRO settings (a :class:`DeepSpeedZeroConfig` or a mapping of its fields).
        deepspeed_config: A full DeepSpeed config instead (a dict, or a JSON/YAML file path). ``"auto"``
            values in it are filled from the Trainer and the module; values that contradict the Trainer
            are an error. Do not pass ``zero`` with it. The strategy then reads everything from this
            config: :attr:`zero` holds its stage, offload devices and fp16 loss scaling.
        accelerator: Set by the Trainer.
        parallel_devices: Set by the Trainer.
        cluster_environment: Set by the Trainer.
        precision_plugin: Set by the Trainer.
        process_group_backend: ``"nccl"`` on GPUs and ``"gloo"`` on CPU unless given.
        timeout: Collective-operation timeout.
        load_full_weights: Stage 3: load a single consolidated checkpoint file rather than a sharded directory.
        logging_level: DeepSpeed's logging level.
    """

    #: The registered name that builds this class with its defaults (stage 2).
    strategy_name = "zero2"
    zero_backend = "deepspeed"

    # LightningCLI reads this signature: the parameters it shares with the other strategies stay spelled out.
    def __init__(
        self,
        zero: DeepSpeedZeroConfig | None = None,
        deepspeed_config: str | Path | dict[str, Any] | None = None,
        accelerator: Any = None,
        parallel_devices: list | None = None,
        cluster_environment: Any = None,
        precision_plugin: Any = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
        load_full_weights: bool = False,
        logging_level: int = logging.WARN,
    ) -> None:
        #: The run's typed and DeepSpeed configs, in one frozen value; resolved further as the run is set up.
        self.settings = strategy_settings(zero, deepspeed_config, "ZeroStrategy")
        remote_device = self.zero.offload_parameters if self.zero.offload_parameters != "none" else None
        super().__init__(
            accelerator=accelerator,
            config=self.settings.deepspeed_dict(),
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            precision_plugin=precision_plugin,
            process_group_backend=process_group_backend,
            timeout=timeout,
            load_full_weights=load_full_weights,
            logging_level=logging_level,
            remote_device=remote_device,
        )
        self._transformers_zero3: Any = None

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
        # Lightning's `__init__` stores the config it was given, which is the settings' own: nothing else may.
        if value != self.settings.read_only():
            raise config_change_error()

    @staticmethod
    def end_process_groups() -> None:
        """DeepSpeed's destroy first, which also drops the references DeepSpeed keeps to the groups (its copy of
        the world group among them), then what every strategy does."""
        import deepspeed.comm

        if deepspeed.comm.is_initialized():
            deepspeed.comm.destroy_process_group()
        end_process_groups()

    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        wrap_launcher(self, preflight_launcher)

    def setup(self, trainer: Any) -> None:
        self.apply_memory_budget()
        self.prepare_blocks()
        super().setup(trainer)
        if self.zero_stage_3:
            assert self.lightning_module is not None
            metrics_to_device(self.lightning_module, self.root_device)

    @contextmanager
    def model_sharded_context(self) -> Generator[None, None, None]:
        # Tell transformers, where installed, that ZeRO-3 is on, so models built in `configure_model` initialise
        # and load their weights partition by partition (its `HfDeepSpeedConfig` must stay alive while it is used).
        init_deepspeed_config(self)
        if self.zero_stage_3 and self._transformers_zero3 is None and TRANSFORMERS:
            from transformers.integrations import HfDeepSpeedConfig

            self._transformers_zero3 = HfDeepSpeedConfig(self.settings.deepspeed_dict())
        with super().model_sharded_context():
            yield

    def teardown(self) -> None:
        import deepspeed

        if isinstance(self.model, deepspeed.DeepSpeedEngine):
            release_engine(self.model, self.zero_stage_3)
        if self.zero_stage_3 and self.model is not None:
            forget_zero3_modules(self.model)
        if self._transformers_zero3 is not None:
            from transformers.integrations.deepspeed import unset_hf_deepspeed_config

            unset_hf_deepspeed_config()
            self._transformers_zero3 = None
        super().teardown()

    def _initialize_deepspeed_inference(self, model: Module) -> None:
        # Lightning's version passes `device_rank=root_device.index` (None on CPU: DeepSpeed fails comparing it)
        # and reads `zero_allow_untested_optimizer` from the config (absent from many config files).
        config = self.settings.deepspeed_dict()
        inference_config: dict[str, Any] = {"train_micro_batch_size_per_gpu": 1}
        for block in ("fp16", "bf16"):
            if block in config:
                inference_config[block] = config[block]
        if self.zero_stage_3:
            inference_config["zero_allow_untested_optimizer"] = True
            inference_config["zero_optimization"] = config["zero_optimization"]
        remove_module_hooks(model)
        self.model, _ = self._deepspeed_initialize(model, inference_config, [])

    def _init_optimizers(self) -> tuple[Optimizer, LRSchedulerConfig | None]:
        assert self.lightning_module is not None
        return engine_optimizer(self.lightning_module, self.zero)

    def _format_config(self) -> None:
        # Runs before `configure_model` (ZeRO-3 needs the config to build the model): only Trainer values here.
        self.settings = self.settings.with_trainer(self._trainer_values())

    def init_deepspeed(self) -> None:
        # The model exists now: `"auto"` optimizer and scheduler values come from the module's optimizer. With an
        # `optimizer` section DeepSpeed builds its own and Lightning never calls `_init_optimizers`: reading the
        # module's settings is this one call of `configure_optimizers`.
        module = self.lightning_module
        if self.settings.needs_optimizer and module is not None and module.trainer.training:
            optimizer, _ = lightning_deepspeed_optimizer(self)
            values = OptimizerValues(optimizer.defaults, int(module.trainer.estimated_stepping_batches))
            self.settings = self.settings.with_optimizer(values)
        super().init_deepspeed()

    def _trainer_values(self) -> TrainerValues:
        module = self.lightning_module
        if module is None or attached_trainer(module) is None:
            return TrainerValues(micro_batch_size=1)
        trainer = module.trainer
        return TrainerValues(
            micro_batch_size=auto_micro_batch_size(self),
            accumulate_grad_batches=trainer.accumulate_grad_batches,
            gradient_clip_val=trainer.gradient_clip_val,
            precision=str(self.precision_plugin.precision),
        )

    def full_state_dict(self) -> dict[str, Any]:
        """The whole model's state dict on global rank 0 (gathered across ranks under ZeRO-3); collective."""
        assert self.lightning_module is not None
        if not self.zero_stage_3:
            return self.lightning_module.state_dict()
        state = zero3_consolidated_state_dict(self.deepspeed_engine)
        return state if state is not None else {}

    def load_consolidated_weights(self, module: Module, state_dict: dict[str, Any]) -> None:
        # The engine is set up before a checkpoint loads, and Lightning's `load_model_state_dict` does nothing here.
        load_into_deepspeed(module, self.deepspeed_engine, state_dict, self.zero.stage)

    def swaps_optimizer_to_nvme(self) -> bool:
        return bool(self.deepspeed_engine.zero_nvme_offload_optimizer())

    def load_universal(self, path: Path, universal: Path, weights_only: bool | None) -> dict[str, Any]:
        # Lightning builds the engine before it loads, so `checkpoint.load_universal` is switched on here.
        load_universal_checkpoint_next(self.deepspeed_engine)
        checkpoint = self.backend_load_checkpoint(universal, weights_only)
        repair_universal_load(self.deepspeed_engine.optimizer.optimizer, universal, self.zero.stage)
        return checkpoint


#: The documented name of :class:`DeepSpeedZeroStrategy`.
ZeroStrategy = DeepSpeedZeroStrategy


def use_deepspeed_cpu_accelerator() -> Any:
    """Make DeepSpeed's process-wide accelerator its CPU one; the one it replaced, or None."""
    from deepspeed.accelerator import get_accelerator, set_accelerator
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    current = get_accelerator()
    if current.device_name() == "cpu":
        return None
    set_accelerator(CPU_Accelerator())
    return current
