"""A per-process memory budget: cap the accelerator, check host RAM for offload, refuse layouts that cannot fit.

Each strategy calls :func:`apply_memory_budget` at the start of its ``setup``, once the model exists. On CUDA
the budget caps what the process may allocate (``torch.cuda.set_per_process_memory_fraction``), so a large
card behaves like a smaller one. When the model states alone exceed the budget, the error names the first
layout of the same backend (least sharding and offload first) whose model states do fit.
"""

from __future__ import annotations

from typing import Any

import psutil
import torch
from torch import nn

from lightning_zero.errors import ZeroConfigError
from lightning_zero.memory.states import LAYOUT_FIELDS, Layout, ModelStates, ParameterShapes, model_states
from lightning_zero.preset_table import PRESETS, Preset
from lightning_zero.sharding import BudgetedStrategy

GIB = 2**30


def preset_layout(preset: Preset) -> Layout:
    """The :class:`Layout` a preset's fields ask for (its backend's config defaults for the rest)."""
    return Layout.of(preset.backend, preset.fields)


def escalation(backend: str) -> list[tuple[str, Layout]]:
    """The presets ``backend`` can switch to, least sharding and offload first; a backend with no CPU-offload
    preset of its own ends with DeepSpeed's that offloads most. NVMe is left out (it needs a path)."""
    presets = [preset for preset in PRESETS if preset.backend == backend and "nvme" not in preset.fields.values()]
    own = sorted(((preset.name, preset_layout(preset)) for preset in presets), key=lambda item: item[1].memory_saving)
    if own and not any(layout.offload_optimizer for _, layout in own):
        deepspeed = escalation("deepspeed")
        own.append(max(deepspeed, key=lambda item: item[1].memory_saving))
    return own


def readable_size(num_bytes: float) -> str:
    """``num_bytes`` in GiB, or in MiB below a hundredth of a GiB."""
    return f"{num_bytes / GIB:.2f} GiB" if num_bytes >= GIB / 100 else f"{num_bytes / 2**20:.2f} MiB"


def layout_of(backend: str, zero: Any) -> Layout:
    """The :class:`Layout` a backend's typed ZeRO config asks for (a partial stage-3 offload's ratio included)."""
    return Layout.of(backend, {name: getattr(zero, name) for name in LAYOUT_FIELDS if hasattr(zero, name)})


def cap_device_memory(device: torch.device, budget_gib: float) -> None:
    """Let this process allocate at most ``budget_gib`` on a CUDA ``device`` (no effect elsewhere)."""
    if device.type != "cuda":
        return
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget_gib * GIB / total), device)


def lift_memory_budget(strategy: BudgetedStrategy) -> None:
    """Undo :func:`apply_memory_budget`'s cap on the process's GPU memory (the strategy's ``teardown``): the cap is
    process-wide, and a later run in the same process must not inherit it."""
    device = strategy.root_device
    if strategy.zero.memory_budget_gib is not None and device.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(1.0, device)


def check_host_memory(needed_bytes: int, what: str, available_bytes: int | None = None) -> None:
    """Raise when the host has less free RAM than ``needed_bytes`` for ``what``."""
    available = psutil.virtual_memory().available if available_bytes is None else available_bytes
    if needed_bytes > available:
        raise ZeroConfigError(
            f"{what} needs {readable_size(needed_bytes)} of host RAM but {readable_size(available)} is free:"
            " free host memory, use more hosts, or offload to NVMe."
        )


def smallest_fitting(
    shapes: ParameterShapes, backend: str, budget_bytes: int, devices: int, nodes: int, precision: str
) -> tuple[str, ModelStates] | None:
    """The first preset of ``backend``'s escalation whose model states fit ``budget_bytes`` per device."""
    for name, layout in escalation(backend):
        states = model_states(shapes, layout, devices, nodes, precision)
        if states.device_bytes <= budget_bytes:
            return name, states
    return None


def check_model_states_fit(
    shapes: ParameterShapes, layout: Layout, budget_gib: float, devices: int, nodes: int, precision: str
) -> ModelStates:
    """The model states of ``layout``; raise naming the smallest layout that fits when they exceed the budget."""
    budget = int(budget_gib * GIB)
    states = model_states(shapes, layout, devices, nodes, precision)
    if states.device_bytes <= budget:
        return states
    need = f"{layout.name} needs {readable_size(states.device_bytes)} per device for the model states alone"
    found = smallest_fitting(shapes, layout.backend, budget, devices, nodes, precision)
    if found is None:
        raise ZeroConfigError(
            f"{need}, over `memory_budget_gib: {budget_gib:g}`, and no layout fits on {devices * nodes} device(s):"
            " raise the budget or add devices."
        )
    name, fitting = found
    raise ZeroConfigError(
        f"{need}, over `memory_budget_gib: {budget_gib:g}`: use strategy `{name}`"
        f" ({readable_size(fitting.device_bytes)}) or raise the budget."
    )


def apply_memory_budget(strategy: BudgetedStrategy, backend: str, model: nn.Module | None = None) -> None:
    """Apply ``strategy.zero.memory_budget_gib`` (when set) for the model being set up; called from ``setup``."""
    budget_gib = strategy.zero.memory_budget_gib
    if budget_gib is None:
        return
    module = model if model is not None else strategy.model
    assert module is not None, "the budget is applied once the model exists"
    devices = strategy.num_processes
    nodes = strategy.num_nodes
    states = check_model_states_fit(
        ParameterShapes.of(module),
        layout_of(backend, strategy.zero),
        budget_gib,
        devices,
        nodes,
        str(strategy.precision_plugin.precision),
    )
    if strategy.zero.offloads:
        check_host_memory(states.host_bytes, "Offloaded model states")
    cap_device_memory(strategy.root_device, budget_gib)
