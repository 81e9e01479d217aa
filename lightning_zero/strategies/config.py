"""Typed configuration shared by every backend.

Each backend has one dataclass that extends :class:`ZeroConfig` with its own fields. Fields that name a
concept all backends share (ZeRO stage, offload, activation checkpointing, compiled blocks) live here, so
switching the backend in a YAML file changes one line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from lightning_zero.errors import ZeroConfigError
from lightning_zero.preset_table import did_you_mean

OffloadDevice = Literal["none", "cpu", "nvme"]
_OFFLOAD_DEVICES = ("none", "cpu", "nvme")

ConfigT = TypeVar("ConfigT", bound="ZeroConfig")


@dataclasses.dataclass(frozen=True)
class ZeroConfig:
    """What every ZeRO backend understands.

    Args:
        stage: ZeRO stage. 0: plain data parallel; 1: optimizer state sharded; 2: also gradients;
            3: also parameters.
        offload_optimizer: Where optimizer state and the optimizer step live: ``"none"`` (the device),
            ``"cpu"`` or ``"nvme"``.
        offload_parameters: Where parameters live between uses (stage 3 only).
        activation_checkpointing: Recompute each transformer block's activations in the backward pass
            instead of storing them. Applied to the model's blocks without model code changes.
        compile_blocks: Compile each transformer block with ``torch.compile``, in place, without model code
            changes. Blocks compile at the first step and once more, with the length as a symbol, at the first
            batch of another shape: a one-off that short runs at dynamic lengths may not repay.
        memory_budget_gib: Memory each process may use on its accelerator, in GiB (``None``: all of it). On CUDA
            the process is capped to it; the model states must fit in it (the error names a layout that does),
            and offloaded states must fit in the host's free RAM.
    """

    stage: int = 2
    offload_optimizer: OffloadDevice = "none"
    offload_parameters: OffloadDevice = "none"
    activation_checkpointing: bool = False
    compile_blocks: bool = False
    memory_budget_gib: float | None = None

    def __post_init__(self) -> None:
        if self.stage not in (0, 1, 2, 3):
            raise ZeroConfigError(f"ZeRO stage must be 0, 1, 2 or 3, got {self.stage!r}: set `stage` to one of them.")
        for name in ("offload_optimizer", "offload_parameters"):
            value = getattr(self, name)
            if value not in _OFFLOAD_DEVICES:
                raise ZeroConfigError(f"`{name}` must be one of {_OFFLOAD_DEVICES}, got {value!r}.")
        if self.offload_parameters != "none" and self.stage != 3:
            raise ZeroConfigError(
                f"Parameter offload needs ZeRO stage 3, got stage {self.stage}: set `stage: 3` or"
                " `offload_parameters: none`."
            )
        budget = self.memory_budget_gib
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget <= 0):
            raise ZeroConfigError(
                f"`memory_budget_gib` must be a positive number of GiB, got {budget!r}: e.g. `memory_budget_gib: 24`."
            )

    @property
    def offloads(self) -> bool:
        """Whether anything is offloaded off the accelerator."""
        return self.offload_optimizer != "none" or self.offload_parameters != "none"

    @classmethod
    def from_dict(cls: type[ConfigT], values: Mapping[str, Any]) -> ConfigT:
        """Build the config from a mapping, rejecting keys the dataclass does not have with the valid ones."""
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(valid))
        if unknown:
            raise ZeroConfigError(
                f"Unknown {cls.__name__} key(s) {unknown}: {did_you_mean(unknown[0], valid)}"
                f"remove {'them' if len(unknown) > 1 else 'it'} (every field: docs/strategies.md)."
            )
        return cls(**values)

    @classmethod
    def coerce(cls: type[ConfigT], value: ConfigT | Mapping[str, Any] | None) -> ConfigT:
        """Accept an instance, a mapping (as from a YAML file) or ``None`` (the defaults)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, ZeroConfig):
            raise ZeroConfigError(
                f"This strategy takes a {cls.__name__}, got a {type(value).__name__}: use the matching backend."
            )
        return cls.from_dict(value)

    def replace(self: ConfigT, **changes: Any) -> ConfigT:
        """A copy with some fields changed (validated again, unknown keys refused as in :meth:`from_dict`)."""
        current = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        return type(self).from_dict({**current, **changes})


def require_stages(config: ZeroConfig, backend: str, first: int, last: int, instead: str) -> None:
    """Raise unless ``config.stage`` is ``first`` or ``last``, the two stages ``backend`` runs; ``instead`` says what
    to use for the others."""
    if config.stage not in (first, last):
        raise ZeroConfigError(f"{backend} runs ZeRO stages {first} and {last}, got stage {config.stage}: {instead}")


def reject_unsupported(config: ZeroConfig, backend: str, **unsupported: object) -> None:
    """Raise if ``config`` asks for a value a backend cannot honour.

    ``unsupported`` maps a field name to the only value the backend supports for it.
    """
    for name, supported_value in unsupported.items():
        value = getattr(config, name)
        if value != supported_value:
            raise ZeroConfigError(
                f"{backend} does not support `{name}: {value}`:"
                f" set it to {supported_value!r} or use a DeepSpeed preset."
            )


def require_existing_dir(path: str | None, what: str) -> Path:
    """Return ``path`` as a directory that exists, or raise naming the setting to fix."""
    if not path:
        raise ZeroConfigError(f"{what} needs a path: set `nvme_path` to a directory on a fast local disk.")
    directory = Path(path)
    if not directory.is_dir():
        raise ZeroConfigError(f"{what} path {str(directory)!r} does not exist: create it or set `nvme_path` to one.")
    return directory
