"""Folders are layers: a module imports only modules of its own layer or lower ones, lazy imports included (the
table of docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.launch import REPO

PACKAGE = REPO / "lightning_zero"

#: Lowest first; a module may import from its own layer and the layers before it. The library (what
#: ``pip install lightning-zero`` needs) ends at ``__init__``; the application (``app``, the ``app`` extra) sits above
#: it, so no library module can import it.
LIBRARY: tuple[frozenset[str], ...] = (
    frozenset(
        {"errors", "precision", "quiet", "hardware", "packages", "internals", "preset_table", "sharding", "version"}
    ),
    frozenset({"runtime"}),
    frozenset({"memory"}),
    frozenset({"checkpoint"}),
    frozenset({"strategies"}),
    frozenset({"auto"}),
    frozenset({"fabric"}),
    frozenset({"presets"}),
    frozenset({"callbacks"}),
    frozenset({"__init__", "moved"}),
)
APPLICATION: tuple[frozenset[str], ...] = (
    frozenset({"app.models"}),
    frozenset({"app.data"}),
    frozenset({"app.tasks"}),
    frozenset({"app.parse_errors", "app.preflight", "app.hf_export", "app.consolidate"}),
    frozenset({"app.__init__", "app.cli", "app.plan_command", "app.chat"}),
)
LAYERS = LIBRARY + APPLICATION


def layer_of(unit: str) -> int:
    return next(index for index, names in enumerate(LAYERS) if unit in names)


def unit_of(module: str) -> str:
    """The top-level module or sub-package of ``lightning_zero`` a dotted module name is in (one level deeper in
    ``app``)."""
    parts = module.split(".")
    if parts[1:2] == ["app"]:
        return f"app.{parts[2]}" if len(parts) > 2 else "app.__init__"
    return parts[1] if len(parts) > 1 else "__init__"


def imported_units(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "lightning_zero":
            found.add(unit_of(node.module))
        elif isinstance(node, ast.Import):
            found.update(unit_of(alias.name) for alias in node.names if alias.name.split(".")[0] == "lightning_zero")
    return found


def test_every_module_has_a_layer() -> None:
    units = {path.relative_to(PACKAGE).parts[0].removesuffix(".py") for path in PACKAGE.glob("*")}
    units |= {f"app.{path.name.removesuffix('.py')}" for path in (PACKAGE / "app").glob("*")}
    units -= {"__pycache__", "py.typed", "app", "app.__pycache__"}
    assert sorted(unit for unit in units if not any(unit in names for names in LAYERS)) == []


def test_imports_flow_down_the_layers() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = unit_of(".".join(path.relative_to(REPO).with_suffix("").parts))
        for target in imported_units(path):
            if layer_of(target) > layer_of(here):
                upward.append(f"{path.relative_to(REPO)} imports lightning_zero.{target}")
    assert upward == []


def test_the_library_never_imports_the_application() -> None:
    """The layer rule above, said for the split that matters most: with the ``app`` extra missing, nothing the
    strategies import may need it."""
    library = {unit for names in LIBRARY for unit in names}
    into_app = [
        f"{path.relative_to(REPO)} imports lightning_zero.{target}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if unit_of(".".join(path.relative_to(REPO).with_suffix("").parts)) in library
        for target in imported_units(path)
        if target.startswith("app.")
    ]
    assert into_app == []


def test_every_strategy_keeps_the_contract_of_the_layers_below() -> None:
    """mypy holds each strategy class to :class:`~lightning_zero.sharding.ShardedStrategy` (the annotated list); the
    run holds its ``zero_backend`` to the backend of the preset that builds it (the memory layouts' name)."""
    from lightning_zero.preset_table import PRESETS
    from lightning_zero.sharding import ShardedStrategy
    from lightning_zero.strategies.deepspeed import DeepSpeedZeroStrategy
    from lightning_zero.strategies.fairscale import FairScaleStrategy
    from lightning_zero.strategies.fsdp2 import FSDP2Strategy

    contract: list[type[ShardedStrategy]] = [DeepSpeedZeroStrategy, FairScaleStrategy, FSDP2Strategy]
    backends = {preset.name: preset.backend for preset in PRESETS}
    presets = {
        DeepSpeedZeroStrategy: DeepSpeedZeroStrategy.strategy_name,
        FairScaleStrategy: FairScaleStrategy.strategy_name,
        FSDP2Strategy: FSDP2Strategy.strategy_name,
    }
    assert {cls.__name__: cls.zero_backend for cls in contract} == {
        cls.__name__: backends[name] for cls, name in presets.items()
    }
    assert len({cls.zero_backend for cls in contract}) == len(contract)
