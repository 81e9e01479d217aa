"""Every named preset, in one table, and their registration with Lightning's strategy registry.

``import lightning_zero`` registers them, so ``Trainer(strategy="zero3_offload")`` works; the CLI imports
the package first, so short names work in YAML files without the user importing anything.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lightning.pytorch.strategies import StrategyRegistry
from lightning.pytorch.utilities import rank_zero_warn

from lightning_zero.errors import ZeroConfigError


@dataclass(frozen=True)
class Preset:
    """A strategy name and what it means: a backend and the fields of that backend's config dataclass."""

    name: str
    backend: str
    description: str
    fields: Mapping[str, Any]


_CPU = "cpu"
_NVME = "nvme"

PRESETS: tuple[Preset, ...] = (
    Preset("zero1", "deepspeed", "DeepSpeed ZeRO-1: optimizer state sharded", {"stage": 1}),
    Preset("zero2", "deepspeed", "DeepSpeed ZeRO-2: optimizer state and gradients sharded", {"stage": 2}),
    Preset(
        "zero2_offload",
        "deepspeed",
        "DeepSpeed ZeRO-2, optimizer state and step on CPU",
        {"stage": 2, "offload_optimizer": _CPU},
    ),
    Preset("zero3", "deepspeed", "DeepSpeed ZeRO-3: parameters, gradients and optimizer state sharded", {"stage": 3}),
    Preset(
        "zero3_offload",
        "deepspeed",
        "DeepSpeed ZeRO-3, parameters and optimizer on CPU",
        {"stage": 3, "offload_optimizer": _CPU, "offload_parameters": _CPU},
    ),
    Preset(
        "zero3_offload_nvme",
        "deepspeed",
        "DeepSpeed ZeRO-3, parameters and optimizer on NVMe (needs nvme_path)",
        {"stage": 3, "offload_optimizer": _NVME, "offload_parameters": _NVME},
    ),
    Preset("zero1_fairscale", "fairscale", "FairScale ZeRO-1: OSS sharded optimizer with DDP", {"stage": 1}),
    Preset(
        "zero2_fairscale",
        "fairscale",
        "FairScale ZeRO-2: OSS sharded optimizer with ShardedDataParallel (gradients sharded)",
        {"stage": 2},
    ),
    Preset("zero2_fsdp", "fsdp2", "PyTorch FSDP2 ZeRO-2: parameters gathered from forward to backward", {"stage": 2}),
    Preset(
        "zero3_fsdp", "fsdp2", "PyTorch FSDP2 ZeRO-3: parameters, gradients and optimizer state sharded", {"stage": 3}
    ),
    Preset(
        "zero3_offload_fsdp",
        "fsdp2",
        "PyTorch FSDP2 ZeRO-3, parameters, gradients and optimizer step on CPU",
        {"stage": 3, "offload_optimizer": _CPU, "offload_parameters": _CPU},
    ),
    Preset("zero_auto", "auto", "DeepSpeed ZeRO chosen by measurement for the memory budget (memory_budget_gib)", {}),
)


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
    if backend == "fsdp2":
        from lightning_zero.strategies.fsdp2 import FSDP2Strategy

        return FSDP2Strategy
    raise ZeroConfigError(f"Unknown backend {backend!r}: use one of {sorted({p.backend for p in PRESETS})}.")


def preset_names() -> list[str]:
    """All preset names, in table order."""
    return [preset.name for preset in PRESETS]


def get_preset(name: str) -> Preset:
    """The preset called ``name``, or a one-line error with the closest name."""
    for preset in PRESETS:
        if preset.name == name:
            return preset
    raise ZeroConfigError(f"Unknown preset {name!r}: {_suggestion(name, preset_names())}presets are {preset_names()}.")


def register_presets(registry: Any = StrategyRegistry, backend: str | None = None) -> None:
    """Register every preset (or one backend's) with a Lightning strategy registry (Lightning's own by default).

    Registering again replaces our own entries; a name another package registered first keeps its strategy, with
    one warning naming the preset's other route (:func:`build_preset`)."""
    for preset in PRESETS:
        if backend is not None and preset.backend != backend:
            continue
        factory = functools.partial(build_preset, preset.name)  # what Lightning calls when it resolves the name
        if preset.name in registry and not _is_ours(registry[preset.name]["strategy"]):
            rank_zero_warn(
                f"Strategy name {preset.name!r} is already registered by another package: lightning-zero's preset"
                f" is not registered under it; use strategy=lightning_zero.build_preset({preset.name!r}) instead."
            )
            continue
        registry.register(preset.name, factory, description=preset.description, override=True)


def _is_ours(strategy: Any) -> bool:
    return isinstance(strategy, functools.partial) and strategy.func is build_preset


def build_preset(name: str, **overrides: Any) -> Any:
    """The strategy for preset ``name``, with config fields overridden, e.g. ``nvme_path="/local_nvme"``."""
    preset = get_preset(name)
    return backend_class(preset.backend)(zero={**preset.fields, **overrides})


def _suggestion(name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def check_strategy_name(name: str) -> None:
    """Raise a one-line error with the closest name when ``name`` is neither a registered strategy nor ``"auto"``."""
    if name == "auto" or name in StrategyRegistry:
        return
    raise ZeroConfigError(
        f"Unknown strategy {name!r}: {_suggestion(name, list(StrategyRegistry))}lightning-zero presets are"
        f" {preset_names()}."
    )
