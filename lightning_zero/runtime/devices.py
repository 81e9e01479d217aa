"""Moving optimizer state and module states between devices and ranks, through public APIs only."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import torch
import torch.distributed as dist
from lightning.pytorch.utilities import move_data_to_device
from torch import nn


def optimizers_to_device(optimizers: Iterable[torch.optim.Optimizer], device: torch.device) -> None:
    """Move every tensor of the optimizers' state (moments, steps) to ``device``, in place."""
    for optimizer in optimizers:
        for state in optimizer.state.values():
            for key, value in state.items():
                state[key] = move_data_to_device(value, device)


def broadcast_module_states(module: nn.Module, source: int = 0) -> None:
    """Give every rank rank ``source``'s parameters and buffers (a model that no wrapper keeps in step)."""
    if not dist.is_available() or not dist.is_initialized():
        return
    with torch.no_grad():
        for tensor in itertools.chain(module.parameters(), module.buffers()):
            dist.broadcast(tensor.data, src=source)
