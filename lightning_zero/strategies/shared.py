"""The set-up every lightning-zero strategy adds to its backend's, written once: the memory budget applied for the
model and lifted at teardown, the transformer blocks prepared as configured, and the checkpoints' identity (through
:class:`~lightning_zero.checkpoint.strategy.SafeCheckpoints`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_zero.memory.budget import apply_memory_budget, lift_memory_budget
from lightning_zero.runtime.blocks import prepare_blocks

if TYPE_CHECKING:  # what the mixin is placed before: typed as such, a plain class at run time
    from lightning.pytorch.strategies import ParallelStrategy as _Strategy

    from lightning_zero.sharding import ZeroSettings
else:
    _Strategy = object


class ShardedSetup(_Strategy):
    """Mixin placed first among a lightning-zero strategy's bases; the strategy names its :attr:`zero_backend` and
    holds its ZeRO settings in ``zero`` (a :class:`~lightning_zero.sharding.ShardedStrategy`)."""

    #: The backend that shards the model, as manifests and memory layouts name it.
    zero_backend: str

    if TYPE_CHECKING:

        @property
        def zero(self) -> ZeroSettings: ...

        @property
        def num_processes(self) -> int: ...

        num_nodes: int

    def apply_memory_budget(self) -> None:
        """Check that the model's states fit ``zero.memory_budget_gib`` and cap the accelerator (the start of
        ``setup``, once the model exists)."""
        apply_memory_budget(self, self.zero_backend)

    def prepare_blocks(self) -> None:
        """Checkpoint and compile the model's transformer blocks as ``zero`` asks."""
        assert self.model is not None
        prepare_blocks(self.model, self.zero.activation_checkpointing, self.zero.compile_blocks)

    def teardown(self) -> None:
        lift_memory_budget(self)
        super().teardown()
