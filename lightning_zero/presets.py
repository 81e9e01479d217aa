"""The strategy behind each preset of :mod:`lightning_zero.preset_table`, and the presets' registration with
Lightning's strategy registry.

``import lightning_zero`` registers them, so ``Trainer(strategy="zero3_offload")`` works; the CLI imports
the package first, so short names work in YAML files without the user importing anything.
"""

from __future__ import annotations

import functools
from typing import Any

from lightning.pytorch.strategies import StrategyRegistry
from lightning.pytorch.utilities import rank_zero_warn

from lightning_zero.errors import ZeroConfigError
from lightning_zero.preset_table import PRESETS, Preset, did_you_mean, get_preset, preset_names

__all__ = [
    "PRESETS",
    "Preset",
    "backend_class",
    "build_fabric_preset",
    "build_preset",
    "check_strategy_name",
    "fabric_backend_class",
    "get_preset",
    "preset_names",
    "register_fabric_presets",
    "register_presets",
]


def backend_class(backend: str) -> type:
    """The strategy class of a backend, imported only when asked for (optional backends may be missing)."""
    if backend == "deepspeed":
        from lightning_zero.strategies.deepspeed import ZeroStrategy

        return ZeroStrategy
    if backend == "fairscale":
        from lightning_zero.strategies.fairscale import FairScaleStrategy

        return FairScaleStrategy
    if backend == "auto":
        from lightning_zero.auto.strategy import ZeroAutoStrategy

        return ZeroAutoStrategy
    if backend == "onecard":
        from lightning_zero.strategies.onecard import OneCardStrategy

        return OneCardStrategy
    if backend == "fsdp2":
        from lightning_zero.strategies.fsdp2 import FSDP2Strategy

        return FSDP2Strategy
    raise _unknown_backend(backend)


def fabric_backend_class(backend: str) -> type:
    """The Fabric strategy class of a backend (:mod:`lightning_zero.fabric`), imported only when asked for."""
    if backend == "deepspeed":
        from lightning_zero.fabric.deepspeed import FabricZeroStrategy

        return FabricZeroStrategy
    if backend == "fsdp2":
        from lightning_zero.fabric.fsdp2 import FabricFSDP2Strategy

        return FabricFSDP2Strategy
    if backend == "fairscale":
        from lightning_zero.fabric.fairscale import FabricFairScaleStrategy

        return FabricFairScaleStrategy
    if backend == "auto":
        from lightning_zero.fabric.auto import FabricZeroAutoStrategy

        return FabricZeroAutoStrategy
    if backend == "onecard":
        from lightning_zero.fabric.onecard import FabricOneCardStrategy

        return FabricOneCardStrategy
    raise _unknown_backend(backend)


def _unknown_backend(backend: str) -> ZeroConfigError:
    return ZeroConfigError(f"Unknown backend {backend!r}: use one of {sorted({p.backend for p in PRESETS})}.")


def build_fabric_preset(name: str, **overrides: Any) -> Any:
    """The Fabric strategy for preset ``name`` (``Fabric(strategy=build_fabric_preset("zero3_offload"))``), with
    config fields overridden as in :func:`build_preset`."""
    preset = get_preset(name)
    return fabric_backend_class(preset.backend)(zero={**preset.fields, **overrides})


def register_fabric_presets(registry: Any = None, backend: str | None = None) -> None:
    """Register every preset (or one backend's) with a Fabric strategy registry (Fabric's own by default), as
    :func:`register_presets` does for the Trainer's."""
    from lightning.fabric.strategies import STRATEGY_REGISTRY

    register_presets(STRATEGY_REGISTRY if registry is None else registry, backend, build=build_fabric_preset)


def register_presets(registry: Any = StrategyRegistry, backend: str | None = None, build: Any = None) -> None:
    """Register every preset (or one backend's) with a Lightning strategy registry (Lightning's own by default);
    ``build(name)`` makes the strategy (:func:`build_preset`, or :func:`build_fabric_preset` for Fabric's).

    Registering again replaces our own entries; a name another package registered first keeps its strategy, with
    one warning naming the preset's other route (:func:`build_preset`)."""
    build = build_preset if build is None else build
    for preset in PRESETS:
        if backend is not None and preset.backend != backend:
            continue
        factory = functools.partial(build, preset.name)  # what Lightning calls when it resolves the name
        if preset.name in registry and not _is_ours(registry[preset.name]["strategy"]):
            rank_zero_warn(
                f"Strategy name {preset.name!r} is already registered by another package: lightning-zero's preset"
                f" is not registered under it; use strategy=lightning_zero.{build.__name__}({preset.name!r}) instead."
            )
            continue
        registry.register(preset.name, factory, description=preset.description, override=True)


def _is_ours(strategy: Any) -> bool:
    return isinstance(strategy, functools.partial) and strategy.func in (build_preset, build_fabric_preset)


def build_preset(name: str, **overrides: Any) -> Any:
    """The strategy for preset ``name``, with config fields overridden, e.g. ``nvme_path="/local_nvme"``."""
    preset = get_preset(name)
    return backend_class(preset.backend)(zero={**preset.fields, **overrides})


def check_strategy_name(name: str) -> None:
    """Raise a one-line error with the closest name when ``name`` is neither a registered strategy nor ``"auto"``."""
    if name == "auto" or name in StrategyRegistry:
        return
    guess = did_you_mean(name, list(StrategyRegistry))
    choices = (
        "`lightning-zero strategies` lists the presets"
        if guess
        else f"use one of the presets {', '.join(preset_names())}"
    )
    raise ZeroConfigError(f"Unknown strategy {name!r}: {guess}{choices}.")
