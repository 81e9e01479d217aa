"""What a configuration keeps per device and per host for the model states: parameters, gradients, optimizer.

Element counts follow each backend's own partitioning (DeepSpeed's padded flat partitions at stages 1-2 and
per-parameter partitions at stage 3, FairScale OSS's greedy whole-parameter split, FSDP2's row shards), so
they equal what :mod:`lightning_zero.memory.footprint` measures on a rank. Bytes assume an Adam-like
optimizer (two fp32 states per element). For DeepSpeed stages 2 and 3 under 16-bit mixed precision the device
and host bytes are DeepSpeed's own estimators' figures.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from torch import nn

from lightning_zero.memory.footprint import full_numel
from lightning_zero.precision import half_dtype, mixed_dtype
from lightning_zero.preset_table import PRESETS

ADAM_STATES = 2
FP32 = 4
_DEEPSPEED_ALIGNMENT = 2  # DeepSpeed aligns flat stage 1-2 partitions to 2 elements per rank


#: The fields of a backend's config that say its layout (:meth:`Layout.of`); the others say how it runs.
LAYOUT_FIELDS = (
    "stage",
    "offload_optimizer",
    "offload_parameters",
    "offload_ratio",
    "activation_checkpointing",
    "activation_offload",
    "optimizer_in_backward",
    "low_memory_optimizer",
)
#: The one-card fields (:class:`~lightning_zero.strategies.onecard_config.OneCardConfig`), at their defaults.
ONECARD_DEFAULTS: dict[str, Any] = {
    "activation_offload": False,
    "optimizer_in_backward": False,
    "low_memory_optimizer": "none",
}
#: Bytes of the two Adam states per element under each low-memory optimizer (0: the parameters' own dtype).
LOW_MEMORY_STATE_BYTES = {"none": 0, "adamw8bit": 2, "paged_adamw8bit": 2, "adamw4bit": 1, "adamw_bf16": 4}


@dataclass(frozen=True)
class Layout:
    """One way to lay out training: backend, ZeRO stage, offload targets, activation checkpointing, and the one-card
    levers.

    Args:
        backend: ``"ddp"``, ``"deepspeed"``, ``"fairscale"``, ``"fsdp2"`` or ``"onecard"``.
        stage: ZeRO stage (0 for DDP and one card).
        offload_optimizer: Optimizer state and step on the host.
        offload_parameters: Parameters on the host between uses (stage 3).
        offload_ratio: Share of the optimizer state offloaded (DeepSpeed stage 3 accepts less than 1).
        activation_checkpointing: Recompute block activations in backward.
        activation_offload: Tensors saved for backward kept in host memory (one card).
        optimizer_in_backward: Each parameter stepped as its gradient completes (one card).
        low_memory_optimizer: AdamW with smaller states on the device (one card; approximate unless ``"none"``).
    """

    backend: str
    stage: int
    offload_optimizer: bool = False
    offload_parameters: bool = False
    offload_ratio: float = 1.0
    activation_checkpointing: bool = False
    activation_offload: bool = False
    optimizer_in_backward: bool = False
    low_memory_optimizer: str = "none"

    @classmethod
    def of(cls, backend: str, fields: Mapping[str, Any]) -> Layout:
        """The layout a backend config's fields ask for: a preset's fields, or a config's own (each missing field at
        its default). The one conversion from configs to layouts; :meth:`config_fields` is its inverse."""
        return cls(
            backend=backend,
            stage=int(fields.get("stage", 0)),
            offload_optimizer=fields.get("offload_optimizer", "none") != "none",
            offload_parameters=fields.get("offload_parameters", "none") != "none",
            offload_ratio=float(fields.get("offload_ratio", 1.0)),
            activation_checkpointing=bool(fields.get("activation_checkpointing", False)),
            **{name: type(default)(fields.get(name, default)) for name, default in ONECARD_DEFAULTS.items()},
        )

    def config_fields(self, offload_device: str = "cpu") -> dict[str, Any]:
        """The fields of a backend config that ask for this layout, offloading to ``offload_device``."""
        fields: dict[str, Any] = {
            "stage": self.stage,
            "offload_optimizer": offload_device if self.offload_optimizer else "none",
            "offload_parameters": offload_device if self.offload_parameters else "none",
            "activation_checkpointing": self.activation_checkpointing,
        }
        if self.offload_ratio != 1.0:
            fields["offload_ratio"] = self.offload_ratio
        fields.update((name, value) for name, value in self.onecard_fields().items() if value != ONECARD_DEFAULTS[name])
        return fields

    def onecard_fields(self) -> dict[str, Any]:
        """This layout's one-card levers, by field name."""
        return {name: getattr(self, name) for name in ONECARD_DEFAULTS}

    @property
    def memory_saving(self) -> tuple[int, int, float, int]:
        """How much memory this layout saves, to sort by, least first: offload targets, stage, the offloaded share
        (a partial optimizer offload saves less), then a low-memory optimizer."""
        offloads = int(self.offload_optimizer) + int(self.offload_parameters)
        return offloads, self.stage, self.offload_ratio, int(self.approximate)

    @property
    def approximate(self) -> bool:
        """Whether training under this layout does not compute exact AdamW (a low-memory optimizer)."""
        return self.low_memory_optimizer != "none"

    @property
    def name(self) -> str:
        """The name of the preset with this layout (:data:`~lightning_zero.preset_table.PRESETS`), then ``+ckpt``
        and ``+act_offload`` for activation checkpointing and offload; a layout between presets (DDP, an optimizer
        offload at stage 1, a stage-3 optimizer offload without the parameters) is named after its stage, e.g.
        ``zero3_offload_opt0.5+ckpt``."""
        bare = replace(self, activation_checkpointing=False, activation_offload=False)
        base = next((name for name, layout in preset_layouts() if layout == bare), None) or _between_presets(bare)
        return (
            base
            + ("+ckpt" if self.activation_checkpointing else "")
            + ("+act_offload" if self.activation_offload else "")
        )


def preset_layouts() -> list[tuple[str, Layout]]:
    """Each preset's name and layout, in table order: the presets that shard or run on one card (not ``zero_auto``),
    NVMe offload as CPU offload's layout under its own name."""
    return [(preset.name, Layout.of(preset.backend, preset.fields)) for preset in PRESETS if preset.backend != "auto"]


def _between_presets(layout: Layout) -> str:
    if layout.backend == "ddp":
        return "ddp"
    suffix = "_offload" if layout.stage < 3 else "_offload_opt"
    ratio = f"{layout.offload_ratio:g}" if layout.offload_ratio < 1.0 else ""
    return f"zero{layout.stage}{suffix}{ratio}" if layout.offload_optimizer else f"zero{layout.stage}_{layout.backend}"


@dataclass(frozen=True)
class ParameterShapes:
    """The trainable parameters of a model (each shared tensor once), as shapes; enough to plan its memory."""

    shapes: tuple[tuple[int, ...], ...]
    largest_layer: int

    @classmethod
    def of(cls, model: nn.Module) -> ParameterShapes:
        """Read the shapes of ``model``'s trainable parameters (the full shapes when ZeRO-3 already partitioned)."""
        shapes = tuple(tuple(getattr(p, "ds_shape", p.shape)) for p in model.parameters() if p.requires_grad)
        largest = max(
            (sum(full_numel(p) for p in module.parameters(recurse=False)) for module in model.modules()), default=0
        )
        return cls(shapes=shapes, largest_layer=largest)

    @property
    def numels(self) -> list[int]:
        return [math.prod(shape) for shape in self.shapes]

    @property
    def total(self) -> int:
        return sum(self.numels)


@dataclass(frozen=True)
class ModelStates:
    """Model states of the most loaded rank under one layout.

    ``local_parameters`` and ``optimizer_state`` are element counts comparable with
    :class:`~lightning_zero.memory.footprint.Footprint`; the bytes are what the device and each host hold.
    """

    local_parameters: int
    optimizer_state: int
    device_bytes: int
    host_bytes: int
    deepspeed_estimate: bool


@dataclass(frozen=True)
class Precision:
    """Bytes per element of what a backend stores under a Trainer precision."""

    parameter: int
    gradient: int
    master: int

    @classmethod
    def of(cls, precision: str, backend: str) -> Precision:
        """DeepSpeed keeps 16-bit parameters and gradients plus an fp32 master copy under ``*-mixed``; the other
        backends keep fp32 parameters and autocast."""
        if backend == "deepspeed" and mixed_dtype(precision) is not None:
            return cls(parameter=2, gradient=2, master=FP32)
        if half_dtype(precision) is not None and precision.endswith("-true"):
            return cls(parameter=2, gradient=2, master=0)
        return cls(parameter=FP32, gradient=FP32, master=0)


def row_shard(shape: tuple[int, ...], world: int) -> int:
    """Elements of rank 0's shard when dimension 0 is split into ``world`` chunks (torch.chunk, as FSDP2)."""
    if not shape:
        return 1
    chunk = math.ceil(shape[0] / world)
    return min(chunk, shape[0]) * math.prod(shape[1:])


def greedy_shares(numels: list[int], world: int) -> list[int]:
    """Elements each rank owns when whole parameters go, in order, to the least loaded rank (FairScale OSS)."""
    sizes = [0] * world
    for numel in numels:
        sizes[sizes.index(min(sizes))] += numel
    return sizes


def flat_partition(total: int, world: int) -> int:
    """DeepSpeed stage 1-2: one rank's share of the flat, padded parameter group."""
    alignment = _DEEPSPEED_ALIGNMENT * world
    return math.ceil(total / alignment) * alignment // world


def partitioned_elements(shapes: ParameterShapes, layout: Layout, world: int) -> tuple[int, int]:
    """``(local parameters, optimizer partition)`` of the most loaded rank, in elements."""
    numels = shapes.numels
    total = sum(numels)
    if layout.backend == "ddp" or layout.stage == 0:
        return total, total
    if layout.backend == "deepspeed":
        if layout.stage == 3:
            local = sum(math.ceil(n / world) for n in numels)
            return local, local
        return total, flat_partition(total, world)
    if layout.backend == "fairscale":
        return total, max(greedy_shares(numels, world))
    local = sum(row_shard(shape, world) for shape in shapes.shapes)
    return local, local


def model_states(
    shapes: ParameterShapes, layout: Layout, devices: int, nodes: int = 1, precision: str = "32-true"
) -> ModelStates:
    """The model states of ``shapes`` under ``layout`` on ``nodes`` hosts of ``devices`` devices each."""
    if layout.backend == "onecard":
        return onecard_states(shapes, layout, precision)
    world = devices * nodes
    local, partition = partitioned_elements(shapes, layout, world)
    bytes_ = Precision.of(precision, layout.backend)
    total = shapes.total
    on_host = layout.offload_ratio if layout.offload_optimizer else 0.0
    sharded_gradients = layout.stage >= 2 and layout.backend != "ddp"
    gradients = partition if sharded_gradients else total
    optimizer_bytes = partition * (ADAM_STATES * FP32 + bytes_.master)
    # Offloaded parameters come to the device one layer at a time.
    device = (shapes.largest_layer if layout.offload_parameters else local) * bytes_.parameter
    device += 0 if layout.offload_optimizer else gradients * bytes_.gradient
    device += int(optimizer_bytes * (1.0 - on_host))
    if layout.backend == "fsdp2" and layout.stage == 2:
        device += total * bytes_.parameter  # gathered parameters stay from forward to backward
    host = int(optimizer_bytes * on_host) + (partition * FP32 if layout.offload_optimizer else 0)
    host += local * bytes_.parameter if layout.offload_parameters else 0
    estimate = _deepspeed_estimate(shapes, layout, devices, nodes) if bytes_.master else None
    if estimate is not None:
        host, device = estimate
    return ModelStates(
        local_parameters=local,
        optimizer_state=ADAM_STATES * partition,
        device_bytes=device,
        host_bytes=host if estimate is not None else host * devices,
        deepspeed_estimate=estimate is not None,
    )


def onecard_states(shapes: ParameterShapes, layout: Layout, precision: str) -> ModelStates:
    """The model states of one device without sharding under the one-card levers of ``layout``.

    The parameters stay on the device in the precision's dtype. A gradient stepped in backward, or copied to the host
    as it completes (optimizer offload), is freed at once: one layer's gradients at a time, not the model's. The Adam
    states are in the parameters' dtype, smaller under a low-memory optimizer; offloaded, the host holds them with a
    copy of the parameters and of the gradients (torchao's ``CPUOffloadOptimizer``).
    """
    total = shapes.total
    element = Precision.of(precision, layout.backend).parameter
    one_at_a_time = layout.optimizer_in_backward or layout.offload_optimizer
    gradients = (shapes.largest_layer if one_at_a_time else total) * element
    state_bytes = LOW_MEMORY_STATE_BYTES[layout.low_memory_optimizer] or ADAM_STATES * element
    optimizer = total * state_bytes
    device = total * element + gradients + (0 if layout.offload_optimizer else optimizer)
    host = optimizer + 2 * total * element if layout.offload_optimizer else 0
    return ModelStates(
        local_parameters=total,
        optimizer_state=ADAM_STATES * total,
        device_bytes=device,
        host_bytes=host,
        deepspeed_estimate=False,
    )


def _deepspeed_estimate(shapes: ParameterShapes, layout: Layout, devices: int, nodes: int) -> tuple[int, int] | None:
    """DeepSpeed's ``(host bytes, device bytes)`` estimate for stage 2 and 3 with full offload ratios."""
    if layout.backend != "deepspeed" or layout.stage < 2 or layout.offload_ratio < 1.0:
        return None
    if layout.stage == 2:
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        host, device = estimate_zero2_model_states_mem_needs(
            shapes.total, num_gpus_per_node=devices, num_nodes=nodes, cpu_offload=layout.offload_optimizer
        )
        return int(host), int(device)
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    host, device, _ = estimate_zero3_model_states_mem_needs(
        shapes.total,
        shapes.largest_layer,
        num_gpus_per_node=devices,
        num_nodes=nodes,
        cpu_offload=layout.offload_optimizer,
        cpu_offload_params=layout.offload_parameters,
    )
    return int(host), int(device)
