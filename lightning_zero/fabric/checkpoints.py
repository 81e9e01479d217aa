"""``fabric.save`` and ``fabric.load`` in the Trainer strategies' checkpoint format.

A DeepSpeed checkpoint is the same directory under Fabric and the Trainer: DeepSpeed's engine files (model and
optimizer partitions, the rest of the state as DeepSpeed's client state) and ``manifest.json``, written atomically
(:func:`~lightning_zero.checkpoint.atomic.save_module_atomically`), checked before loading
(:func:`~lightning_zero.checkpoint.validate.check_checkpoint`), and resumed at another stage or world size through
its universal form, or from its weights alone, by the routes of :mod:`lightning_zero.checkpoint.reshard`. The
Trainer's extra state (``loops``...) comes back to Fabric in the dict ``fabric.load`` returns; LR schedulers go
both ways, under the Trainer's ``lr_schedulers`` (:mod:`lightning_zero.fabric.trainer_format`); a Fabric
checkpoint carries ``global_step`` and ``epoch`` to the manifest when the state has them. The Trainer resumes a
Fabric checkpoint with its weights and optimizer state, its loop counters at 0 (a Fabric loop has no Trainer loop
state to give).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch.nn import Module

from lightning_zero.checkpoint.atomic import save_module_atomically
from lightning_zero.checkpoint.manifest import checkpoint_manifest
from lightning_zero.checkpoint.reshard import (
    UNIVERSAL,
    WEIGHTS_ONLY,
    choose_route,
    repair_universal_load,
    universal_form,
)
from lightning_zero.checkpoint.validate import check_checkpoint
from lightning_zero.checkpoint.weights_only import (
    describe,
    load_into_deepspeed,
    say_optimizer_carried,
    warn_optimizer_not_carried,
    weights_only_checkpoint,
)
from lightning_zero.errors import ZeroConfigError
from lightning_zero.fabric.trainer_format import OPTIMIZERS, restore_entries, with_trainer_keys
from lightning_zero.internals import load_universal_checkpoint_next

if TYPE_CHECKING:
    from lightning_zero.fabric.deepspeed import FabricZeroStrategy


def deepspeed_engine(state: dict[str, Any]) -> Any:
    """The one DeepSpeed engine among the state's values (a Fabric-wrapped model holds it)."""
    from deepspeed import DeepSpeedEngine

    engines = {
        id(module): module
        for value in state.values()
        if isinstance(value, Module)
        for module in value.modules()
        if isinstance(module, DeepSpeedEngine)
    }
    if len(engines) != 1:
        raise ZeroConfigError(
            f"A DeepSpeed checkpoint holds one model set up by `fabric.setup`, but the state has {len(engines)}:"
            " pass it as `{'model': model, 'optimizer': optimizer, ...}`."
        )
    return next(iter(engines.values()))


def save(
    strategy: FabricZeroStrategy,
    path: Any,
    state: dict[str, Any],
    write: Callable[[dict[str, Any], Path], None],
) -> None:
    """Write ``state`` with ``write(state, temporary_path)`` (Fabric's DeepSpeed save), atomically, with the
    manifest; collective."""
    engine = deepspeed_engine(state)
    state = with_trainer_keys(state)
    precision = str(strategy.precision.precision)
    save_module_atomically(strategy, engine.module, precision, state, path, write, "deepspeed", strategy.zero.stage)


def load(
    strategy: FabricZeroStrategy,
    path: Path,
    state: dict[str, Any],
    read: Callable[[Path], dict[str, Any]],
    strict: bool,
) -> dict[str, Any]:
    """Restore ``state`` from ``path`` with ``read(directory)`` (Fabric's DeepSpeed load) on the route the manifest
    allows; returns what was not restored into ``state``."""
    engine = deepspeed_engine(state)
    check_checkpoint(path, engine.module)
    stage = strategy.zero.stage
    manifest = checkpoint_manifest(path)
    swaps_to_nvme = engine.zero_nvme_offload_optimizer
    route = choose_route(path, manifest, "deepspeed", stage, strategy.world_size, lambda: bool(swaps_to_nvme()))
    here = describe("deepspeed", stage, strategy.world_size)
    if route.name == WEIGHTS_ONLY:
        checkpoint = weights_only_checkpoint(path)
        load_into_deepspeed(engine.module, engine, checkpoint.pop("state_dict"), stage)
        warn_optimizer_not_carried(path, manifest, here, route.why)
        del checkpoint[OPTIMIZERS]  # none: the optimizer starts afresh
        # restore_entries skips the model (a Module) and torch optimizers; DeepSpeed's ZeRO optimizer is neither.
        entries = {key: value for key, value in state.items() if value is not engine.optimizer}
        rest = restore_entries(checkpoint, entries, strict)
        state.update(entries)
        return rest
    if route.name != UNIVERSAL:
        return read(path)
    universal = universal_form(path, strategy.is_global_zero, strategy.barrier)
    say_optimizer_carried(path, manifest, here, universal)
    load_universal_checkpoint_next(engine)
    checkpoint = read(universal)
    repair_universal_load(engine.optimizer.optimizer, universal, stage)
    return checkpoint
