"""``lightning-zero plan``: the memory plan of a YAML config's model and data, on this machine.

    lightning-zero plan --config configs/gpt2xl_offload.yaml --budget-gib 24
    lightning-zero plan --config configs/quickstart.yaml --budget-gib 4 --devices 2

It builds the config through the CLI, probes one batch (:mod:`lightning_zero.memory.probe`) and prints
:func:`lightning_zero.auto.plan.make_plan`'s table. It sits above the CLI so that the memory modules, which
``zero_auto`` uses, never import it.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import move_data_to_device

from lightning_zero.app.cli import ZeroCLI
from lightning_zero.app.data.base import TokenizerDataModule
from lightning_zero.app.preflight import check_config_file
from lightning_zero.auto.plan import PlanRow, format_plan, make_plan
from lightning_zero.errors import ZeroConfigError
from lightning_zero.internals import abstract_tensors
from lightning_zero.memory.budget import GIB
from lightning_zero.memory.probe import ActivationProbe, probe_activations
from lightning_zero.memory.states import ParameterShapes
from lightning_zero.runtime.batches import samples_in, training_loss

#: Batches of examples a data module of ours prepares for ``plan``, which probes its first batch.
PLAN_BATCHES = 8


@dataclass(frozen=True)
class ConfigPlan:
    """A planned YAML config: its devices, precision and micro-batch, the probe, and the rows."""

    devices: int
    nodes: int
    precision: str
    micro_batch: int
    budget_gib: float
    probe: ActivationProbe
    rows: list[PlanRow]


def _trainer_section(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ZeroConfigError(f"Config file {str(path)!r} does not exist: pass an existing YAML file to --config.")
    check_config_file(path)
    loaded = yaml.safe_load(path.read_text())
    return dict(loaded.get("trainer") or {})


def _budget_from(trainer: dict[str, Any], budget_gib: float | None, device: torch.device) -> float:
    if budget_gib is not None:
        return budget_gib
    strategy = trainer.get("strategy")
    zero = strategy.get("init_args", {}).get("zero", {}) if isinstance(strategy, dict) else {}
    if zero.get("memory_budget_gib"):
        return float(zero["memory_budget_gib"])
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / GIB
    raise ZeroConfigError("No memory budget on CPU: give one with --budget-gib (e.g. --budget-gib 24).")


def plan_for_config(
    path: str | Path, budget_gib: float | None = None, devices: int | None = None, nodes: int | None = None
) -> ConfigPlan:
    """Build the config's model and data, probe one batch, and plan every layout.

    On a CPU the model is built and run with abstract tensors (shapes and storages, no memory, no values): an 8B
    model plans in seconds within a few hundred MB. A model with an operation that has no abstract form (an output
    shape that depends on values) is built and probed for real. On CUDA it is probed for real on the device, which
    also measures the allocator's peaks.
    """
    config = Path(path)
    trainer = _trainer_section(config)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    precision = str(trainer.get("precision", "32-true"))
    module, data = _built(config)
    batch = _first_batch(module, data)
    if device.type == "cuda":
        shapes, probe = _probe_for_real(module, batch, precision, device)
    else:
        try:
            shapes, probe = _probe_abstractly(module, batch, precision)
        except RuntimeError:
            module, _ = _built(config)  # the abstract attempt built its network from abstract tensors
            shapes, probe = _probe_for_real(module, batch, precision, device)
    budget = _budget_from(trainer, budget_gib, device)
    devices = devices or _count(trainer.get("devices", 1))
    nodes = nodes or int(trainer.get("num_nodes", 1))
    rows = make_plan(shapes, probe, budget, devices, nodes, precision, samples_in(batch))
    return ConfigPlan(devices, nodes, precision, samples_in(batch), budget, probe, rows)


def _built(config: Path) -> tuple[LightningModule, Any]:
    """The config's module, attached to its Trainer, and data module, built on the CPU in one process in fp32."""
    overrides = ["--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.strategy", "ddp"]
    overrides += ["--trainer.precision", "32-true", "--trainer.logger", "false"]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*args parameter is intended")
        cli = ZeroCLI(args=["--config", str(config), *overrides], run=False)
    module = cli.model
    module.trainer = cli.trainer
    return module, cli.datamodule


def _probe_abstractly(module: LightningModule, batch: Any, precision: str) -> tuple[ParameterShapes, ActivationProbe]:
    with abstract_tensors():
        module.configure_model()
        probe = probe_activations(module, training_loss(module), batch, precision, torch.device("cpu"))
        shapes = ParameterShapes.of(module)
    return shapes, dataclasses.replace(probe, method="saved tensors, abstract")


def _probe_for_real(
    module: LightningModule, batch: Any, precision: str, device: torch.device
) -> tuple[ParameterShapes, ActivationProbe]:
    module.configure_model()
    module.to(device)
    probe = probe_activations(module, training_loss(module), move_data_to_device(batch, device), precision, device)
    return ParameterShapes.of(module), probe


def _first_batch(module: LightningModule, data: Any) -> Any:
    source = data if data is not None else module
    if isinstance(data, TokenizerDataModule):  # one batch is probed: prepare a few batches' worth, not the corpus
        data.limit_train = min(data.limit_train or PLAN_BATCHES * data.batch_size, PLAN_BATCHES * data.batch_size)
        data.limit_val = min(data.limit_val or data.batch_size, data.batch_size)
    if data is not None:
        data.prepare_data()
        data.setup("fit")
    return next(iter(source.train_dataloader()))


def _count(devices: Any) -> int:
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if isinstance(devices, int) and devices > 0:
        return devices
    if isinstance(devices, str) and devices.isdigit():
        return int(devices)
    return torch.cuda.device_count() if torch.cuda.is_available() else 1


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        value = kind(text)
        if value <= 0 or not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    """The ``plan`` command's options."""
    parser = argparse.ArgumentParser(
        prog="lightning-zero plan",
        description="Which strategies and batch sizes fit a config's model and data in this machine's memory.",
        exit_on_error=False,
        allow_abbrev=False,
    )
    parser.add_argument("--config", help="a fit YAML config (model and data are built from it)")
    parser.add_argument("--budget-gib", type=_positive(float), help="memory per device; default: config or device")
    parser.add_argument("--devices", type=_positive(int), help="devices per node; default: the config's")
    parser.add_argument("--nodes", type=_positive(int), help="nodes; default: the config's")
    return parser


def main(argv: Sequence[str]) -> int:
    """``lightning-zero plan``: print the table for a config; exit status 0."""
    parser = build_parser()
    try:
        args, unknown = parser.parse_known_args(list(argv))
    except argparse.ArgumentError as error:
        raise ZeroConfigError(f"plan: {error}") from None
    if unknown:
        raise ZeroConfigError(f"plan: unknown arguments {unknown}: use --config, --budget-gib, --devices, --nodes.")
    if args.config is None:
        raise ZeroConfigError("plan needs a config: lightning-zero plan --config X.yaml [--budget-gib 24].")
    result = plan_for_config(args.config, args.budget_gib, args.devices, args.nodes)
    print(
        f"{result.devices} device(s) x {result.nodes} node(s), {result.precision};"
        f" activations per sample {result.probe.per_sample / 2**20:.2f} MiB,"
        f" {result.probe.per_sample_checkpointed / 2**20:.2f} MiB checkpointed ({result.probe.method})"
    )
    print(format_plan(result.rows, result.budget_gib, result.micro_batch))
    return 0
