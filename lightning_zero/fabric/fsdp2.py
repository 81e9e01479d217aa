"""ZeRO-2/3 through PyTorch FSDP2 (``fully_shard``) under Lightning Fabric, on CPU (gloo) and CUDA GPUs (nccl).

A thin layer over Fabric's ``ModelParallelStrategy`` whose ``parallelize_fn`` is the Trainer strategy's sharding
(:func:`~lightning_zero.strategies.fsdp2.shard_module` with :func:`~lightning_zero.strategies.fsdp2_config.
fully_shard_options`), on a pure data-parallel mesh. ``fabric.setup(model, optimizer)`` works as with DDP: the
optimizer, made before sharding, is pointed at the sharded parameters by name (Fabric's own strategy leaves it on
the replaced ones, which then never train).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.strategies import ModelParallelStrategy
from lightning.fabric.utilities import rank_zero_info
from lightning.fabric.wrappers import is_wrapped
from torch import nn
from torch.optim import Optimizer

from lightning_zero.checkpoint.atomic import save_module_atomically
from lightning_zero.checkpoint.manifest import checkpoint_manifest
from lightning_zero.checkpoint.reshard import NATIVE, WEIGHTS_ONLY, choose_route, universal_form
from lightning_zero.checkpoint.validate import check_checkpoint
from lightning_zero.checkpoint.weights_only import (
    describe,
    load_into_fsdp2,
    say_optimizer_carried,
    warn_optimizer_not_carried,
    weights_only_checkpoint,
)
from lightning_zero.errors import ZeroConfigError
from lightning_zero.fabric.trainer_format import (
    OPTIMIZERS,
    WEIGHTS,
    load_with_schedulers,
    optimizers_of,
    plain,
    restore_entries,
    saved_optimizer_states,
    sharded_keys,
    the_module,
    with_trainer_keys,
)
from lightning_zero.fabric.watched import FabricWatchedRanks
from lightning_zero.internals import set_parallel_sizes
from lightning_zero.memory.budget import apply_memory_budget, lift_memory_budget
from lightning_zero.runtime.blocks import prepare_blocks
from lightning_zero.strategies.fsdp2 import load_universal_into_fsdp2, shard_module
from lightning_zero.strategies.fsdp2_config import FSDP2ZeroConfig, fully_shard_options

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


class FabricFSDP2Strategy(FabricWatchedRanks, ModelParallelStrategy):
    """ZeRO stage 2 or 3, optionally with CPU offload, through FSDP2, for ``Fabric(strategy=...)``.

    Args:
        zero: The ZeRO settings (a :class:`FSDP2ZeroConfig` or a mapping of its fields), as for the Trainer.
        process_group_backend: ``"nccl"`` on GPUs and ``"gloo"`` on CPU unless given.
        timeout: Collective-operation timeout.
    """

    #: The registered name that builds this class with its defaults (stage 3).
    strategy_name = "zero3_fsdp"
    zero_backend = "fsdp2"

    def __init__(
        self,
        zero: FSDP2ZeroConfig | dict[str, Any] | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
    ) -> None:
        self.zero = FSDP2ZeroConfig.coerce(zero)
        super().__init__(
            parallelize_fn=self._parallelize,
            save_distributed_checkpoint=self.zero.checkpoint_format == "sharded",
            process_group_backend=process_group_backend,
            timeout=timeout,
        )

    @property
    def precision_plugin(self) -> Any:
        """Fabric's precision plugin, under the Trainer's name the memory budget reads."""
        return self.precision

    @property
    def model(self) -> nn.Module | None:
        """``None``: Fabric's strategy holds no model (each call is given it, the memory budget too)."""
        return None

    def setup_environment(self) -> None:
        # Every process is one data-parallel shard (Fabric's default puts them on a tensor-parallel axis).
        set_parallel_sizes(self, data_parallel=self.num_nodes * self.num_processes, tensor_parallel=1)
        super().setup_environment()

    def _parallelize(self, module: nn.Module, mesh: DeviceMesh) -> nn.Module:
        apply_memory_budget(self, self.zero_backend, module)
        prepare_blocks(module, self.zero.activation_checkpointing, self.zero.compile_blocks)
        precision = str(self.precision.precision)

        def options(root: bool) -> dict[str, Any]:
            return fully_shard_options(self.zero, precision, self.root_device.type, root=root)

        count = shard_module(module, mesh["data_parallel"], options)
        rank_zero_info(f"FSDP2 stage {self.zero.stage}: {count} modules sharded.")
        return module

    def setup_module_and_optimizers(
        self, module: nn.Module, optimizers: list[Optimizer], scheduler: Any = None
    ) -> tuple[nn.Module, list[Optimizer], Any]:
        """Shard ``module``, then point each optimizer (made before sharding, no steps taken) at its sharded
        parameters, by name."""
        names = {id(parameter): name for name, parameter in module.named_parameters()}
        for optimizer in optimizers:
            if optimizer.state:
                raise ZeroConfigError(
                    "FSDP2 shards the model's parameters: set up the model and optimizer before the first step."
                )
        module = self.setup_module(module)
        sharded = dict(module.named_parameters())
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["params"] = [sharded[names[id(parameter)]] for parameter in group["params"]]
        return module, optimizers, scheduler

    def save_checkpoint(
        self, path: Any, state: dict[str, Any], storage_options: Any = None, filter: Any = None
    ) -> None:
        """The Trainer's FSDP2 checkpoint (its names for the model, optimizers and LR schedulers), written atomically
        with a manifest."""
        module = _unwrapped(the_module(state)[1])
        precision = str(self.precision.precision)
        checkpoint = with_trainer_keys(sharded_keys(state))

        def write(checkpoint: dict[str, Any], partial: Path) -> None:
            if self.zero.checkpoint_format == "full":
                _save_full(checkpoint, partial, self.is_global_zero)
            else:
                super(FabricFSDP2Strategy, self).save_checkpoint(partial, checkpoint, storage_options, filter)

        save_module_atomically(self, module, precision, checkpoint, path, write, self.zero_backend, self.zero.stage)

    def load_checkpoint(
        self, path: Any, state: Any = None, strict: bool = True, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """A checkpoint written by Fabric or the Trainer, checked first, on the Trainer's FSDP2 strategy's route: one
        of FSDP2 at any size or stage as it is (DCP re-shards it), one of DeepSpeed or FairScale with its optimizer
        state through its universal form, or its weights alone, with one warning saying why; LR schedulers in
        ``state`` from the checkpoint's ``lr_schedulers``."""
        if not isinstance(state, dict) or not state:
            return super().load_checkpoint(path, state, strict, weights_only)  # Fabric's own errors and raw loads
        where = Path(self.broadcast(str(path)))
        module = _unwrapped(the_module(state)[1])
        check_checkpoint(where, module)
        manifest = checkpoint_manifest(where)
        route = choose_route(where, manifest, self.zero_backend, self.zero.stage, self.world_size, lambda: False)

        def load(others: dict[str, Any]) -> dict[str, Any]:
            if route.name == NATIVE:
                return self._load_native(where, others, strict, weights_only)
            here = describe(self.zero_backend, self.zero.stage, self.world_size)
            if route.name == WEIGHTS_ONLY:
                checkpoint = weights_only_checkpoint(where)
                load_into_fsdp2(module, checkpoint[WEIGHTS])
                warn_optimizer_not_carried(where, manifest, here, route.why)
            else:
                universal = universal_form(where, self.is_global_zero, self.barrier)
                say_optimizer_carried(where, manifest, here, universal)
                checkpoint = load_universal_into_fsdp2(where, universal, module, _the_optimizer(others, strict))
            del checkpoint[WEIGHTS], checkpoint[OPTIMIZERS]
            return restore_entries(checkpoint, others, strict)

        return load_with_schedulers(state, strict, load)

    def _load_native(
        self, where: Path, state: dict[str, Any], strict: bool, weights_only: bool | None
    ) -> dict[str, Any]:
        """An FSDP2 checkpoint: one file, or a DCP directory (Fabric's load, under the Trainer's names)."""
        if where.is_file():
            return _load_full(where, state, strict, weights_only)
        renamed = sharded_keys(state)
        rest = super().load_checkpoint(where, renamed, strict, weights_only)
        state.update({key: renamed[key] for key in state if key in renamed})
        return rest

    def full_state_dict(self, model: nn.Module) -> dict[str, Any]:
        """The whole state dict of ``model`` (as ``fabric.setup`` returned it) on global rank 0, gathered from every
        shard, ``{}`` elsewhere; collective."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        module = _unwrapped(model)
        state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return state if self.is_global_zero else {}

    def teardown(self) -> None:
        lift_memory_budget(self)
        super().teardown()


def _save_full(checkpoint: dict[str, Any], path: Path, is_global_zero: bool) -> None:
    """The Trainer's one-file FSDP2 checkpoint of a :func:`sharded_keys` state: the full model state dict, each
    optimizer's full state keyed by parameter position under ``optimizer_states`` (as the Trainer's strategy keys
    it), on rank 0; collective."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
    from torch.distributed.fsdp import FullyShardedDataParallel, OptimStateKeyType

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    module = checkpoint.pop(WEIGHTS)
    optimizers = [checkpoint.pop(key) for key, _ in optimizers_of(checkpoint)]
    weights = get_model_state_dict(module, options=options)
    states = [get_optimizer_state_dict(module, optimizer, options=options) for optimizer in optimizers]
    if not is_global_zero:
        return
    by_position = [
        FullyShardedDataParallel.rekey_optim_state_dict(state, OptimStateKeyType.PARAM_ID, module) for state in states
    ]
    torch.save({**plain(checkpoint), WEIGHTS: weights, OPTIMIZERS: by_position}, path)


def _load_full(path: Path, state: dict[str, Any], strict: bool, weights_only: bool | None) -> dict[str, Any]:
    """A one-file FSDP2 checkpoint of the Trainer's (or :func:`_save_full`'s) into ``state``'s model and optimizers,
    sharded as they are; returns what was not restored."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict
    from torch.distributed.fsdp import FullyShardedDataParallel, OptimStateKeyType

    module = _unwrapped(the_module(state)[1])
    options = StateDictOptions(full_state_dict=True, strict=strict)
    checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=weights_only)
    set_model_state_dict(module, checkpoint.pop(WEIGHTS), options=options)
    for optimizer, by_position in saved_optimizer_states(checkpoint, optimizers_of(state), strict):
        by_name = FullyShardedDataParallel.rekey_optim_state_dict(by_position, OptimStateKeyType.PARAM_NAME, module)
        set_optimizer_state_dict(module, optimizer, optim_state_dict=by_name, options=options)
    return restore_entries(checkpoint, state, strict)


def _the_optimizer(state: dict[str, Any], strict: bool) -> Optimizer | None:
    """The one optimizer of ``state`` that a universal checkpoint's optimizer state loads into (``None``: the state
    asks for none)."""
    optimizers = [optimizer for _, optimizer in optimizers_of(state)]
    if len(optimizers) > 1 and strict:
        raise ZeroConfigError(
            f"A checkpoint of another backend holds one optimizer state, the state passes {len(optimizers)}"
            " optimizers: pass the one it was saved with, or `strict=False` (the first gets it)."
        )
    return optimizers[0] if optimizers else None


def _unwrapped(model: nn.Module) -> nn.Module:
    """The user's module of a model ``fabric.setup`` returned (any other module as it is)."""
    module = model.module if is_wrapped(model) else model
    assert isinstance(module, nn.Module)
    return module
