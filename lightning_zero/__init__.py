"""lightning-zero: ZeRO sharding and offload strategies for PyTorch Lightning, selected by name.

Importing the package registers the presets (``zero1`` ... ``zero3_offload_nvme``) with Lightning's
strategy registry and with Fabric's, so ``Trainer(strategy="zero3_offload")`` and
``Fabric(strategy="zero3_offload")`` work.
"""

from lightning_zero import moved
from lightning_zero.auto.strategy import AutoZeroConfig, ZeroAutoStrategy
from lightning_zero.errors import LightningZeroError, ZeroConfigError, ZeroDataError
from lightning_zero.presets import (
    PRESETS,
    build_fabric_preset,
    build_preset,
    preset_names,
    register_fabric_presets,
    register_presets,
)
from lightning_zero.strategies import DeepSpeedZeroConfig, DeepSpeedZeroStrategy, ZeroConfig, ZeroStrategy
from lightning_zero.version import __version__

register_presets()
register_fabric_presets()
moved.install()

__all__ = [
    "PRESETS",
    "AutoZeroConfig",
    "DeepSpeedZeroConfig",
    "DeepSpeedZeroStrategy",
    "LightningZeroError",
    "ZeroAutoStrategy",
    "ZeroConfig",
    "ZeroConfigError",
    "ZeroDataError",
    "ZeroStrategy",
    "__version__",
    "build_fabric_preset",
    "build_preset",
    "preset_names",
]
