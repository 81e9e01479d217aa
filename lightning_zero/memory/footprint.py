"""What one rank actually holds: parameter elements (local vs full) and optimizer-state elements.

Works across backends: DeepSpeed ZeRO-3 parameters keep their local partition in ``ds_tensor``, FSDP2
parameters are DTensors with a local shard, and sharded optimizers keep state only for their partition.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class Footprint:
    """Element counts held by one rank."""

    local_parameters: int
    full_parameters: int
    optimizer_state: int


def local_numel(parameter: torch.Tensor) -> int:
    """Elements of ``parameter`` stored on this rank."""
    if hasattr(parameter, "ds_tensor"):
        return parameter.ds_tensor.numel()
    if hasattr(parameter, "to_local"):
        return parameter.to_local().numel()
    return parameter.numel()


def full_numel(parameter: torch.Tensor) -> int:
    """Elements of ``parameter`` in the whole, unsharded model."""
    if hasattr(parameter, "ds_numel"):
        return int(parameter.ds_numel)
    return parameter.numel()


def innermost_optimizer(optimizer: Any) -> Any:
    """Unwrap ZeRO/Lightning optimizer wrappers down to the optimizer that owns the state."""
    seen = set()
    while id(optimizer) not in seen:
        seen.add(id(optimizer))
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "optim", None)
        if inner is None or not hasattr(inner, "param_groups"):
            break
        optimizer = inner
    return optimizer


def optimizer_state_numel(optimizer: Any) -> int:
    """Elements of the per-parameter tensors (e.g. Adam moments) an optimizer holds on this rank."""
    state = innermost_optimizer(optimizer).state
    return sum(
        local_numel(value)
        for per_parameter in state.values()
        for value in per_parameter.values()
        if isinstance(value, torch.Tensor) and value.dim() > 0
    )


def rank_footprint(model: nn.Module, optimizers: Iterable[Any]) -> Footprint:
    """The footprint of ``model`` and ``optimizers`` on this rank."""
    parameters = list(model.parameters())
    return Footprint(
        local_parameters=sum(local_numel(p) for p in parameters),
        full_parameters=sum(full_numel(p) for p in parameters),
        optimizer_state=sum(optimizer_state_numel(o) for o in optimizers),
    )
