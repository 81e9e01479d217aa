"""ZeRO strategies and their named presets."""

from lightning_zero.strategies.config import ZeroConfig
from lightning_zero.strategies.deepspeed import DeepSpeedZeroStrategy, ZeroStrategy
from lightning_zero.strategies.deepspeed_config import DeepSpeedZeroConfig
from lightning_zero.strategies.presets import PRESETS, build_preset, preset_names, register_presets

__all__ = [
    "PRESETS",
    "DeepSpeedZeroConfig",
    "DeepSpeedZeroStrategy",
    "ZeroConfig",
    "ZeroStrategy",
    "build_preset",
    "preset_names",
    "register_presets",
]
