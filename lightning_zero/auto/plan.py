"""What each layout would need per device and per host, and the largest micro-batch it fits.

For every candidate layout (:func:`candidate_layouts`: DDP, every preset's layout, DeepSpeed's optimizer offloads
between presets; each with and without activation checkpointing, the one-card ones also with activation offload)
the table gives the model states per device and per host (:mod:`lightning_zero.memory.states`), the activation
bytes per sample measured by a short real probe of the configured model on a batch of the configured data
(:mod:`lightning_zero.memory.probe`), the predicted largest micro-batch within the budget, and whether the
configured micro-batch fits.

From Python: ``make_plan(shapes, probe, budget_gib=24, devices=1)`` returns the rows. The ``lightning-zero plan``
command, which builds a YAML config's model and data first, is :mod:`lightning_zero.app.plan_command`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from lightning_zero.memory.budget import GIB
from lightning_zero.memory.probe import ActivationProbe
from lightning_zero.memory.states import Layout, ModelStates, ParameterShapes, Precision, model_states, preset_layouts
from lightning_zero.strategies.deepspeed_config import PREFETCH_BUCKET, REDUCE_BUCKET

#: Share of the budget kept free for allocator fragmentation and framework workspaces.
HEADROOM = 0.1
PARTIAL_OFFLOAD_RATIO = 0.5


def candidate_layouts(partial_ratio: float = PARTIAL_OFFLOAD_RATIO) -> list[Layout]:
    """Every layout the plan considers, each without and with checkpointing: DDP, every preset's layout (the preset
    table's; NVMe planned as CPU offload), and DeepSpeed's optimizer offloads between presets (at stage 1, and at
    stage 3 with the parameters kept on the device, whole and in part); the one-card layouts also with checkpointed
    activations offloaded. Least memory-saving first within each backend."""
    presets = [layout for _, layout in preset_layouts()]
    between = [
        Layout("deepspeed", 1, offload_optimizer=True),
        Layout("deepspeed", 3, offload_optimizer=True, offload_ratio=partial_ratio),
        Layout("deepspeed", 3, offload_optimizer=True),
    ]
    unique = list(dict.fromkeys([Layout("ddp", 0), *presets, *between]))
    unique.sort(key=lambda layout: (_BACKEND_ORDER.index(layout.backend), layout.memory_saving))
    variants = []
    for layout in unique:
        for ckpt in (False, True):
            offloads = (False, True) if layout.backend == "onecard" and ckpt else (False,)
            variants += [replace(layout, activation_checkpointing=ckpt, activation_offload=act) for act in offloads]
    return variants


_BACKEND_ORDER = ("ddp", "deepspeed", "fairscale", "fsdp2", "onecard")


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


def device_activations(probe: ActivationProbe, layout: Layout) -> tuple[int, int]:
    """``(bytes per sample, fixed bytes)`` of activations on the device under ``layout``. Offloaded activations
    leave none per sample there (what a block's recompute or its transients need is the trial's to measure)."""
    ckpt = layout.activation_checkpointing
    fixed = probe.fixed_checkpointed if ckpt else probe.fixed
    if layout.activation_offload:
        return 0, fixed
    return (probe.per_sample_checkpointed if ckpt else probe.per_sample), fixed


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
        per_sample, fixed = device_activations(probe, layout)
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
