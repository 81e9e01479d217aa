"""Saves that are never half there: write under a temporary name, fsync on every rank, then rename into place.

``X.partial`` is written first (one file, or a directory of shards). When every rank has written and fsync'd its
part, rank 0 adds the manifest and swaps ``X.partial`` into place in one rename (an existing ``X`` -- file,
directory or ``last.ckpt`` link -- is exchanged atomically where the OS allows, Linux ``renameat2``; elsewhere it
is moved to ``X.previous`` first). A process killed during a save leaves ``X.partial`` behind and ``X`` as it was;
Lightning's ``ckpt_path="last"`` never sees a ``.partial`` (its name does not end in ``.ckpt``). Writing to a new
path also replaces a ``last.ckpt`` link instead of writing through it into the checkpoint it points at.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from lightning.fabric.strategies import Strategy as FabricStrategy
from lightning.pytorch.strategies import Strategy
from torch import nn

from lightning_zero.checkpoint.hf import HF_KEY, hf_record
from lightning_zero.checkpoint.manifest import (
    CHECKPOINT_KEY,
    MANIFEST_NAME,
    Manifest,
    file_sizes,
    model_signature,
    write_manifest,
)

PARTIAL_SUFFIX = ".partial"
PREVIOUS_SUFFIX = ".previous"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def partial_path(path: Path) -> Path:
    return path.with_name(path.name + PARTIAL_SUFFIX)


def save_atomically(
    strategy: Strategy,
    checkpoint: dict[str, Any],
    filepath: Any,
    write: Callable[[dict[str, Any], Path], None],
    backend: str,
    stage: int,
) -> None:
    """Save ``checkpoint`` to ``filepath`` with ``write(checkpoint, temporary_path)``; collective."""
    assert strategy.lightning_module is not None
    precision = str(strategy.precision_plugin.precision)
    save_module_atomically(strategy, strategy.lightning_module, precision, checkpoint, filepath, write, backend, stage)


def save_module_atomically(
    strategy: Strategy | FabricStrategy,
    module: nn.Module,
    precision: str,
    checkpoint: dict[str, Any],
    filepath: Any,
    write: Callable[[dict[str, Any], Path], None],
    backend: str,
    stage: int,
) -> None:
    """:func:`save_atomically` for any strategy, Trainer's or Fabric's: ``module`` is the model the checkpoint is of
    and ``precision`` the run's precision string, as the manifest records them; collective."""
    final = Path(strategy.broadcast(str(filepath)))
    partial = partial_path(final)
    manifest = describe(strategy, module, precision, checkpoint, final.name, backend, stage)
    checkpoint[CHECKPOINT_KEY] = manifest.to_dict()
    record = hf_record(module)
    if record is not None:
        checkpoint[HF_KEY] = record
    if strategy.is_global_zero:
        remove_path(partial)  # what a killed save left behind
    strategy.barrier()
    write(checkpoint, partial)
    if partial.exists():
        fsync_tree(partial)
    strategy.barrier()
    if strategy.is_global_zero:
        if partial.is_dir():
            write_manifest(partial, replace(manifest, files=file_sizes(partial)))
            fsync_tree(partial / MANIFEST_NAME)
        publish(partial, final)
    strategy.barrier()


def describe(
    strategy: Strategy | FabricStrategy,
    module: nn.Module,
    precision: str,
    checkpoint: dict[str, Any],
    tag: str,
    backend: str,
    stage: int,
) -> Manifest:
    return Manifest(
        tag=tag,
        step=int(checkpoint.get("global_step", 0)),
        epoch=int(checkpoint.get("epoch", 0)),
        world_size=int(getattr(strategy, "world_size", 1)),
        backend=backend,
        stage=stage,
        precision=precision,
        model=model_signature(module),
    )


def remove_checkpoint(strategy: Strategy, filepath: Any) -> None:
    """Delete a checkpoint (file, sharded directory or link) and any unfinished save of it; collective."""
    strategy.barrier()
    if strategy.is_global_zero:
        path = Path(filepath)
        remove_path(path)
        remove_path(partial_path(path))
    strategy.barrier()


def remove_path(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def fsync_tree(path: Path) -> None:
    """fsync a file, or every file and directory under a directory, so that a rename after it is durable."""
    paths = [path] if path.is_file() else [*(p for p in path.rglob("*")), path]
    for item in paths:
        if not item.is_symlink():
            _fsync(item)


def publish(partial: Path, final: Path) -> None:
    """Move ``partial`` to ``final`` in one step, replacing what is there (never writing through a link)."""
    if not (final.exists() or final.is_symlink()):
        os.rename(partial, final)
    elif _exchange(partial, final):
        remove_path(partial)  # now the old checkpoint
    elif partial.is_file() and not final.is_dir():
        os.replace(partial, final)
    else:
        previous = final.with_name(final.name + PREVIOUS_SUFFIX)
        remove_path(previous)
        os.rename(final, previous)
        os.rename(partial, final)
        remove_path(previous)
    _fsync(final.parent)


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where it is not available."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        result = libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
        return bool(result == 0)
    return False
