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
from typing import Any

import pytest

from lightning_zero.internals import RELIED_ON
from tests.helpers.launch import REPO
from tests.helpers.runif import RunIf

FINGERPRINTS: dict[str, str] = {
    "torch.distributed.algorithms._checkpoint.checkpoint_wrapper.checkpoint_wrapper": "9959b1d13d14a9c9",
    "torch.distributed.algorithms._checkpoint.checkpoint_wrapper.apply_activation_checkpointing": "afcdf89bf44ad4bf",
    "torch.utils.cpp_extension._get_build_directory": "878defeb0621e3ef",
    "torch.cuda.memory._set_allocator_settings": "88de771c75b87a1c",
    "torch._subclasses.fake_tensor.FakeTensorMode": "a3988233f391e892",
    "torch.nn.Module._apply": "e50d01ca9c5c9b60",
    "lightning.fabric.utilities.init._materialize_distributed_module": "04f62d1d98feb207",
    "lightning.pytorch.core.optimizer._init_optimizers_and_lr_schedulers": "8b5a6065460889a1",
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy.setup_environment": "de7e179a7fc99ab5",
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy.setup_distributed": "78cee79c7c131102",
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy._setup_model_and_optimizer": "6a7d1e7daa636a60",
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy._initialize_deepspeed_inference": "dc47d956a17bc6ac",
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy._init_optimizers": "83062fba495c4008",
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy._format_config": "e4c7bc1cd605458b",
    "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy.__init__": "7f8b9dc973f1f8ae",
    "lightning.pytorch.strategies.launchers.subprocess_script._SubprocessScriptLauncher.launch": "16cdd0a2d94b8f47",
    "lightning.pytorch.strategies.ddp.DDPStrategy._configure_launcher": "0869347d2833203c",
    "lightning.pytorch.strategies.ddp.DDPStrategy.setup": "3e1dd84901a333f1",
    "lightning.pytorch.strategies.model_parallel.ModelParallelStrategy.setup": "fdf402066d49c198",
    "lightning.pytorch.strategies.model_parallel.ModelParallelStrategy._get_process_group_backend": "68cb9d6e04716e73",
    "lightning.pytorch.loops.fit_loop._FitLoop.setup_data": "77855202334401d5",
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
    return hashlib.sha256(inspect.getsource(resolve(path)).encode()).hexdigest()[:16]


def needs(path: str) -> list[Any]:
    if path == "torch._C._host_emptyCache":  # a C function of CUDA builds without a public twin: no source to read
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


def overridden_privates(cls: type) -> set[str]:
    """Private methods ``cls`` defines that a Lightning base class defines too (the nearest such base's)."""
    bases = [base for base in cls.__mro__[1:] if base.__module__.startswith("lightning.")]
    found = set()
    for name, value in vars(cls).items():
        if not name.startswith("_") or name.startswith("__") or not inspect.isfunction(value):
            continue
        base = next((base for base in bases if name in vars(base)), None)
        if base is not None:
            found.add(f"{base.__module__}.{base.__qualname__}.{name}")
    return found


def test_every_private_lightning_method_we_override_is_listed() -> None:
    from lightning_zero.strategies.deepspeed import DeepSpeedZeroStrategy, _DeepSpeedOnCpu
    from lightning_zero.strategies.fsdp2 import FSDP2Strategy

    overridden = set().union(
        *(overridden_privates(cls) for cls in (_DeepSpeedOnCpu, DeepSpeedZeroStrategy, FSDP2Strategy))
    )
    assert sorted(overridden - RELIED_ON.keys()) == []


if __name__ == "__main__":  # run from the repository's root: PYTHONPATH=. python tests/test_internals.py
    for path in RELIED_ON:
        try:
            print(f'    "{path}": "{fingerprint(path)}",')
        except ImportError:
            print(f"    # {path}: not installed")
