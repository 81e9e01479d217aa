"""Every private part of Lightning, DeepSpeed, FairScale and torch that lightning-zero relies on, in one place.

None has a public route in the versions pinned by constraints.txt. Modules import the private functions from here,
under public names; :data:`RELIED_ON` also lists the private methods and attributes the strategies override, copy
or read, each with why and the upstream issue that would end the need. ``tests/test_internals.py`` fingerprints the
source of every entry, so an upgrade that changes one fails CI instead of a user's run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
    "RELIED_ON",
    "CheckpointImpl",
    "SubprocessScriptLauncher",
    "abstract_tensors",
    "apply_activation_checkpointing",
    "checkpoint_wrapper",
    "empty_pinned_host_cache",
    "extension_build_directory",
    "init_optimizers_and_schedulers",
    "materialize_meta_module",
    "set_cuda_allocator_settings",
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
    "torch._C._host_emptyCache": (
        "zero_auto gives a trial's page-locked host blocks back on torch builds without the public "
        "torch.accelerator.empty_host_cache (torch 2.11 on the GPU machines; CUDA builds only)"
    ),
    "torch.nn.Module._apply": (
        "tasks keep metric states in their dtype under Module.to(dtype) (TaskModule._apply; Lightning's own "
        "_DeviceDtypeModuleMixin overrides it the same way)"
    ),
    # Lightning
    "lightning.fabric.utilities.init._materialize_distributed_module": (
        "FSDP2 meta-device initialisation after sharding, as ModelParallelStrategy does (its TODO: a public "
        "Fabric.materialize)"
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
        "installs that launcher for ZeroStrategy (DeepSpeedStrategy inherits it from DDPStrategy)"
    ),
    "lightning.pytorch.strategies.ddp.DDPStrategy.setup": (
        "copied by FairScaleStrategy.setup: ShardedDataParallel needs the optimizers before the model is wrapped"
    ),
    "lightning.pytorch.strategies.model_parallel.ModelParallelStrategy.setup": (
        "copied by FSDP2Strategy.setup: sharding in the strategy, not in the user's configure_model"
    ),
    "lightning.pytorch.strategies.model_parallel.ModelParallelStrategy._get_process_group_backend": (
        "gloo beside NCCL when FSDP2 offloads to CPU: its gradients' collectives run there (no public hook)"
    ),
    "lightning.pytorch.loops.fit_loop._FitLoop.setup_data": (
        "ExactResume reads _combined_loader and _data_fetcher to continue mid-epoch with a plain DataLoader "
        "(Lightning resumes mid-epoch only for stateful loaders: Lightning-AI/pytorch-lightning#19764)"
    ),
    # FairScale
    "fairscale.nn.data_parallel.sharded_ddp.ShardedDataParallel._consume_work_handles": (
        "waits for SDP's reduce work before Lightning's optimizer step (FairScale is archived: no fix upstream)"
    ),
    "fairscale.nn.data_parallel.sharded_ddp.ShardedDataParallel._setup_bucket_strategy": (
        "zero_grad through SDP's gradient buckets (_bucket_list, _param_ids) keeps them intact; archived upstream"
    ),
}


def extension_build_directory(name: str) -> Path:
    """The folder torch builds (and locks) the C++ extension ``name`` in."""
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(name, verbose=False))


def set_cuda_allocator_settings(settings: str) -> None:
    """Change the CUDA caching allocator's settings (``PYTORCH_CUDA_ALLOC_CONF`` syntax) in a running process."""
    import torch.cuda.memory

    torch.cuda.memory._set_allocator_settings(settings)


@contextlib.contextmanager
def abstract_tensors() -> Iterator[None]:
    """Inside, new tensors (a model built, its forward run) have shapes, dtypes and storages but no memory and no
    values; real tensors passed in become such tensors. An operation whose output shape depends on values raises a
    ``RuntimeError``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        yield


def empty_pinned_host_cache() -> None:
    """Return the page-locked host blocks that torch's host allocator keeps cached to the system."""
    import torch

    if hasattr(torch.accelerator, "empty_host_cache"):
        torch.accelerator.empty_host_cache()
    else:
        torch._C._host_emptyCache()


materialize_meta_module: Callable[[nn.Module, Any], None] = _materialize_distributed_module
SubprocessScriptLauncher = _SubprocessScriptLauncher
init_optimizers_and_schedulers = _init_optimizers_and_lr_schedulers
