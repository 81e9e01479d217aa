"""The small manifest every lightning-zero checkpoint carries: what wrote it, for which model, and its files.

A checkpoint directory (DeepSpeed, FSDP2 sharded) holds ``manifest.json``; a single-file checkpoint (DDP,
FairScale, FSDP2 ``checkpoint_format="full"``) holds the same fields under the ``lightning_zero`` key, without
the file list (a torch file's own zip index catches truncation).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

MANIFEST_NAME = "manifest.json"
CHECKPOINT_KEY = "lightning_zero"
FORMAT = "lightning-zero-checkpoint"


@dataclass(frozen=True)
class ModelSignature:
    """The model a checkpoint belongs to: class name, parameter count, and a hash of every name and shape."""

    name: str
    parameters: int
    digest: str

    def describe(self) -> str:
        return f"{self.name} with {self.parameters:,} parameters"


@dataclass(frozen=True)
class Manifest:
    """What wrote a checkpoint (see the module docstring)."""

    tag: str
    step: int
    epoch: int
    world_size: int
    backend: str
    stage: int
    precision: str
    model: ModelSignature
    files: dict[str, int] = field(default_factory=dict)
    format: str = FORMAT

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        return cls(**{**data, "model": ModelSignature(**data["model"])})


def full_shape(parameter: nn.Parameter) -> tuple[int, ...]:
    """A parameter's unsharded shape (DeepSpeed ZeRO-3 keeps it in ``ds_shape``; FSDP2 DTensors report it)."""
    return tuple(getattr(parameter, "ds_shape", None) or parameter.shape)


def model_signature(module: nn.Module) -> ModelSignature:
    """The :class:`ModelSignature` of ``module``, the same whatever shards or offloads its parameters."""
    shapes = [(name, full_shape(parameter)) for name, parameter in module.named_parameters()]
    digest = hashlib.sha256(json.dumps(shapes).encode()).hexdigest()[:16]
    count = sum(_numel(shape) for _, shape in shapes)
    return ModelSignature(name=type(module).__name__, parameters=count, digest=digest)


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def file_sizes(directory: Path) -> dict[str, int]:
    """Every file under ``directory`` (relative path -> bytes), the manifest itself excluded."""
    return {
        str(path.relative_to(directory)): path.stat().st_size
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.name != MANIFEST_NAME
    }


def write_manifest(directory: Path, manifest: Manifest) -> None:
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest.to_dict(), indent=1))


def read_manifest(directory: Path) -> Manifest | None:
    """The directory's manifest, ``None`` when it has none; ``ValueError`` when it is not one."""
    path = directory / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        return Manifest.from_dict(json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError, KeyError) as error:
        raise ValueError(f"{path} is not a lightning-zero manifest ({error})") from None


def checkpoint_manifest(path: Path) -> Manifest | None:
    """The manifest of a checkpoint directory or file (``None`` if it has none, e.g. written by plain Lightning)."""
    if path.is_dir():
        return read_manifest(path)
    import torch

    content = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    entry = content.get(CHECKPOINT_KEY) if isinstance(content, dict) else None
    return Manifest.from_dict(entry) if isinstance(entry, dict) else None
