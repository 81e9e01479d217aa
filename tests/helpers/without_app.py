"""Make the optional packages look not installed in this process: call :func:`hide_optional_packages` before
anything imports them.

Every finder of the import system is wrapped so that the packages of :data:`HIDDEN` are neither importable nor
listed by ``importlib.metadata``; lightning-zero, Lightning and torchmetrics then see what a base install gives.

    python tests/helpers/without_app.py ARGS...     (the CLI, ``lightning-zero ARGS...``, without them)
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

#: The ``app`` extra (lightning_zero.packages.APP_PACKAGES), the benchmarks' extra and the other optional ones.
HIDDEN = frozenset({"transformers", "tensorboard", "tensorboardX", "sacrebleu", "accelerate", "datasets"})


def is_hidden(name: str) -> bool:
    """Whether ``name`` (a module or distribution name) is, or is inside, a hidden package."""
    return re.sub(r"[-_.]+", "_", name).lower() in HIDDEN or name.split(".")[0] in HIDDEN


class HidingFinder:
    """Wraps one finder of ``sys.meta_path``; finds nothing of the hidden packages, neither modules nor metadata."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        find = getattr(self.inner, "find_spec", None)
        return None if is_hidden(name) or find is None else find(name, path, target)

    def find_distributions(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        find = getattr(self.inner, "find_distributions", None)
        found: Iterable[Any] = find(*args, **kwargs) if find is not None else ()
        return (dist for dist in found if not is_hidden(dist.metadata["Name"] or ""))

    def invalidate_caches(self) -> None:
        if hasattr(self.inner, "invalidate_caches"):
            self.inner.invalidate_caches()


def hide_optional_packages() -> None:
    """Wrap every finder of ``sys.meta_path`` in a :class:`HidingFinder` (once)."""
    if already := [name for name in sys.modules if is_hidden(name)]:
        raise RuntimeError(f"too late to hide them, already imported: {already[:5]}")
    sys.meta_path[:] = [HidingFinder(finder) for finder in sys.meta_path]


if __name__ == "__main__":
    hide_optional_packages()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from lightning_zero.app.cli import main

    sys.exit(main())
