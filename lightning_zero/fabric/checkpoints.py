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

from lightning.fabric.utilities import rank_zero_info
from torch.nn import Module

from lightning_zero.checkpoint.atomic import save_module_atomically
from lightning_zero.checkpoint.manifest import checkpoint_manifest
from lightning_zero.checkpoint.reshard import (
    NVME_NOT_CARRIED,
    UNIVERSAL,
    UNIVERSAL_SUFFIX,
    WEIGHTS_ONLY,
    has_nvme_optimizer_state,
    repair_universal_load,
    resume_route,
    universal_checkpoint,
    why_not_carried,
)
from lightning_zero.checkpoint.validate import check_checkpoint
from lightning_zero.checkpoint.weights_only import (
    describe,
    describe_manifest,
    load_into_deepspeed,
    warn_optimizer_not_carried,
    weights_only_checkpoint,
)
from lightning_zero.errors import ZeroConfigError
from lightning_zero.fabric.trainer_format import with_trainer_keys
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
) -> dict[str, Any]:
    """Restore ``state`` from ``path`` with ``read(directory)`` (Fabric's DeepSpeed load) on the route the manifest
    allows; returns what was not restored into ``state``."""
    engine = deepspeed_engine(state)
    check_checkpoint(path, engine.module)
    stage = strategy.zero.stage
    manifest = checkpoint_manifest(path)
    route = resume_route(manifest, "deepspeed", stage, strategy.world_size, by_name=True)
    if route == UNIVERSAL and (has_nvme_optimizer_state(path) or engine.zero_nvme_offload_optimizer()):
        route, why = WEIGHTS_ONLY, NVME_NOT_CARRIED
    else:
        why = why_not_carried(manifest, "deepspeed")
    here = describe("deepspeed", stage, strategy.world_size)
    if route == WEIGHTS_ONLY:
        checkpoint = weights_only_checkpoint(path)
        load_into_deepspeed(engine.module, engine, checkpoint.pop("state_dict"), stage)
        warn_optimizer_not_carried(path, manifest, here, why)
        return checkpoint
    if route != UNIVERSAL:
        return read(path)
    if strategy.is_global_zero:
        universal_checkpoint(path)  # converted once: a later resume finds it
    strategy.barrier()
    universal = path.with_name(path.name + UNIVERSAL_SUFFIX)
    rank_zero_info(
        f"Resuming '{path}' (written by {describe_manifest(manifest)}) under {here} with its optimizer state,"
        f" through its universal form '{universal}'."
    )
    load_universal_checkpoint_next(engine)
    checkpoint = read(universal)
    repair_universal_load(engine.optimizer.optimizer, universal, stage)
    return checkpoint
