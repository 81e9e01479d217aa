"""The import paths of the application before it moved under :mod:`lightning_zero.app`, kept for one
release: ``lightning_zero.tasks.causal_lm.CausalLMTask`` in a YAML or an import still works, with a
``FutureWarning`` naming the new path. To be removed in the release after.

Python has no public route for a module alias that ``importlib.import_module`` (jsonargparse's ``class_path``)
follows, hence this finder: it answers for the old names only, ahead of the path finder, so an old and a new name
give one module object, never two copies of its classes."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

#: Old prefix -> new prefix, most specific first.
MOVED: tuple[tuple[str, str], ...] = (
    ("lightning_zero.models.blocks", "lightning_zero.runtime.blocks"),
    ("lightning_zero.checkpoint.consolidate", "lightning_zero.app.consolidate"),
    *(
        (f"lightning_zero.{name}", f"lightning_zero.app.{name}")
        for name in ("tasks", "data", "models", "cli", "chat", "plan_command", "preflight", "parse_errors")
    ),
)


def new_name(old: str) -> str | None:
    """Where the module once called ``old`` lives now, or ``None`` when it did not move."""
    for before, after in MOVED:
        if old == before or old.startswith(before + "."):
            return after + old[len(before) :]
    return None


class _MovedLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        warnings.warn(
            f"`{module.__name__}` moved to `{self.target}`: import it from there (the old path goes in the next"
            " release).",
            FutureWarning,
            stacklevel=2,
        )
        # The import machinery returns what sys.modules holds after this call: the module under its new name.
        sys.modules[module.__name__] = importlib.import_module(self.target)


class MovedModulesFinder(importlib.abc.MetaPathFinder):
    """Resolves the application's old module names to their modules under :mod:`lightning_zero.app`."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        moved_to = new_name(fullname)
        if moved_to is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedLoader(moved_to))


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, MovedModulesFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModulesFinder())
