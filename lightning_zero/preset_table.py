"""Every named preset, in one table: the one source from which strategies, memory layouts and escalation orders are
derived (:mod:`lightning_zero.presets` builds and registers the strategies; :mod:`lightning_zero.memory.budget`
derives the layouts)."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
    Preset(
        "onecard_step_in_backward",
        "onecard",
        "One device, no sharding: each parameter's AdamW step runs in backward as its gradient completes (exact)",
        {"optimizer_in_backward": True},
    ),
    Preset(
        "onecard_offload",
        "onecard",
        "One device, no sharding: torchao's CPUOffloadOptimizer, AdamW on the host overlapped with backward (exact)",
        {"offload_optimizer": _CPU},
    ),
    Preset(
        "onecard_adamw8bit",
        "onecard",
        "One device, no sharding: torchao's 8-bit AdamW stepped in backward (approximate: opts in by its name)",
        {"optimizer_in_backward": True, "low_memory_optimizer": "adamw8bit", "approximate": True},
    ),
    Preset("zero_auto", "auto", "DeepSpeed ZeRO chosen by measurement for the memory budget (memory_budget_gib)", {}),
)


def preset_names() -> list[str]:
    """All preset names, in table order."""
    return [preset.name for preset in PRESETS]


def get_preset(name: str) -> Preset:
    """The preset called ``name``, or a one-line error with the closest name."""
    for preset in PRESETS:
        if preset.name == name:
            return preset
    raise ZeroConfigError(f"Unknown preset {name!r}: {did_you_mean(name, preset_names())}presets are {preset_names()}.")


def did_you_mean(name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=1)
    return f"did you mean {close[0]!r}? " if close else ""
