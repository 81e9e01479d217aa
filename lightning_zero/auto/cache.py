"""``zero_auto``'s cache of choices: one JSON object of ``key -> candidate``, replaced atomically.

The key holds everything a choice depends on (:func:`choice_key`), the versions of torch, DeepSpeed, Lightning and
lightning-zero included, so an upgrade searches again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from lightning_zero.version import __version__


def package_versions() -> tuple[str, str, str, str]:
    """torch's, DeepSpeed's, Lightning's and lightning-zero's versions (the last from the source, so a source tree on
    ``PYTHONPATH`` works as well as an installed package)."""
    import deepspeed
    import lightning
    import torch

    return torch.__version__, deepspeed.__version__, lightning.__version__, __version__


def choice_key(**facts: object) -> str:
    """A stable key of everything the choice depends on (model, sequence length, devices, budget, versions)."""
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_cache(path: Path) -> dict[str, Any]:
    """The cached choices in ``path``: none when it is missing, and none, with a warning, when it cannot be read
    or is not a JSON object (the search then runs and rewrites it)."""
    if not path.is_file():
        return {}
    try:
        entries = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        rank_zero_warn(f"zero_auto: ignoring the unreadable cache {str(path)!r} ({error}); searching again.")
        return {}
    if not isinstance(entries, dict):
        rank_zero_warn(f"zero_auto: ignoring the cache {str(path)!r}, which is not a JSON object; searching again.")
        return {}
    return entries


def write_cache(path: Path, entries: Mapping[str, Any]) -> None:
    """Replace ``path`` with ``entries`` in one step: a temporary file next to it, renamed over it, so a run
    stopped mid-write or a concurrent reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as scratch:
        scratch.write(json.dumps(entries, indent=1, sort_keys=True))
    try:
        os.replace(scratch.name, path)
    except OSError:
        Path(scratch.name).unlink(missing_ok=True)
        raise


def cached_choice(path: Path, key: str) -> dict[str, Any] | None:
    """The cached entry of ``key`` in ``path`` (``None``: none, or not an object)."""
    entry = read_cache(path).get(key)
    return entry if isinstance(entry, dict) else None


def store_choice(path: Path, key: str, entry: Mapping[str, Any]) -> None:
    """Add or replace ``key``'s entry in ``path``, keeping the others."""
    write_cache(path, {**read_cache(path), key: entry})
