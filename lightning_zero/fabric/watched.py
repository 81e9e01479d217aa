"""The rank watchdog (:class:`~lightning_zero.runtime.watchdog.WatchedRanks`) for Fabric's strategies."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_zero.runtime.watchdog import WatchedRanks

if TYPE_CHECKING:
    # The mixin is typed against the Trainer's strategy classes; it only wraps `setup_environment` and `teardown`,
    # which Fabric's strategies have too: typed as Fabric's base here, the Trainer's mixin at run time.
    from lightning.fabric.strategies import ParallelStrategy

    class FabricWatchedRanks(ParallelStrategy):
        pass

else:
    FabricWatchedRanks = WatchedRanks

__all__ = ["FabricWatchedRanks"]
