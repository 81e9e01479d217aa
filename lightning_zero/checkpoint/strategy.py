"""What the lightning-zero strategies add to their backend's checkpointing: atomic saves with a manifest,
pruning that removes sharded directories and links, and loads checked first (see ``atomic`` and ``validate``)."""

from __future__ import annotations

from functools import partial
from typing import Any

from lightning_zero.checkpoint.atomic import remove_checkpoint, save_atomically
from lightning_zero.checkpoint.validate import check_checkpoint


class SafeCheckpoints:
    """Mixin placed before a Lightning strategy class; the strategy says its backend and stage."""

    def checkpoint_identity(self) -> tuple[str, int]:
        """``(backend, ZeRO stage)`` recorded in the manifest."""
        raise NotImplementedError

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        backend, stage = self.checkpoint_identity()
        write = partial(super().save_checkpoint, storage_options=storage_options)  # type: ignore[misc]
        save_atomically(self, checkpoint, filepath, write, backend, stage)  # type: ignore[arg-type]

    def remove_checkpoint(self, filepath: Any) -> None:
        remove_checkpoint(self, filepath)  # type: ignore[arg-type]

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        check_checkpoint(checkpoint_path, self.lightning_module)  # type: ignore[attr-defined]
        return super().load_checkpoint(checkpoint_path, weights_only)  # type: ignore[misc, no-any-return]
