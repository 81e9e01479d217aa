"""``lightning-zero plan``: what each layout would need per device and per host, and the largest micro-batch it fits.

    lightning-zero plan --config configs/gpt2xl_offload.yaml --budget-gib 24
    lightning-zero plan --config configs/quickstart.yaml --budget-gib 4 --devices 2

For every candidate layout (DDP; DeepSpeed ZeRO-1/2/3 with each offload variant, including a partial optimizer
offload at stage 3; FairScale; FSDP2; each with and without activation checkpointing) the table gives the model
states per device and per host (:mod:`lightning_zero.memory.states`), the activation bytes per sample measured
by a short real probe of the configured model on a batch of the configured data
(:mod:`lightning_zero.memory.probe`), the predicted largest micro-batch within the budget, and whether the
configured micro-batch fits.

From Python: ``make_plan(shapes, probe, budget_gib=24, devices=1)`` returns the rows; ``plan_for_config(path)``
builds the model and data of a YAML config, probes them and plans.
"""

from __future__ import annotations

import argparse
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from lightning.pytorch import LightningModule

from lightning_zero.errors import ZeroConfigError
from lightning_zero.memory.budget import GIB
from lightning_zero.memory.probe import ActivationProbe, probe_activations, to_device, training_loss
from lightning_zero.memory.states import Layout, ModelStates, ParameterShapes, Precision, model_states

#: Share of the budget kept free for allocator fragmentation and framework workspaces.
HEADROOM = 0.1
#: Elements of DeepSpeed's default reduce bucket (stages 1-2) and stage-3 prefetch bucket.
REDUCE_BUCKET = 200_000_000
PREFETCH_BUCKET = 50_000_000
PARTIAL_OFFLOAD_RATIO = 0.5


def candidate_layouts(partial_ratio: float = PARTIAL_OFFLOAD_RATIO) -> list[Layout]:
    """Every layout the plan considers, least memory-saving first, each without and with checkpointing."""
    base = [
        Layout("ddp", 0),
        Layout("deepspeed", 1),
        Layout("deepspeed", 2),
        Layout("deepspeed", 3),
        Layout("deepspeed", 1, offload_optimizer=True),
        Layout("deepspeed", 2, offload_optimizer=True),
        Layout("deepspeed", 3, offload_optimizer=True, offload_ratio=partial_ratio),
        Layout("deepspeed", 3, offload_optimizer=True),
        Layout("deepspeed", 3, offload_optimizer=True, offload_parameters=True),
        Layout("fairscale", 1),
        Layout("fairscale", 2),
        Layout("fsdp2", 2),
        Layout("fsdp2", 3),
        Layout("fsdp2", 3, offload_optimizer=True, offload_parameters=True),
    ]
    return [Layout(**{**vars(layout), "activation_checkpointing": ckpt}) for layout in base for ckpt in (False, True)]


def buffer_bytes(shapes: ParameterShapes, layout: Layout, precision: str) -> int:
    """Communication buffers a layout keeps besides the model states (default bucket sizes)."""
    element = Precision.of(precision, layout.backend)
    total = shapes.total
    if layout.backend == "deepspeed" and layout.stage in (1, 2):
        return 2 * min(REDUCE_BUCKET, total) * element.gradient
    if layout.backend == "deepspeed" and layout.stage == 3:
        return min(PREFETCH_BUCKET, total) * element.parameter
    if layout.backend == "fsdp2":
        return 2 * shapes.largest_layer * element.parameter
    return 0


@dataclass(frozen=True)
class PlanRow:
    """One layout's prediction."""

    layout: Layout
    states: ModelStates
    buffers: int
    activation_per_sample: int
    max_micro_batch: int
    fits: bool


def max_micro_batch(free_bytes: float, per_sample: int, limit: int = 1_000_000) -> int:
    """How many samples of ``per_sample`` bytes fit in ``free_bytes`` (capped at ``limit``)."""
    if free_bytes <= 0:
        return 0
    return limit if per_sample <= 0 else min(limit, int(free_bytes // per_sample))


def make_plan(
    shapes: ParameterShapes,
    probe: ActivationProbe,
    budget_gib: float,
    devices: int = 1,
    nodes: int = 1,
    precision: str = "32-true",
    micro_batch: int = 1,
    layouts: Sequence[Layout] | None = None,
) -> list[PlanRow]:
    """Predict every layout's model states, largest micro-batch, and whether ``micro_batch`` fits the budget."""
    usable = budget_gib * GIB * (1.0 - HEADROOM)
    rows = []
    for layout in layouts if layouts is not None else candidate_layouts():
        states = model_states(shapes, layout, devices, nodes, precision)
        buffers = buffer_bytes(shapes, layout, precision)
        ckpt = layout.activation_checkpointing
        per_sample = probe.per_sample_checkpointed if ckpt else probe.per_sample
        fixed = probe.fixed_checkpointed if ckpt else probe.fixed
        largest = max_micro_batch(usable - states.device_bytes - buffers - fixed, per_sample)
        rows.append(PlanRow(layout, states, buffers, per_sample, largest, fits=largest >= micro_batch))
    return rows


def _mib(value: float) -> str:
    return f"{value / 2**20:.1f}"


def format_plan(rows: Sequence[PlanRow], budget_gib: float, micro_batch: int) -> str:
    """The plan as a fixed-width table."""
    header = (
        "layout",
        "params/dev",
        "optim elems",
        "states MiB/dev",
        "host MiB",
        "act MiB/sample",
        "max batch",
        "fits",
    )
    lines = [
        f"budget {budget_gib:g} GiB per device ({HEADROOM:.0%} kept free); configured micro-batch {micro_batch};"
        " * = DeepSpeed's estimator"
    ]
    table = [header]
    for row in rows:
        mark = "*" if row.states.deepspeed_estimate else ""
        table.append(
            (
                row.layout.name,
                str(row.states.local_parameters),
                str(row.states.optimizer_state),
                _mib(row.states.device_bytes + row.buffers) + mark,
                _mib(row.states.host_bytes) + mark,
                f"{row.activation_per_sample / 2**20:.3f}",
                str(row.max_micro_batch),
                "yes" if row.fits else "no",
            )
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in table]
    return "\n".join(lines)


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
    loaded = yaml.safe_load(path.read_text()) or {}
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
    """Build the config's model and data, probe one batch on this machine's device, and plan every layout."""
    from lightning_zero.cli import ZeroCLI

    config = Path(path)
    trainer = _trainer_section(config)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    precision = str(trainer.get("precision", "32-true"))
    overrides = ["--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.strategy", "ddp"]
    overrides += ["--trainer.precision", "32-true", "--trainer.logger", "false"]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*args parameter is intended")
        cli = ZeroCLI(args=["--config", str(config), *overrides], run=False)
    module = cli.model
    module.trainer = cli.trainer
    module.configure_model()
    module.to(device)
    batch = _first_batch(module, cli.datamodule)
    micro_batch = len(next(iter(batch.values())) if isinstance(batch, dict) else batch[0])
    probe = probe_activations(module, training_loss(module), to_device(batch, device), precision, device)
    budget = _budget_from(trainer, budget_gib, device)
    devices = devices or _count(trainer.get("devices", 1))
    nodes = nodes or int(trainer.get("num_nodes", 1))
    rows = make_plan(ParameterShapes.of(module), probe, budget, devices, nodes, precision, micro_batch)
    return ConfigPlan(devices, nodes, precision, micro_batch, budget, probe, rows)


def _first_batch(module: LightningModule, data: Any) -> Any:
    source = data if data is not None else module
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


def main(argv: Sequence[str]) -> int:
    """``lightning-zero plan``: print the table for a config; exit status 0."""
    parser = argparse.ArgumentParser(
        prog="lightning-zero plan", description=__doc__.splitlines()[0], exit_on_error=False, allow_abbrev=False
    )
    parser.add_argument("--config", help="a fit YAML config (model and data are built from it)")
    parser.add_argument("--budget-gib", type=_positive(float), help="memory per device; default: config or device")
    parser.add_argument("--devices", type=_positive(int), help="devices per node; default: the config's")
    parser.add_argument("--nodes", type=_positive(int), help="nodes; default: the config's")
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
