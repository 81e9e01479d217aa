"""The private parts of the libraries that lightning-zero relies on are all in lightning_zero.internals, and an
upgrade that changes one of them fails here: each entry's source is fingerprinted (sha256 of
``inspect.getsource``, first 16 hex digits) for the versions pinned in constraints.txt.

After a deliberate upgrade, re-read each changed entry's new source, adapt our code if needed, and record the new
fingerprints: ``python tests/test_internals.py`` prints them.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import pkgutil
from pathlib import Path
from typing import Any

import pytest
from torch import nn

import lightning_zero
from lightning_zero.internals import RELIED_ON
from tests.helpers.launch import REPO
from tests.helpers.runif import RunIf

FINGERPRINTS: dict[str, str] = {
    "torch.distributed.algorithms._checkpoint.checkpoint_wrapper.checkpoint_wrapper": "9959b1d13d14a9c9",
    "torch.distributed.algorithms._checkpoint.checkpoint_wrapper.apply_activation_checkpointing": "afcdf89bf44ad4bf",
    "torch.utils.cpp_extension._get_build_directory": "878defeb0621e3ef",
    "torch.cuda.memory._set_allocator_settings": "88de771c75b87a1c",
    "torch._C._accelerator_getAllocatorSettings": "a C function",
    "lightning.pytorch.trainer.trainer.Trainer.strategy": "63bfbecf09333d02",
    "torchao.optim._AdamW": "e688b40f6710299f",
    "torch._subclasses.fake_tensor.FakeTensorMode": "a3988233f391e892",
    "torch.nn.modules.module.Module._apply": "e50d01ca9c5c9b60",
    "torch.optim.lr_scheduler.LRScheduler.get_last_lr": "904212d938686992",
    "torch.optim.lr_scheduler.LRScheduler.__init__": "b9c01b4cebb2f2f9",
    "lightning.fabric.utilities.init._materialize_distributed_module": "04f62d1d98feb207",
    "lightning.pytorch.core.optimizer._init_optimizers_and_lr_schedulers": "8b5a6065460889a1",
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy.setup_environment": "de7e179a7fc99ab5",
    "lightning.fabric.strategies.strategy._BackwardSyncControl": "9895e2089035fce5",
    "lightning.fabric.connector._Connector._lazy_init_strategy": "287aab291d523f29",
    "lightning.fabric.strategies.strategy.Strategy._configure_launcher": "222c242e36b6e017",
    "lightning.fabric.strategies.ddp.DDPStrategy.__init__": "266632d88e2e915f",
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy.setup_distributed": "78cee79c7c131102",
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy._setup_model_and_optimizer": "6a7d1e7daa636a60",
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy._initialize_deepspeed_inference": "dc47d956a17bc6ac",
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy._init_deepspeed_distributed": "4a4df8858860216f",
    "lightning.fabric.strategies.deepspeed.DeepSpeedStrategy.setup_environment": "de7e179a7fc99ab5",
    "lightning.fabric.strategies.deepspeed.DeepSpeedStrategy._setup_distributed": "ccec40f01b488f6f",
    "lightning.fabric.strategies.deepspeed.DeepSpeedStrategy._init_deepspeed_distributed": "4a4df8858860216f",
    "lightning.fabric.strategies.ddp.DDPStrategy._set_world_ranks": "71dbb9f2aabfd147",
    "lightning.fabric.strategies.deepspeed.DeepSpeedStrategy._set_deepspeed_activation_checkpointing": (
        "e3fbfdd65fd17a27"
    ),
    "lightning.fabric.strategies.deepspeed.DeepSpeedStrategy._format_config": "c32a945359d3fbf6",
    "lightning.fabric.strategies.deepspeed.DeepSpeedStrategy.setup_module_and_optimizers": "7a4d5481e3e47c0c",
    "lightning.fabric.strategies.model_parallel.ModelParallelStrategy.setup_environment": "8262beea44217caa",
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy._init_config_if_needed": "f14c4c6067281a3d",
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy._auto_select_batch_size": "8852f18a819ed788",
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy._init_optimizers": "83062fba495c4008",
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy._format_config": "e4c7bc1cd605458b",
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy.__init__": "7f8b9dc973f1f8ae",
    "lightning.pytorch.strategies.launchers.subprocess_script._SubprocessScriptLauncher.launch": "16cdd0a2d94b8f47",
    "lightning.pytorch.strategies.ddp.DDPStrategy._configure_launcher": "0869347d2833203c",
    "lightning.pytorch.strategies.ddp.DDPStrategy.setup": "3e1dd84901a333f1",
    "lightning.pytorch.strategies.model_parallel.ModelParallelStrategy.setup": "fdf402066d49c198",
    "lightning.pytorch.strategies.model_parallel.ModelParallelStrategy._get_process_group_backend": "68cb9d6e04716e73",
    "lightning.pytorch.strategies.model_parallel.ModelParallelStrategy.setup_environment": "508f608433d9c45d",
    "lightning.pytorch.core.optimizer.LightningOptimizer.__init__": "c19b01d9154fbd64",
    "lightning.pytorch.core.module.LightningModule.trainer": "6e9321453c706688",
    "lightning.pytorch.callbacks.throughput_monitor.ThroughputMonitor.setup": "a70e5cd8b0b89ff8",
    "lightning.pytorch.cli.LightningCLI._parse_ckpt_path": "9c48f812abdba883",
    "lightning.pytorch.core.saving._load_state": "7b56e86409156b1a",
    "lightning.pytorch.loops.fit_loop._FitLoop.setup_data": "77855202334401d5",
    "deepspeed.runtime.zero.stage3.DeepSpeedZeroOptimizer_Stage3.create_reduce_and_remove_grad_hooks": (
        "cde83f0b853f3286"
    ),
    "deepspeed.runtime.engine.DeepSpeedEngine._zero3_consolidated_16bit_state_dict": "4d7c0d9c1571eb8c",
    "deepspeed.runtime.engine.DeepSpeedEngine.load_universal_checkpoint": "640c6085a8312cb2",
    "deepspeed.runtime.config.DeepSpeedConfig._configure_train_batch_size": "5d0a45deff9d4487",
    "deepspeed.runtime.config.DeepSpeedConfig._do_sanity_check": "9b0f0e314653cde6",
    "transformers.models.auto.auto_factory._BaseAutoModelClass.from_config": "83e1f40e3880d8a9",
    "transformers.modeling_utils.PreTrainedModel.post_init": "7e71a8ab677d5dc8",
    "jsonargparse._core.ArgumentParser.add_subcommands": "12e075624cb0e5e2",
    "fairscale.nn.data_parallel.sharded_ddp.ShardedDataParallel._consume_work_handles": "46879624e51d0089",
    "fairscale.nn.data_parallel.sharded_ddp.ShardedDataParallel._setup_bucket_strategy": "46e6a83969bb9197",
}

LIBRARIES = ("torch", "lightning", "deepspeed", "fairscale", "transformers", "jsonargparse")


def resolve(path: str) -> Any:
    """The object at a dotted path: the longest importable module, then attributes."""
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            found = getattr(found, name)
        return found
    raise ImportError(path)


def fingerprint(path: str) -> str:
    found: Any = resolve(path)
    if isinstance(found, property):  # a property's getter
        found = found.fget
    source = inspect.getsource(found)
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def needs(path: str) -> list[Any]:
    if path in ("torch._C._host_emptyCache", "torch._C._accelerator_getAllocatorSettings"):  # C: no source to read
        return [pytest.mark.skip(reason="a C function: checked by the GPU benchmarks' zero_auto runs")]
    return [RunIf(fairscale=True)] if path.startswith("fairscale.") else []


@pytest.mark.parametrize("path", [pytest.param(path, marks=needs(path)) for path in RELIED_ON])
def test_what_we_rely_on_is_unchanged_upstream(path: str) -> None:
    assert fingerprint(path) == FINGERPRINTS[path], (
        f"{path} changed upstream: re-read it (we rely on it for: {RELIED_ON[path]}), then record its fingerprint"
    )


def private_imports(source: str) -> list[str]:
    """``from LIBRARY... import _name`` and imports of ``LIBRARY...._module`` in a module's source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in LIBRARIES:
            private_module = any(part.startswith("_") for part in node.module.split("."))
            names = [alias.name for alias in node.names if alias.name.startswith("_")]
            if private_module or names:
                found.append(f"{node.module}: {names or [alias.name for alias in node.names]}")
    return found


def test_no_module_but_internals_imports_a_private_name() -> None:
    offenders = {
        str(path.relative_to(REPO)): private_imports(path.read_text())
        for path in sorted((REPO / "lightning_zero").rglob("*.py"))
        if path.name != "internals.py"
    }
    assert {path: found for path, found in offenders.items() if found} == {}


#: Underscored names of the standard library that its documentation makes public (``os._exit``).
PUBLIC_UNDERSCORED = frozenset({"_exit"})

#: ``str`` methods whose arguments are pieces of text, never attribute names (``key.endswith("_file")``).
TEXT_METHODS = frozenset({"endswith", "startswith", "removeprefix", "removesuffix", "split", "rstrip", "lstrip"})

#: Attributes a class gets from its metaclass or ``typing`` rather than from a method it overrides.
CLASS_MACHINERY = frozenset({"_abc_impl", "_is_protocol", "_is_runtime_protocol"})


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name != "_"


def private_text(node: ast.AST) -> str | None:
    """The private name a string constant holds (``"_last_lr"``), else ``None``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
        return node.value if is_private(node.value) else None
    return None


def overridden_calls(tree: ast.AST) -> set[int]:
    """``id()`` of each ``super()._name`` inside a method ``_name``: an override calling what it overrides (the
    override test fingerprints that method)."""
    found = set()
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == function.name
                and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name)
                and node.value.func.id == "super"
            ):
                found.add(id(node))
    return found


def private_accesses(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, name)`` of each private attribute read, written or deleted: ``x._name`` (but an override's
    ``super()._name``), and a private name as a string constant given to a call or used as a key
    (``getattr(x, "_name")``, ``state.get("_name")``, ``state["_name"]``; not ``text.endswith("_name")``)."""
    allowed = overridden_calls(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr) and id(node) not in allowed:
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute) and node.func.attr in TEXT_METHODS:
                continue
            for argument in node.args:
                if (name := private_text(argument)) is not None:
                    found.append((node.lineno, name))
        elif isinstance(node, ast.Subscript) and (name := private_text(node.slice)) is not None:
            found.append((node.lineno, name))
    return found


def names_defined(tree: ast.AST) -> set[str]:
    """Names a module gives its own functions, classes and attributes: ``def``/``class`` names, names assigned in
    a module or class body, and ``self.<name>`` assignment targets."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        for target in targets:
            if isinstance(target, ast.Name):
                found.add(target.id)
            elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                found.add(target.attr)
    return found


def is_ours(cls: type) -> bool:
    return cls.__module__.split(".")[0] == "lightning_zero"


def upstream_names(cls: type) -> set[str]:
    """Every attribute name of ``cls``'s bases from outside lightning-zero: their class attributes and the
    ``self.<name>`` attributes their source assigns."""
    found: set[str] = set()
    for base in cls.__mro__[1:]:
        if is_ours(base) or base is object:
            continue
        found.update(dir(base))
        try:
            found.update(names_defined(ast.parse(inspect.cleandoc("\n" + inspect.getsource(base)))))
        except (OSError, TypeError, SyntaxError):  # a class with no Python source
            continue
    return found


def classes_in_functions(tree: ast.AST) -> list[ast.ClassDef]:
    """The classes defined inside a function's body (anywhere below it)."""
    return [
        node
        for function in ast.walk(tree)
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
        for node in ast.walk(function)
        if isinstance(node, ast.ClassDef)
    ]


def lazy_class_factories() -> list[str]:
    """The functions of ``internals.py`` that define a class on their first call (an upstream base imported on use):
    module-level, without parameters, so the override test can call each."""
    tree = ast.parse((REPO / "lightning_zero" / "internals.py").read_text())
    return [
        function.name
        for function in tree.body
        if isinstance(function, ast.FunctionDef) and classes_in_functions(function)
    ]


def our_classes() -> list[type]:
    """Every class lightning-zero defines: at module level, inside its classes, and those ``internals.py`` defines
    on first use."""
    modules = [
        importlib.import_module(info.name) for info in pkgutil.walk_packages(lightning_zero.__path__, "lightning_zero.")
    ]
    from lightning_zero import internals

    pending: list[Any] = [value for module in modules for value in vars(module).values()]
    pending += [getattr(internals, factory)() for factory in lazy_class_factories()]
    found: list[type] = []
    while pending:
        value = pending.pop()
        if isinstance(value, type) and is_ours(value) and value not in found:
            found.append(value)
            pending.extend(vars(value).values())
    return found


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def upstream_private_accesses() -> dict[tuple[str, str], list[int]]:
    """``(module, name) -> lines`` of each private access outside ``internals.py`` to a name that is not ours.

    A private name is ours when a lightning-zero module defines it (:func:`names_defined`) and no class outside
    lightning-zero that one of our classes derives from has it (:func:`upstream_names`): ``self._device_rank``
    of our strategy is ours; ``self._launcher`` (set by Lightning's ``Strategy``), ``module._modules`` (torch's)
    and ``engine._config`` are not. A private name that lightning-zero never defines is upstream's wherever it is
    read. The rule goes by name, not by object: an upstream object's private attribute that shares its name with
    one of ours and with no base of ours would pass unseen.
    """
    trees = {module_name(path): ast.parse(path.read_text()) for path in sorted((REPO / "lightning_zero").rglob("*.py"))}
    upstream = set().union(*(upstream_names(cls) for cls in our_classes()))
    ours = set().union(*(names_defined(tree) for tree in trees.values())) - upstream
    found: dict[tuple[str, str], list[int]] = {}
    for module, tree in trees.items():
        if module == "lightning_zero.internals":
            continue
        for line, name in private_accesses(tree):
            if name not in ours and name not in PUBLIC_UNDERSCORED:
                found.setdefault((module, name), []).append(line)
    return found


def test_no_private_upstream_attribute_is_used_outside_internals() -> None:
    found = upstream_private_accesses()
    assert found == {}, f"{len(found)} private accesses: move each into a function of lightning_zero/internals.py"


def test_every_internals_function_names_what_it_relies_on() -> None:
    from lightning_zero import internals

    functions = {name for name in internals.__all__ if name not in {"RELIED_ON", "FUNCTIONS"}}
    assert sorted(functions ^ internals.FUNCTIONS.keys()) == []
    assert sorted(set().union(*internals.FUNCTIONS.values()) - RELIED_ON.keys()) == []


def silent_private_defaults(tree: ast.AST) -> list[str]:
    """Private names read with ``getattr(obj, "_name", default)``: a missing attribute taken silently for the
    default, where an upgrade that renames it should fail."""
    return [
        node.args[1].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) == 3
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
        and is_private(node.args[1].value)
    ]


def test_no_private_name_is_read_with_a_silent_default() -> None:
    found = {
        (module_name(path), name)
        for path in sorted((REPO / "lightning_zero").rglob("*.py"))
        for name in silent_private_defaults(ast.parse(path.read_text()))
    }
    assert found == set(), "say what is needed in a function of lightning_zero/internals.py instead"


def test_the_private_access_rule_tells_ours_from_upstreams() -> None:
    source = """
class Strategy(DeepSpeedStrategy):
    def _configure_launcher(self):
        super()._configure_launcher()
        self._launcher = wrap(self._launcher)
        self._transformers_zero3 = None

    def _apply(self, fn):
        names = list(self._modules)
        super()._init_optimizers()
        return self._device_rank, getattr(self, "_layer_sync"), state.get("_last_lr"), key.endswith("_file")
"""
    accesses = {name for _, name in private_accesses(ast.parse(source))}
    assert accesses == {
        "_launcher",
        "_modules",
        "_init_optimizers",
        "_transformers_zero3",
        "_device_rank",
        "_layer_sync",
        "_last_lr",
    }  # an override's `super()._configure_launcher` is not one
    classes = {cls.__name__: cls for cls in our_classes()}
    upstream = upstream_names(classes["DeepSpeedZeroStrategy"]) | upstream_names(classes["TaskModule"])
    assert {"_launcher", "_modules", "_init_optimizers", "_layer_sync"} <= upstream
    assert {"_transformers_zero3", "_device_rank"}.isdisjoint(upstream)  # ours: defined by us, by no base


def test_no_class_hides_inside_a_function_outside_internals() -> None:
    """A class defined in a function body is out of the override test's reach (it walks module-level classes and
    calls ``internals.py``'s class factories): its overrides of a private upstream method would go unchecked."""
    found = [
        f"{module_name(path)}.{node.name}"
        for path in sorted((REPO / "lightning_zero").rglob("*.py"))
        if path.name != "internals.py"
        for node in classes_in_functions(ast.parse(path.read_text()))
    ]
    assert found == [], "define it at module level, or (an upstream base imported on use) in internals.py"
    from lightning_zero import internals

    factories = lazy_class_factories()
    assert factories, "internals.py defines its DeepSpeed config parser class on first use"
    assert all(not inspect.signature(getattr(internals, name)).parameters for name in factories)


def overridden_privates(cls: type) -> set[str]:
    """``module.Class.name`` of each private attribute ``cls`` defines that a class it derives from outside
    lightning-zero defines too (the nearest such base's)."""
    bases = [base for base in cls.__mro__[1:] if not is_ours(base) and base is not object]
    found = set()
    for name in vars(cls):
        if not is_private(name) or name in CLASS_MACHINERY:
            continue
        base = next((base for base in bases if name in vars(base)), None)
        if base is not None:
            found.add(f"{base.__module__}.{base.__qualname__}.{name}")
    return found


def test_every_private_upstream_method_we_override_is_listed() -> None:
    classes = our_classes()
    overridden = {path: cls for cls in classes for path in overridden_privates(cls)}
    assert sorted(overridden.keys() - RELIED_ON.keys()) == []
    # The walk reaches the subclasses of every kind of upstream class we derive from.
    names = {cls.__name__ for cls in classes}
    assert {"DeepSpeedZeroStrategy", "FabricZeroStrategy", "FSDP2Strategy", "FabricFSDP2Strategy"} <= names
    assert {"TaskModule", "ZeroThroughputMonitor", "ZeroCLI", "SectionParser"} <= names
    assert any(path.startswith("deepspeed.runtime.config.DeepSpeedConfig.") for path in overridden)

    class Probe(nn.Linear):  # the rule sees an override of a private method that a base further up defines
        def _apply(self, fn: Any, recurse: bool = True) -> nn.Module:
            return self

        def _ours(self) -> None:
            pass

    assert overridden_privates(Probe) == {"torch.nn.modules.module.Module._apply"}


if __name__ == "__main__":  # run from the repository's root: PYTHONPATH=. python tests/test_internals.py
    for path in RELIED_ON:
        try:
            print(f'    "{path}": "{fingerprint(path)}",')
        except (ImportError, AttributeError):  # not installed, or absent from this build (a CUDA-only function)
            print(f"    # {path}: not here")
