"""What the lightning-zero strategies add to their backend's checkpointing: atomic saves with a manifest,
pruning that removes sharded directories and links, loads checked first, and resuming at another world size
(see ``atomic``, ``validate`` and ``reshard``)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_zero.checkpoint.atomic import remove_checkpoint, save_atomically
from lightning_zero.checkpoint.manifest import Manifest, checkpoint_manifest
from lightning_zero.checkpoint.reshard import UNIVERSAL, WEIGHTS_ONLY, choose_route, universal_form
from lightning_zero.checkpoint.validate import check_checkpoint
from lightning_zero.checkpoint.weights_only import (
    describe,
    say_optimizer_carried,
    warn_optimizer_not_carried,
    weights_only_checkpoint,
)
from lightning_zero.errors import ZeroConfigError

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
        zero_backend: str

        @property
        def zero(self) -> ZeroSettings: ...

        def load_consolidated_weights(self, module: nn.Module, state_dict: dict[str, Any]) -> None: ...

    def checkpoint_identity(self) -> tuple[str, int]:
        """``(backend, ZeRO stage)`` recorded in the manifest."""
        return self.zero_backend, self.zero.stage

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        backend, stage = self.checkpoint_identity()
        self.add_checkpoint_entries(checkpoint)
        write = partial(super().save_checkpoint, storage_options=storage_options)
        save_atomically(self, checkpoint, filepath, write, backend, stage)

    def remove_checkpoint(self, filepath: Any) -> None:
        remove_checkpoint(self, filepath)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        path = Path(self.broadcast(str(checkpoint_path)))
        check_checkpoint(path, self.lightning_module)
        backend, stage = self.checkpoint_identity()
        manifest = checkpoint_manifest(path)
        route = choose_route(path, manifest, backend, stage, self.world_size, self.swaps_optimizer_to_nvme)
        if route.name == WEIGHTS_ONLY:
            return self._weights_only(path, manifest, route.why)
        if route.name != UNIVERSAL:
            return super().load_checkpoint(path, weights_only)
        universal = universal_form(path, self.is_global_zero, self.barrier)
        say_optimizer_carried(path, manifest, describe(backend, stage, self.world_size), universal)
        return self.load_universal(path, universal, weights_only)

    def add_checkpoint_entries(self, checkpoint: dict[str, Any]) -> None:
        """Nothing by default: a backend whose files do not say which parameter each entry belongs to adds it."""

    def swaps_optimizer_to_nvme(self) -> bool:
        return False

    def load_universal(self, path: Path, universal: Path, weights_only: bool | None) -> dict[str, Any]:
        backend, stage = self.checkpoint_identity()
        raise ZeroConfigError(
            f"{describe(backend, stage, self.world_size)} cannot resume '{path}' through a universal checkpoint:"
            " resume it under a DeepSpeed or FSDP2 preset."
        )

    def backend_load_checkpoint(self, path: Path, weights_only: bool | None) -> dict[str, Any]:
        """The backend's own load (Lightning's strategy), without the checks and routes above."""
        loaded: dict[str, Any] = super().load_checkpoint(path, weights_only)
        return loaded

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
