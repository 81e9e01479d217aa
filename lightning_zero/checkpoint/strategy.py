"""What the lightning-zero strategies add to their backend's checkpointing: atomic saves with a manifest,
pruning that removes sharded directories and links, loads checked first, and resuming at another world size
(see ``atomic``, ``validate`` and ``reshard``)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning.pytorch.utilities import rank_zero_info

from lightning_zero.checkpoint.atomic import remove_checkpoint, save_atomically
from lightning_zero.checkpoint.by_name import (
    PARAMETER_NAMES_KEY,
    load_into_torch_optimizer,
    parameter_names,
    read_universal,
    records_parameter_names,
)
from lightning_zero.checkpoint.manifest import Manifest, checkpoint_manifest
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
    WEIGHTS_ONLY_KEY,
    describe,
    describe_manifest,
    load_into_fsdp2,
    warn_optimizer_not_carried,
    weights_only_checkpoint,
)
from lightning_zero.internals import load_universal_checkpoint_next

if TYPE_CHECKING:  # what the mixin is placed before: typed as such, a plain class at run time
    from lightning.pytorch.strategies import ParallelStrategy as _Strategy
    from torch import nn

    from lightning_zero.sharding import ZeroSettings
else:
    _Strategy = object


class SafeCheckpoints(_Strategy):
    """Mixin placed before a Lightning strategy class; the strategy is a
    :class:`~lightning_zero.sharding.ShardedStrategy`, which says its backend, its stage and how consolidated
    weights load into it."""

    if TYPE_CHECKING:
        deepspeed_engine: Any  # the DeepSpeed strategy's, used on its routes only
        zero_backend: str

        @property
        def zero(self) -> ZeroSettings: ...

        def load_consolidated_weights(self, module: nn.Module, state_dict: dict[str, Any]) -> None: ...

    def checkpoint_identity(self) -> tuple[str, int]:
        """``(backend, ZeRO stage)`` recorded in the manifest."""
        return self.zero_backend, self.zero.stage

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        backend, stage = self.checkpoint_identity()
        if backend == "fairscale":  # its optimizer state is keyed by position: the names make it portable
            assert self.lightning_module is not None, "a set-up strategy saves"
            checkpoint[PARAMETER_NAMES_KEY] = parameter_names(self.lightning_module, self.optimizers[0])
        write = partial(super().save_checkpoint, storage_options=storage_options)
        save_atomically(self, checkpoint, filepath, write, backend, stage)

    def remove_checkpoint(self, filepath: Any) -> None:
        remove_checkpoint(self, filepath)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        path = Path(self.broadcast(str(checkpoint_path)))
        check_checkpoint(path, self.lightning_module)
        backend, stage = self.checkpoint_identity()
        manifest = checkpoint_manifest(path)
        by_name = path.is_dir() or records_parameter_names(path)
        route = resume_route(manifest, backend, stage, self.world_size, by_name=by_name)
        if route == WEIGHTS_ONLY:
            return self._weights_only(path, manifest, why_not_carried(manifest, backend))
        if route == UNIVERSAL and (has_nvme_optimizer_state(path) or self._swaps_optimizer_to_nvme()):
            return self._weights_only(path, manifest, NVME_NOT_CARRIED)
        if route != UNIVERSAL:
            return super().load_checkpoint(path, weights_only)
        universal = self._universal(path)
        rank_zero_info(
            f"Resuming '{path}' (written by {describe_manifest(manifest)}) under"
            f" {describe(backend, stage, self.world_size)} with its optimizer state, through its universal form"
            f" '{universal}' (converted once; later resumes reuse it)."
        )
        if backend == "fsdp2":
            return self._load_by_name(path, universal)
        # Lightning builds the engine before it loads, so `checkpoint.load_universal` is switched on here.
        load_universal_checkpoint_next(self.deepspeed_engine)
        checkpoint = super().load_checkpoint(universal, weights_only)
        repair_universal_load(self.deepspeed_engine.optimizer.optimizer, universal, stage)
        return checkpoint

    def _swaps_optimizer_to_nvme(self) -> bool:
        backend, _ = self.checkpoint_identity()
        return backend == "deepspeed" and bool(self.deepspeed_engine.zero_nvme_offload_optimizer())

    def _weights_only(self, path: Path, manifest: Manifest | None, why: str) -> dict[str, Any]:
        """Load the consolidated weights into this strategy's model; Lightning restores the rest of the dict."""
        backend, stage = self.checkpoint_identity()
        checkpoint = weights_only_checkpoint(path)
        module = self.lightning_module
        assert module is not None, "a checkpoint loads into a set-up strategy"
        self.load_consolidated_weights(module, checkpoint["state_dict"])
        here = describe(backend, stage, self.world_size)
        warn_optimizer_not_carried(path, manifest, here, why)
        return checkpoint

    def _universal(self, path: Path) -> Path:
        """Convert on rank 0 (once: a later resume finds it), then every rank reads the universal form."""
        if self.is_global_zero:
            universal_checkpoint(path)
        self.barrier()
        return path.with_name(path.name + UNIVERSAL_SUFFIX)

    def _load_by_name(self, path: Path, universal: Path) -> dict[str, Any]:
        """A DeepSpeed or FairScale checkpoint into FSDP2: the fp32 master weights into the model, then the optimizer
        state by parameter name; Lightning restores the rest of the dict."""
        checkpoint = weights_only_checkpoint(path)
        del checkpoint[WEIGHTS_ONLY_KEY]  # the optimizer, its learning rates included, is carried
        module = self.lightning_module
        assert module is not None, "a checkpoint loads into a set-up strategy"
        load_into_fsdp2(module, checkpoint["state_dict"])
        load_into_torch_optimizer(module, self.optimizers[0], read_universal(universal))
        return checkpoint
