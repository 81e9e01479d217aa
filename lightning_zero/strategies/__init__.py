"""ZeRO strategy classes of each backend and their typed configs (the named presets are in
:mod:`lightning_zero.presets`)."""

from lightning_zero.strategies.config import ZeroConfig
from lightning_zero.strategies.deepspeed import DeepSpeedZeroStrategy, ZeroStrategy
from lightning_zero.strategies.deepspeed_config import DeepSpeedZeroConfig

__all__ = ["DeepSpeedZeroConfig", "DeepSpeedZeroStrategy", "ZeroConfig", "ZeroStrategy"]
