"""Resuming where no backend route carries the optimizer state: the consolidated weights and the loop position.

The checkpoint is read like ``lightning-zero consolidate`` reads it (any backend, stage and world size) into a
Lightning checkpoint dict holding the full fp32 weights and everything Lightning saved next to them: global step,
epoch, loop state, callbacks (:class:`~lightning_zero.checkpoint.resume.ExactResume`'s data position and RNG
states among them) and LR schedulers. Its ``optimizer_states`` is empty, so Lightning restores no optimizer: the
optimizer starts fresh, and one warning says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import nn

from lightning_zero.checkpoint.full_state import read_full_state
from lightning_zero.checkpoint.manifest import Manifest, checkpoint_manifest
from lightning_zero.checkpoint.reshard import why_not_carried
from lightning_zero.checkpoint.validate import DCP_METADATA, DEEPSPEED_TAG_FILE
from lightning_zero.internals import scheduler_state_last_lr

#: Marks a checkpoint dict made by :func:`weights_only_checkpoint` (for ``ExactResume`` to set the learning rates).
WEIGHTS_ONLY_KEY = "lightning_zero_weights_only"


def weights_only_checkpoint(path: Path) -> dict[str, Any]:
    """``path`` as a Lightning checkpoint dict with the full fp32 weights and no optimizer state."""
    state, rest = read_full_state(path, torch.float32)
    return {**rest, "state_dict": state, "optimizer_states": [], WEIGHTS_ONLY_KEY: True}


def scheduled_learning_rates(checkpoint: dict[str, Any]) -> list[list[float]] | None:
    """Each LR scheduler's last learning rates in a weights-only checkpoint dict, ``None`` in any other.

    A fresh optimizer starts at its initial learning rates, and restoring a scheduler's state does not set them
    (its next step scales the optimizer's current ones): they are set from these."""
    if not checkpoint.get(WEIGHTS_ONLY_KEY):
        return None
    return [scheduler_state_last_lr(state) for state in checkpoint.get("lr_schedulers", [])]


def set_learning_rates(schedulers: list[Any], learning_rates: list[list[float]]) -> None:
    """Set each scheduler's optimizer's param-group learning rates to ``learning_rates``."""
    for scheduler, rates in zip(schedulers, learning_rates, strict=False):
        for group, rate in zip(scheduler.optimizer.param_groups, rates, strict=False):
            group["lr"] = rate


def warn_optimizer_not_carried(path: Path, manifest: Manifest | None, here: str, why: str) -> None:
    """The one warning of a weights-only resume: what was carried, what was not, and why."""
    written = describe_manifest(manifest)
    rank_zero_warn(
        f"Resuming '{path}' (written by {written}) under {here} without its optimizer state: {why}. Carried: the"
        " weights, global step, epoch, data position, RNG states and LR schedulers (with ExactResume, which also"
        " sets the scheduled learning rates); the optimizer starts from"
        " empty state (Adam moments and step counts), so the first steps differ from the run that wrote it."
    )


def say_optimizer_carried(path: Path, manifest: Manifest | None, here: str, universal: Path) -> None:
    """The one line of a resume that carries the optimizer state through the universal form ``universal``."""
    rank_zero_info(
        f"Resuming '{path}' (written by {describe_manifest(manifest)}) under {here} with its optimizer state, through"
        f" its universal form '{universal}' (converted once; later resumes reuse it)."
    )


def describe_manifest(manifest: Manifest | None) -> str:
    """What wrote a checkpoint, in words (``unknown`` without a manifest)."""
    return "unknown" if manifest is None else describe(manifest.backend, manifest.stage, manifest.world_size)


def describe(backend: str, stage: int, world_size: int) -> str:
    """``deepspeed ZeRO-2 on 2 processes`` (``onecard on 1 process``: no stage 0 named)."""
    stage_name = "" if stage == 0 else f" ZeRO-{stage}"
    return f"{backend}{stage_name} on {world_size} process{'es' if world_size != 1 else ''}"


def load_into_deepspeed(module: nn.Module, engine: Any, state: dict[str, torch.Tensor], stage: int) -> None:
    """Write ``state`` into a set-up DeepSpeed engine's parameters (gathered one at a time under ZeRO-3), then into
    its optimizer's fp32 master copy."""
    import deepspeed

    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        if name not in state:
            continue
        if stage == 3 and hasattr(tensor, "ds_id"):
            with deepspeed.zero.GatheredParameters([tensor], modifier_rank=0), torch.no_grad():
                tensor.copy_(state[name])
        else:
            with torch.no_grad():
                tensor.copy_(state[name])
    engine.optimizer.refresh_fp32_params()


def load_into_fsdp2(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Write the full ``state`` into an FSDP2 module's sharded parameters (each rank keeps its own shard)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    full: dict[str, Any] = dict(state)
    set_model_state_dict(module, full, options=StateDictOptions(full_state_dict=True))


class ShardedCheckpointFallback(CheckpointIO):
    """Lets a plain Lightning strategy (``ddp``...) resume from a lightning-zero checkpoint directory (DeepSpeed,
    FSDP2 sharded) weights-only; every other path goes to the strategy's own ``CheckpointIO``."""

    def __init__(self, inner: CheckpointIO) -> None:
        self.inner = inner

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        path = Path(path)
        if not is_checkpoint_directory(path):
            return self.inner.load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        return weights_only_of_another_backend(path, "ddp", 0)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)

    def remove_checkpoint(self, path: Any) -> None:
        self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        self.inner.teardown()


def weights_only_of_another_backend(path: Path, backend: str, stage: int) -> dict[str, Any]:
    """:func:`weights_only_checkpoint` of ``path`` for a strategy of ``backend`` and ``stage`` that has no route for
    its optimizer state, with the one warning saying so."""
    manifest = checkpoint_manifest(path)
    here = describe(backend, stage, torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1)
    why = why_not_carried(manifest, "a plain Lightning strategy" if backend == "ddp" else backend)
    checkpoint = weights_only_checkpoint(path)
    warn_optimizer_not_carried(path, manifest, here, why)
    return checkpoint


def is_checkpoint_directory(path: Path) -> bool:
    """A sharded checkpoint directory (DeepSpeed's or ``torch.distributed.checkpoint``'s)."""
    return path.is_dir() and ((path / DEEPSPEED_TAG_FILE).is_file() or (path / DCP_METADATA).is_file())
