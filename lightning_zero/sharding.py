"""What the layers below the strategies need of a lightning-zero strategy, as one :class:`typing.Protocol`.

The memory budget (``memory.budget``) and the checkpoints (``checkpoint.strategy.SafeCheckpoints``) take a
:class:`ShardedStrategy` and ask it, never a backend's name, what to do; the strategies in ``strategies`` are
ones, their shared set-up written once in ``strategies.shared.ShardedSetup``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pathlib import Path

    import torch
    from torch import nn


class ZeroSettings(Protocol):
    """The ZeRO settings every backend's config has (``strategies.config.ZeroConfig``)."""

    @property
    def stage(self) -> int: ...

    @property
    def offload_optimizer(self) -> str: ...

    @property
    def offload_parameters(self) -> str: ...

    @property
    def activation_checkpointing(self) -> bool: ...

    @property
    def compile_blocks(self) -> bool: ...

    @property
    def memory_budget_gib(self) -> float | None: ...

    @property
    def offloads(self) -> bool:
        """Whether optimizer state or parameters live off the accelerator."""
        ...


class BudgetedStrategy(Protocol):
    """What the memory budget reads of a strategy: its settings, its model and where and how it runs."""

    @property
    def zero(self) -> ZeroSettings: ...

    @property
    def model(self) -> nn.Module | None: ...

    @property
    def root_device(self) -> torch.device: ...

    @property
    def num_processes(self) -> int: ...

    @property
    def num_nodes(self) -> int: ...

    @property
    def precision_plugin(self) -> Any: ...


class ShardedStrategy(BudgetedStrategy, Protocol):
    """A lightning-zero strategy, as the layers below the strategies see it."""

    @property
    def zero_backend(self) -> str:
        """The backend that shards the model, as manifests and memory layouts name it (``"deepspeed"``,
        ``"fairscale"``, ``"fsdp2"``)."""
        ...

    def load_consolidated_weights(self, module: nn.Module, state_dict: dict[str, Any]) -> None:
        """Load one consolidated (unsharded) state dict into ``module`` as this backend holds it, before
        Lightning restores the rest of a checkpoint."""
        ...

    def add_checkpoint_entries(self, checkpoint: dict[str, Any]) -> None:
        """Add what this backend's checkpoint needs to be read elsewhere (e.g. the parameter names of an optimizer
        state keyed by position) to the dict about to be saved."""
        ...

    def swaps_optimizer_to_nvme(self) -> bool:
        """Whether this run keeps its optimizer state in NVMe swap files (which no universal form carries)."""
        ...

    def load_universal(self, path: Path, universal: Path, weights_only: bool | None) -> dict[str, Any]:
        """Resume checkpoint ``path`` from its universal form ``universal`` with the optimizer state, at this
        backend's stage and size; return the rest of the checkpoint for Lightning to restore."""
        ...
