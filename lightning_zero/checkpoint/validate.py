"""Check a checkpoint path before anything loads it: one line naming what is wrong and what to pass instead.

Caught: a missing path (and a save that did not finish), a truncated or garbage file, a sharded directory with a
file missing or cut short, another model's checkpoint, and files other tools wrote (a plain state dict, a
Hugging Face folder). Files are opened with ``torch.load(weights_only=True, mmap=True)``: no code runs, and
tensors are not read into memory.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lightning_zero.checkpoint.atomic import PARTIAL_SUFFIX, PREVIOUS_SUFFIX
from lightning_zero.checkpoint.manifest import (
    CHECKPOINT_KEY,
    MANIFEST_NAME,
    Manifest,
    full_shape,
    model_signature,
    read_manifest,
)
from lightning_zero.errors import ZeroConfigError

#: ``ckpt_path`` values that Lightning resolves itself.
SPECIAL_PATHS = ("last", "best", "hpc", "registry")
_PASS = "pass a .ckpt file or directory that a Trainer saved, or 'last'"
DEEPSPEED_TAG_FILE = "latest"
DCP_METADATA = ".metadata"


def check_checkpoint(path: Any, module: nn.Module | None = None) -> None:
    """Raise :class:`ZeroConfigError` unless ``path`` is a loadable checkpoint (of ``module``'s model, if given)."""
    if path is None or str(path) in SPECIAL_PATHS:
        return
    path = Path(path)
    if not path.exists():
        raise ZeroConfigError(f"Checkpoint '{path}' does not exist{_why_missing(path)}: {_PASS}.")
    if not _is_checkpoint_directory(path) and (enclosing := _enclosing_checkpoint(path)) is not None:
        raise ZeroConfigError(
            f"'{path}' is inside a checkpoint. Try to load using this parent directory instead: {enclosing}"
        )
    if path.is_dir():
        _check_directory(path, module)
    else:
        _check_file(path, module)


def _is_checkpoint_directory(path: Path) -> bool:
    return any((path / name).is_file() for name in (MANIFEST_NAME, DEEPSPEED_TAG_FILE, DCP_METADATA))


def _enclosing_checkpoint(path: Path) -> Path | None:
    """The sharded checkpoint directory ``path`` lies in (its ``checkpoint/`` sub-folder or a shard file in it)."""
    return next((parent for parent in (path.parent, path.parent.parent) if _is_checkpoint_directory(parent)), None)


def _why_missing(path: Path) -> str:
    for suffix, what in ((PARTIAL_SUFFIX, "a save that did not finish"), (PREVIOUS_SUFFIX, "the one it replaced")):
        sibling = path.with_name(path.name + suffix)
        if sibling.exists():
            return f" ('{sibling.name}' next to it is {what})"
    return ""


def _check_directory(path: Path, module: nn.Module | None) -> None:
    try:
        manifest = read_manifest(path)
    except ValueError as error:
        raise ZeroConfigError(f"Checkpoint '{path}': {error}: {_PASS}.") from None
    if manifest is None:
        if not _is_checkpoint_directory(path):
            raise ZeroConfigError(
                f"'{path}' is a directory but not a checkpoint (no manifest.json, DeepSpeed 'latest' or"
                f" torch.distributed.checkpoint '.metadata' in it): {_PASS}."
            )
        return
    for name, size in manifest.files.items():
        found = path / name
        if not found.is_file():
            raise ZeroConfigError(f"Checkpoint '{path}' is incomplete: '{name}' is missing: {_PASS}.")
        if found.stat().st_size != size:
            raise ZeroConfigError(
                f"Checkpoint '{path}' is damaged: '{name}' has {found.stat().st_size} bytes, its manifest says"
                f" {size}: pass an earlier checkpoint."
            )
    if module is not None:
        _check_signature(path, manifest, module)


def _check_signature(path: Path, manifest: Manifest, module: nn.Module) -> None:
    here = model_signature(module)
    if here.parameters and manifest.model.digest != here.digest:
        raise ZeroConfigError(
            f"Checkpoint '{path}' is for another model ({manifest.model.describe()}; this is {here.describe()}):"
            " pass a checkpoint of this model, or the model it was trained with."
        )


def _check_file(path: Path, module: nn.Module | None) -> None:
    if not zipfile.is_zipfile(path):
        raise ZeroConfigError(
            f"Checkpoint '{path}' is not a torch checkpoint (truncated, or not written by torch.save): {_PASS}."
        )
    try:
        content = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError:
        return  # a checkpoint with custom objects (e.g. in its hyper-parameters): only the loader can say more
    except (RuntimeError, EOFError, OSError) as error:
        raise ZeroConfigError(f"Checkpoint '{path}' cannot be read ({_first_line(error)}): {_PASS}.") from None
    if not isinstance(content, dict) or "state_dict" not in content or not _written_by_lightning(content):
        raise ZeroConfigError(
            f"'{path}' is not a Lightning checkpoint ({_what_it_holds(content)}): {_PASS}; to start from plain"
            " weights, load them into the model before `fit`."
        )
    if module is None:
        return
    manifest = content.get(CHECKPOINT_KEY)
    if isinstance(manifest, dict):
        _check_signature(path, Manifest.from_dict(manifest), module)
    else:
        _check_state_dict(path, content["state_dict"], module)


def _written_by_lightning(content: dict[str, Any]) -> bool:
    return "pytorch-lightning_version" in content or CHECKPOINT_KEY in content


def _what_it_holds(content: Any) -> str:
    if isinstance(content, dict):
        keys = [str(key)[:40] for key in list(content)[:1]]
        return f"a mapping of {len(content)} entries such as {keys}"
    return f"a {type(content).__name__}"


def _check_state_dict(path: Path, state: dict[str, Any], module: nn.Module) -> None:
    # By the names a state dict gives them: wrappers (activation checkpointing's) take their prefixes out there.
    parameters = [(name, p) for name, p in module.state_dict(keep_vars=True).items() if isinstance(p, nn.Parameter)]
    missing = [name for name, _ in parameters if name not in state]
    different = [
        f"{name} {tuple(state[name].shape)} here {full_shape(parameter)}"
        for name, parameter in parameters
        if name in state and tuple(state[name].shape) != full_shape(parameter)
    ]
    if missing or different:
        example = different[0] if different else missing[0]
        raise ZeroConfigError(
            f"Checkpoint '{path}' is for another model: {len(missing)} of this model's parameters are missing"
            f" from it and {len(different)} differ in shape (e.g. {example}): pass a checkpoint of this model."
        )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
