"""Every private part of Lightning, DeepSpeed, FairScale and torch that lightning-zero relies on, in one place.

None has a public route in the versions pinned by constraints.txt. Modules import the private functions from here,
under public names, and read, write or call private attributes only through the functions here, each saying what
it needs; :data:`RELIED_ON` lists every private object relied on, the private methods the strategies override
among them, each with why and the upstream issue that would end the need, and :data:`FUNCTIONS` names the entries
each function here relies on. ``tests/test_internals.py`` fingerprints the source of every entry, so an upgrade
that changes one fails CI instead of a user's run; it fails on a private upstream attribute used anywhere else, and
on a private upstream method overridden by any class of ours without an entry.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lightning.fabric.strategies.strategy import _BackwardSyncControl
from lightning.fabric.utilities.init import _materialize_distributed_module
from lightning.pytorch.core.optimizer import _init_optimizers_and_lr_schedulers
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)

__all__ = [
    "FUNCTIONS",
    "RELIED_ON",
    "BackwardSyncControl",
    "CheckpointImpl",
    "SubprocessScriptLauncher",
    "abstract_tensors",
    "apply_activation_checkpointing",
    "attached_trainer",
    "auto_class_model_classes",
    "auto_micro_batch_size",
    "checkpoint_class_path",
    "checkpoint_wrapper",
    "configure_fabric_activation_checkpointing",
    "cuda_allocator_settings",
    "deepspeed_section_parser",
    "empty_pinned_host_cache",
    "extension_build_directory",
    "fabric_num_nodes",
    "fit_loop_loader_and_fetcher",
    "format_fabric_config_once",
    "hand_over_strategy",
    "init_deepspeed_config",
    "init_deepspeed_distributed",
    "init_optimizers_and_schedulers",
    "layer_sync",
    "lightning_deepspeed_optimizer",
    "load_universal_checkpoint_next",
    "materialize_meta_module",
    "no_split_module_names",
    "scheduler_state_last_lr",
    "set_backward_sync_control",
    "set_cuda_allocator_settings",
    "set_fabric_deepspeed_engine",
    "set_fabric_world_ranks",
    "set_parallel_sizes",
    "sharded_bucket_parameter_ids",
    "stage_throughputs",
    "subcommand_parsers",
    "torchao_adamw",
    "track_steps_for_scheduler",
    "unwrap_lightning_optimizer",
    "wait_for_sharded_reductions",
    "wrap_launcher",
    "zero3_consolidated_state_dict",
    "zero3_gradient_hooks",
]

#: Dotted path of each private object relied on -> why, and the upstream issue or pull request about it.
RELIED_ON: dict[str, str] = {
    # torch
    "torch.distributed.algorithms._checkpoint.checkpoint_wrapper.checkpoint_wrapper": (
        "activation checkpointing of blocks, keeping state-dict keys loadable; the wrapper every FSDP trainer uses, "
        "still private (pytorch/pytorch#83035)"
    ),
    "torch.distributed.algorithms._checkpoint.checkpoint_wrapper.apply_activation_checkpointing": "as above",
    "torch.utils.cpp_extension._get_build_directory": (
        "the folder, and so the lock file, torch uses to build a DeepSpeed op (no public equivalent; "
        "get_default_build_root leaves out the accelerator suffix)"
    ),
    "torch.cuda.memory._set_allocator_settings": (
        "expandable segments switched on at run time for zero_auto (kept internal on purpose: pytorch/pytorch#156175)"
    ),
    "torch._subclasses.fake_tensor.FakeTensorMode": (
        "`plan` builds and runs the model with tensors that have shapes and storages but no memory or values, so a "
        "3B or 8B model plans in seconds on a laptop (torch's own tracing mode; public only through torch.export)"
    ),
    "torch._C._accelerator_getAllocatorSettings": (
        "zero_auto and the one-card strategy read the allocator settings they switch, to give them back as the user "
        "had them (no public getter; the process's PYTORCH_CUDA_ALLOC_CONF where torch lacks it)"
    ),
    "torchao.optim._AdamW": (
        "`low_memory_optimizer: adamw_bf16`: torchao's AdamW with bf16 stochastic rounding, states in the parameters' "
        "dtype; torchao exports it only under this name (its 8- and 4-bit AdamW derive from it)"
    ),
    "torch._C._host_emptyCache": (
        "zero_auto gives a trial's page-locked host blocks back on torch builds without the public "
        "torch.accelerator.empty_host_cache (torch 2.11 on the GPU machines; CUDA builds only)"
    ),
    "torch.nn.modules.module.Module._apply": (
        "tasks keep metric states in their dtype under Module.to(dtype) (TaskModule._apply, which sets them to None "
        "for the call; Lightning's own _DeviceDtypeModuleMixin overrides it the same way)"
    ),
    "torch.optim.lr_scheduler.LRScheduler.get_last_lr": (
        "a scheduler's last learning rates read from its state dict (_last_lr) in a checkpoint, with no scheduler "
        "object to ask"
    ),
    "torch.optim.lr_scheduler.LRScheduler.__init__": (
        "a scheduler re-pointed at a new optimizer wraps its step as the constructor does (_opt_called, "
        "_wrapped_by_lr_sched), so its step-order check still holds (no public re-binding)"
    ),
    # Lightning
    "lightning.fabric.utilities.init._materialize_distributed_module": (
        "FSDP2 meta-device initialisation after sharding, as ModelParallelStrategy does (its TODO: a public "
        "Fabric.materialize)"
    ),
    "lightning.pytorch.trainer.trainer.Trainer.strategy": (
        "zero_auto hands the run to the one-card strategy it chose once the model exists: Trainer.strategy reads "
        "its accelerator connector's, and there is no public setter (Lightning fixes the strategy at Trainer(...))"
    ),
    "lightning.pytorch.core.optimizer._init_optimizers_and_lr_schedulers": (
        "the module's optimizers and scheduler configs, normalised as Lightning does, before the DeepSpeed engine "
        "exists (run and zero_auto's trials alike; Lightning calls it only inside its strategies' setup)"
    ),
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy.setup_environment": (
        "lifted to run DeepSpeed on CPU (Lightning refuses it since Lightning-AI/pytorch-lightning#12699)"
    ),
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy.setup_distributed": "as above (device index check)",
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy._setup_model_and_optimizer": (
        "deepspeed.initialize with a device rank on CPU (Lightning passes the CUDA index; #12699)"
    ),
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy._initialize_deepspeed_inference": "as above",
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy._init_deepspeed_distributed": (
        "called by the CPU set-up after its own rank set-up, in place of setup_distributed's device check (#12699)"
    ),
    "lightning.fabric.strategies.deepspeed.DeepSpeedStrategy.setup_environment": (
        "lifted to run DeepSpeed on CPU under Fabric (its CUDA-only check, as the Trainer's; #12699)"
    ),
    "lightning.fabric.strategies.deepspeed.DeepSpeedStrategy._setup_distributed": (
        "replaced on CPU (its device-index check fails there): its own steps, _set_world_ranks, "
        "_init_deepspeed_distributed and the config's one _format_config (_config_initialized), in its order"
    ),
    "lightning.fabric.strategies.deepspeed.DeepSpeedStrategy._init_deepspeed_distributed": (
        "called by the CPU set-up, as _setup_distributed calls it (#12699)"
    ),
    "lightning.fabric.strategies.ddp.DDPStrategy._set_world_ranks": "as above",
    "lightning.fabric.strategies.deepspeed.DeepSpeedStrategy._set_deepspeed_activation_checkpointing": (
        "called after the engine is built, as setup_module_and_optimizers does"
    ),
    "lightning.fabric.strategies.deepspeed.DeepSpeedStrategy._format_config": (
        "replaced: the config is resolved from the typed settings once the precision is known (Fabric's own "
        "sets only the micro-batch and precision blocks)"
    ),
    "lightning.fabric.strategies.deepspeed.DeepSpeedStrategy.setup_module_and_optimizers": (
        "replaced to build the engine as the Trainer's strategy does (device rank on CPU, CPU Adam under offload); "
        "sets _deepspeed_engine and calls _set_deepspeed_activation_checkpointing as it does"
    ),
    "lightning.fabric.connector._Connector._lazy_init_strategy": (
        "the one-card Fabric strategy refuses more than one device or node at Fabric(...): the connector hands its"
        " devices to a strategy with `parallel_devices`, writes `num_nodes` into `_num_nodes` of one with"
        " `num_nodes` (no public setter), then calls its `_configure_launcher`"
    ),
    "lightning.fabric.strategies.strategy.Strategy._configure_launcher": (
        "overridden by the one-card Fabric strategy: the last call of Fabric(...)'s set-up, once devices and nodes"
        " are known, where it refuses more than one before anything runs (no public hook there)"
    ),
    "lightning.fabric.strategies.strategy._BackwardSyncControl": (
        "fabric.no_backward_sync under FairScale's ShardedDataParallel: Fabric asks the strategy's"
        " _backward_sync_control, whose DDP version takes DDP only (no public hook)"
    ),
    "lightning.fabric.strategies.ddp.DDPStrategy.__init__": (
        "sets _backward_sync_control, which FabricFairScaleStrategy replaces at stage 2 (as above)"
    ),
    "lightning.fabric.strategies.model_parallel.ModelParallelStrategy.setup_environment": (
        "a pure data-parallel mesh (_data_parallel_size, _tensor_parallel_size set before it runs), as for the "
        "Trainer's ModelParallelStrategy"
    ),
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy._init_config_if_needed": (
        "the config resolved before ZeRO-3 builds the model, for transformers' HfDeepSpeedConfig"
    ),
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy._auto_select_batch_size": (
        'the micro-batch an `"auto"` value gets, read from the train loader as Lightning does'
    ),
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy._init_optimizers": (
        "the module's AdamW swapped for DeepSpeed's CPU Adam under offload (no hook between configure_optimizers "
        "and deepspeed.initialize)"
    ),
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy._format_config": (
        "the config comes from our typed dataclass; Lightning's formatting would re-add its own defaults"
    ),
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy.__init__": (
        "stores the `config` it is given, its one write of `config` outside `_format_config`: ZeroStrategy's `config` "
        "is a read-only view of its settings that accepts only that store (Lightning's `config` is a plain attribute)"
    ),
    "lightning.pytorch.strategies.launchers.subprocess_script._SubprocessScriptLauncher.launch": (
        "checks in the launching process before the other ranks start (Lightning has no hook between the Trainer's"
        " entry point and the launch)"
    ),
    "lightning.pytorch.strategies.ddp.DDPStrategy._configure_launcher": (
        "installs that launcher for ZeroStrategy around the _launcher it sets (DeepSpeedStrategy inherits it)"
    ),
    "lightning.pytorch.strategies.ddp.DDPStrategy.setup": (
        "copied by FairScaleStrategy.setup (its _layer_sync too): ShardedDataParallel needs the optimizers before "
        "the model is wrapped"
    ),
    "lightning.pytorch.strategies.model_parallel.ModelParallelStrategy.setup": (
        "copied by FSDP2Strategy.setup: sharding in the strategy, not in the user's configure_model"
    ),
    "lightning.pytorch.strategies.model_parallel.ModelParallelStrategy._get_process_group_backend": (
        "gloo beside NCCL when FSDP2 offloads to CPU: its gradients' collectives run there (no public hook)"
    ),
    "lightning.pytorch.strategies.model_parallel.ModelParallelStrategy.setup_environment": (
        "its mesh is built from _data_parallel_size and _tensor_parallel_size, which FSDP2Strategy sets to pure data "
        'parallelism first (the constructor\'s "auto" puts processes on the tensor-parallel axis)'
    ),
    "lightning.pytorch.core.optimizer.LightningOptimizer.__init__": (
        "the optimizer a LightningOptimizer wraps (_optimizer): FairScale's OSS is consolidated and clipped itself"
    ),
    "lightning.pytorch.core.module.LightningModule.trainer": (
        "whether a Trainer is attached: the property raises without one, so _trainer is read"
    ),
    "lightning.pytorch.callbacks.throughput_monitor.ThroughputMonitor.setup": (
        "the per-stage Throughput objects it creates (_throughputs) get ThroughputMeter's peak FLOPs (no setter)"
    ),
    "lightning.pytorch.cli.LightningCLI._parse_ckpt_path": (
        "a checkpoint whose hyper-parameters the model config does not take is one error line, not a traceback"
    ),
    "lightning.pytorch.core.saving._load_state": (
        "the class a LightningCLI checkpoint records in its hyper-parameters (_class_path), read back as Lightning "
        "reads it"
    ),
    "lightning.pytorch.loops.fit_loop._FitLoop.setup_data": (
        "ExactResume reads _combined_loader and _data_fetcher to continue mid-epoch with a plain DataLoader "
        "(Lightning resumes mid-epoch only for stateful loaders: Lightning-AI/pytorch-lightning#19764)"
    ),
    # DeepSpeed
    "deepspeed.runtime.zero.stage3.DeepSpeedZeroOptimizer_Stage3.create_reduce_and_remove_grad_hooks": (
        "ZeRO-3's gradient hooks (_grad_acc_hooks) removed alone frees a finished run's model; destroy() would also "
        "remove the hooks that gather parameters for a later forward"
    ),
    "deepspeed.runtime.engine.DeepSpeedEngine._zero3_consolidated_16bit_state_dict": (
        "the whole model's weights gathered under ZeRO-3, in memory (the public save_16bit_model writes a file)"
    ),
    "deepspeed.runtime.engine.DeepSpeedEngine.load_universal_checkpoint": (
        "switched on (_config) after the engine exists: Lightning builds the engine before it loads"
    ),
    "deepspeed.runtime.config.DeepSpeedConfig._configure_train_batch_size": (
        "skipped to parse one config section alone (its batch sizes checked against the world size): DeepSpeed's "
        "parser has no per-section entry point"
    ),
    "deepspeed.runtime.config.DeepSpeedConfig._do_sanity_check": "as above (checks across sections)",
    # transformers, jsonargparse
    "transformers.models.auto.auto_factory._BaseAutoModelClass.from_config": (
        "the model class an auto class builds for a config (_model_mapping), to import it before zero.Init"
    ),
    "transformers.modeling_utils.PreTrainedModel.post_init": (
        "a Hugging Face model's block class names (_no_split_modules), the blocks to checkpoint and shard"
    ),
    "jsonargparse._core.ArgumentParser.add_subcommands": (
        "every sub-command's parser (_subcommands_action, argparse's _name_parser_map), made to raise, not exit"
    ),
    # FairScale
    "fairscale.nn.data_parallel.sharded_ddp.ShardedDataParallel._consume_work_handles": (
        "waits for SDP's reduce work before a manual optimizer step (FairScale is archived: no fix upstream)"
    ),
    "fairscale.nn.data_parallel.sharded_ddp.ShardedDataParallel._setup_bucket_strategy": (
        "zero_grad through SDP's gradient buckets (_bucket_list, _param_ids) keeps them intact; archived upstream"
    ),
}


def extension_build_directory(name: str) -> Path:
    """The folder torch builds (and locks) the C++ extension ``name`` in."""
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(name, verbose=False))


def torchao_adamw() -> Any:
    """torchao's AdamW whose states keep the parameters' dtype, with bf16 stochastic rounding (``adamw_bf16``)."""
    from torchao.optim import _AdamW

    return _AdamW


def set_backward_sync_control(strategy: Any, control: Any) -> None:
    """Give a Fabric strategy the ``control`` that ``fabric.no_backward_sync`` enters."""
    strategy._backward_sync_control = control


def hand_over_strategy(trainer: Any, strategy: Any) -> None:
    """Make ``strategy`` the one that ``trainer.strategy`` gives from now on."""
    trainer._accelerator_connector.strategy = strategy


def cuda_allocator_settings() -> str:
    """The CUDA caching allocator's settings now (``PYTORCH_CUDA_ALLOC_CONF`` syntax; ``""``: the defaults)."""
    import torch

    if hasattr(torch._C, "_accelerator_getAllocatorSettings"):  # where this torch has it
        return str(torch._C._accelerator_getAllocatorSettings())
    return os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")


def set_cuda_allocator_settings(settings: str) -> None:
    """Change the CUDA caching allocator's settings (``PYTORCH_CUDA_ALLOC_CONF`` syntax) in a running process."""
    import torch.cuda.memory

    torch.cuda.memory._set_allocator_settings(settings)


@contextlib.contextmanager
def abstract_tensors() -> Iterator[Callable[[Any], Any]]:
    """Inside, new tensors (a model built, its forward run) have shapes, dtypes and storages but no memory and no
    values; a real tensor used inside stands for itself as such a tensor, the one the function yielded gives for it.
    An operation whose output shape depends on values raises a ``RuntimeError``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        yield mode.from_tensor


def empty_pinned_host_cache() -> None:
    """Return the page-locked host blocks that torch's host allocator keeps cached to the system."""
    import torch

    if hasattr(torch.accelerator, "empty_host_cache"):
        torch.accelerator.empty_host_cache()
    else:
        torch._C._host_emptyCache()


materialize_meta_module: Callable[[nn.Module, Any], None] = _materialize_distributed_module
SubprocessScriptLauncher = _SubprocessScriptLauncher
BackwardSyncControl = _BackwardSyncControl
init_optimizers_and_schedulers = _init_optimizers_and_lr_schedulers


def zero3_gradient_hooks(optimizer: Any) -> list[Any]:
    """The hooks a ZeRO-3 optimizer put on its parameters' gradient accumulation; none for an engine's other
    optimizers (an engine set up for ``validate`` or ``predict`` alone holds no ZeRO-3 optimizer)."""
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    return list(optimizer._grad_acc_hooks) if isinstance(optimizer, DeepSpeedZeroOptimizer_Stage3) else []


def zero3_consolidated_state_dict(engine: Any) -> dict[str, Any] | None:
    """The whole model's state dict gathered from a ZeRO-3 engine's partitions on global rank 0 (``None`` on the
    others); collective."""
    state: dict[str, Any] | None = engine._zero3_consolidated_16bit_state_dict()
    return state


def load_universal_checkpoint_next(engine: Any) -> None:
    """Make a built DeepSpeed engine's next ``load_checkpoint`` read a universal checkpoint."""
    engine._config.load_universal_checkpoint = True


def unwrap_lightning_optimizer(optimizer: Any) -> Any:
    """The optimizer a ``LightningOptimizer`` wraps; any other optimizer as it is."""
    from lightning.pytorch.core.optimizer import LightningOptimizer

    return optimizer._optimizer if isinstance(optimizer, LightningOptimizer) else optimizer


def attached_trainer(module: Any) -> Any:
    """The Trainer a LightningModule is attached to, or ``None`` (its ``trainer`` property raises then)."""
    return module._trainer


def wait_for_sharded_reductions(wrapper: Any) -> None:
    """Wait for the gradient reductions a FairScale ``ShardedDataParallel`` started in this backward pass."""
    wrapper._consume_work_handles()


def sharded_bucket_parameter_ids(wrapper: Any) -> set[int]:
    """``id()`` of each parameter whose gradient is a view into a ``ShardedDataParallel`` gradient bucket."""
    return {param_id for bucket in wrapper._bucket_list for param_id in bucket._param_ids}


def track_steps_for_scheduler(optimizer: Any) -> None:
    """Wrap ``optimizer.step`` as ``LRScheduler.__init__`` does, so a scheduler re-pointed at ``optimizer`` can tell
    that it stepped before the scheduler (torch warns otherwise)."""
    step = optimizer.step

    @functools.wraps(step)
    def tracked_step(*args: Any, **kwargs: Any) -> Any:
        optimizer._opt_called = True
        return step(*args, **kwargs)

    tracked_step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    optimizer.step = tracked_step


def auto_class_model_classes(auto_class: Any) -> Any:
    """A transformers auto class's mapping from config class to the model class it builds (imported on lookup)."""
    return auto_class._model_mapping


def no_split_module_names(module: nn.Module) -> list[str]:
    """The block class names a Hugging Face model lists as never to be split (none for any other module)."""
    from transformers import PreTrainedModel

    return list(module._no_split_modules or ()) if isinstance(module, PreTrainedModel) else []


def subcommand_parsers(parser: Any) -> list[Any]:
    """The parsers of a jsonargparse ``ArgumentParser``'s sub-commands (none if it has none)."""
    action = parser._subcommands_action
    return [] if action is None else list(action._name_parser_map.values())


def stage_throughputs(monitor: Any) -> list[Any]:
    """The ``Throughput`` objects a Lightning ``ThroughputMonitor`` made in its ``setup``, one per stage."""
    return list(monitor._throughputs.values())


def fit_loop_loader_and_fetcher(fit_loop: Any) -> tuple[Any, Any]:
    """A fit loop's ``CombinedLoader`` of the train loaders and the data fetcher over it (``None`` before its
    ``setup_data``)."""
    return fit_loop._combined_loader, fit_loop._data_fetcher


def checkpoint_class_path(hyper_parameters: Any, default: Any) -> Any:
    """The class path that LightningCLI's instantiator records in a checkpoint's hyper-parameters, or ``default``."""
    return hyper_parameters.get("_class_path", default)


def scheduler_state_last_lr(state: dict[str, Any]) -> list[Any]:
    """A learning-rate scheduler's last learning rates in its ``state_dict()`` (empty when it has none)."""
    return list(state.get("_last_lr", []))


def wrap_launcher(strategy: Any, wrap: Callable[[Any], Any]) -> None:
    """Replace the launcher a Trainer strategy's ``_configure_launcher`` set by ``wrap(launcher)``."""
    strategy._launcher = wrap(strategy._launcher)


def init_deepspeed_distributed(strategy: Any) -> None:
    """A DeepSpeed strategy's (Trainer's or Fabric's) process-group set-up: node environment variables and
    ``deepspeed.init_distributed`` with the strategy's backend."""
    strategy._init_deepspeed_distributed()


def init_deepspeed_config(strategy: Any) -> None:
    """Format a Trainer DeepSpeed strategy's config now (with the Trainer's values) unless it was already."""
    strategy._init_config_if_needed()


def auto_micro_batch_size(strategy: Any) -> int:
    """The micro-batch size Lightning's DeepSpeed strategy gives an ``"auto"`` value: the train loader's batch
    size, 1 when it cannot tell."""
    size: int = strategy._auto_select_batch_size()
    return size


def lightning_deepspeed_optimizer(strategy: Any) -> tuple[Any, Any]:
    """The module's one optimizer and scheduler config as Lightning's own ``DeepSpeedStrategy`` reads them (not as
    a subclass's override of that reading does)."""
    from lightning.pytorch.strategies import DeepSpeedStrategy

    return DeepSpeedStrategy._init_optimizers(strategy)


def layer_sync(strategy: Any) -> Any:
    """The layer sync (``SyncBatchNorm``) the Trainer gave a parallel strategy, or ``None``."""
    return strategy._layer_sync


def set_parallel_sizes(strategy: Any, data_parallel: int, tensor_parallel: int) -> None:
    """The sizes of a ``ModelParallelStrategy``'s (Trainer's or Fabric's) device mesh, read by its
    ``setup_environment``."""
    strategy._data_parallel_size = data_parallel
    strategy._tensor_parallel_size = tensor_parallel


def fabric_num_nodes(strategy: Any) -> int:
    """The ``num_nodes`` Fabric was given, as its connector writes it into a strategy with a ``num_nodes``
    attribute; 1 for a strategy no ``Fabric`` was built with."""
    return int(vars(strategy).get("_num_nodes", 1))


def set_fabric_world_ranks(strategy: Any) -> None:
    """Give a Fabric strategy's cluster environment its global rank and world size."""
    strategy._set_world_ranks()


def format_fabric_config_once(strategy: Any) -> None:
    """Run a Fabric DeepSpeed strategy's ``_format_config`` unless it ran already, as its ``_setup_distributed``
    does."""
    if not strategy._config_initialized:
        strategy._format_config()
        strategy._config_initialized = True


def set_fabric_deepspeed_engine(strategy: Any, engine: Any) -> None:
    """Make ``engine`` a Fabric DeepSpeed strategy's engine (its ``model``), as its set-up methods do."""
    strategy._deepspeed_engine = engine


def configure_fabric_activation_checkpointing(strategy: Any) -> None:
    """Configure DeepSpeed's activation checkpointing from a Fabric DeepSpeed strategy's config, as its
    ``setup_module_and_optimizers`` does."""
    strategy._set_deepspeed_activation_checkpointing()


@functools.cache
def deepspeed_section_parser() -> type:
    """DeepSpeed's config parser class without its checks across sections, to parse one section alone; defined on
    first use (importing DeepSpeed takes seconds)."""
    from deepspeed.runtime.config import DeepSpeedConfig

    class SectionParser(DeepSpeedConfig):
        """DeepSpeed's config parser without the checks across sections (batch sizes against the world size, ZeRO
        stage against precision options): one section alone would fail them."""

        def _configure_train_batch_size(self) -> None:
            pass

        def _do_sanity_check(self) -> None:
            pass

    return SectionParser


_LIGHTNING_DS = "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy"
_FABRIC_DS = "lightning.fabric.strategies.deepspeed.DeepSpeedStrategy"
_CHECKPOINT_WRAPPER = "torch.distributed.algorithms._checkpoint.checkpoint_wrapper"

#: Each function (or name) of this module -> the :data:`RELIED_ON` entries whose fingerprinted source it relies on.
FUNCTIONS: dict[str, tuple[str, ...]] = {
    "CheckpointImpl": (f"{_CHECKPOINT_WRAPPER}.checkpoint_wrapper",),
    "checkpoint_wrapper": (f"{_CHECKPOINT_WRAPPER}.checkpoint_wrapper",),
    "apply_activation_checkpointing": (f"{_CHECKPOINT_WRAPPER}.apply_activation_checkpointing",),
    "SubprocessScriptLauncher": (
        "lightning.pytorch.strategies.launchers.subprocess_script._SubprocessScriptLauncher.launch",
    ),
    "extension_build_directory": ("torch.utils.cpp_extension._get_build_directory",),
    "set_cuda_allocator_settings": ("torch.cuda.memory._set_allocator_settings",),
    "cuda_allocator_settings": ("torch._C._accelerator_getAllocatorSettings",),
    "hand_over_strategy": ("lightning.pytorch.trainer.trainer.Trainer.strategy",),
    "set_backward_sync_control": ("lightning.fabric.strategies.ddp.DDPStrategy.__init__",),
    "BackwardSyncControl": ("lightning.fabric.strategies.strategy._BackwardSyncControl",),
    "torchao_adamw": ("torchao.optim._AdamW",),
    "abstract_tensors": ("torch._subclasses.fake_tensor.FakeTensorMode",),
    "empty_pinned_host_cache": ("torch._C._host_emptyCache",),
    "materialize_meta_module": ("lightning.fabric.utilities.init._materialize_distributed_module",),
    "init_optimizers_and_schedulers": ("lightning.pytorch.core.optimizer._init_optimizers_and_lr_schedulers",),
    "zero3_gradient_hooks": (
        "deepspeed.runtime.zero.stage3.DeepSpeedZeroOptimizer_Stage3.create_reduce_and_remove_grad_hooks",
    ),
    "zero3_consolidated_state_dict": ("deepspeed.runtime.engine.DeepSpeedEngine._zero3_consolidated_16bit_state_dict",),
    "load_universal_checkpoint_next": ("deepspeed.runtime.engine.DeepSpeedEngine.load_universal_checkpoint",),
    "unwrap_lightning_optimizer": ("lightning.pytorch.core.optimizer.LightningOptimizer.__init__",),
    "attached_trainer": ("lightning.pytorch.core.module.LightningModule.trainer",),
    "wait_for_sharded_reductions": (
        "fairscale.nn.data_parallel.sharded_ddp.ShardedDataParallel._consume_work_handles",
    ),
    "sharded_bucket_parameter_ids": (
        "fairscale.nn.data_parallel.sharded_ddp.ShardedDataParallel._setup_bucket_strategy",
    ),
    "track_steps_for_scheduler": ("torch.optim.lr_scheduler.LRScheduler.__init__",),
    "auto_class_model_classes": ("transformers.models.auto.auto_factory._BaseAutoModelClass.from_config",),
    "no_split_module_names": ("transformers.modeling_utils.PreTrainedModel.post_init",),
    "subcommand_parsers": ("jsonargparse._core.ArgumentParser.add_subcommands",),
    "stage_throughputs": ("lightning.pytorch.callbacks.throughput_monitor.ThroughputMonitor.setup",),
    "fit_loop_loader_and_fetcher": ("lightning.pytorch.loops.fit_loop._FitLoop.setup_data",),
    "checkpoint_class_path": ("lightning.pytorch.core.saving._load_state",),
    "scheduler_state_last_lr": ("torch.optim.lr_scheduler.LRScheduler.get_last_lr",),
    "wrap_launcher": ("lightning.pytorch.strategies.ddp.DDPStrategy._configure_launcher",),
    "init_deepspeed_distributed": (
        f"{_LIGHTNING_DS}._init_deepspeed_distributed",
        f"{_FABRIC_DS}._init_deepspeed_distributed",
    ),
    "init_deepspeed_config": (f"{_LIGHTNING_DS}._init_config_if_needed",),
    "auto_micro_batch_size": (f"{_LIGHTNING_DS}._auto_select_batch_size",),
    "lightning_deepspeed_optimizer": (f"{_LIGHTNING_DS}._init_optimizers",),
    "layer_sync": ("lightning.pytorch.strategies.ddp.DDPStrategy.setup",),
    "set_parallel_sizes": (
        "lightning.pytorch.strategies.model_parallel.ModelParallelStrategy.setup_environment",
        "lightning.fabric.strategies.model_parallel.ModelParallelStrategy.setup_environment",
    ),
    "set_fabric_world_ranks": ("lightning.fabric.strategies.ddp.DDPStrategy._set_world_ranks",),
    "fabric_num_nodes": ("lightning.fabric.connector._Connector._lazy_init_strategy",),
    "format_fabric_config_once": (f"{_FABRIC_DS}._setup_distributed",),
    "set_fabric_deepspeed_engine": (f"{_FABRIC_DS}.setup_module_and_optimizers",),
    "configure_fabric_activation_checkpointing": (f"{_FABRIC_DS}._set_deepspeed_activation_checkpointing",),
    "deepspeed_section_parser": (
        "deepspeed.runtime.config.DeepSpeedConfig._configure_train_batch_size",
        "deepspeed.runtime.config.DeepSpeedConfig._do_sanity_check",
    ),
}
