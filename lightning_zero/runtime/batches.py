"""Helpers on batches and training steps that the batch-size finder, the throughput monitor, the memory probe
and ``zero_auto`` share: a batch's samples and tokens, the first samples of a batch, a training step's loss outside
the fit loop, and whether an error is an allocator out of memory."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from unittest.mock import patch

import torch
from lightning.pytorch import LightningModule
from torch import nn

from lightning_zero.errors import ZeroConfigError

LossFn = Callable[[Any], torch.Tensor]


def take_samples(batch: Any, count: int) -> Any:
    """The first ``count`` samples of a batch (tensors, or mappings/lists/tuples of them, a ``BatchEncoding`` too),
    repeated if it is shorter; a mapping comes back as a ``dict``."""
    if isinstance(batch, torch.Tensor):
        repeats = -(-count // batch.shape[0])
        return batch.repeat(repeats, *([1] * (batch.dim() - 1)))[:count].clone() if batch.dim() else batch
    if isinstance(batch, Mapping):
        return {key: take_samples(value, count) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(take_samples(value, count) for value in batch)
    return batch


def _ignore_log(*args: Any, **kwargs: Any) -> None:
    """Stands in for ``LightningModule.log`` outside the fit loop: there is nothing to log into."""


@contextlib.contextmanager
def logging_silenced(module: nn.Module) -> Iterator[None]:
    """Make ``module.log(...)`` a no-op inside the block (to run ``training_step`` outside the fit loop)."""
    with patch.object(module, "log", _ignore_log):
        yield


def training_loss(module: LightningModule) -> LossFn:
    """A function of a batch returning ``module.training_step``'s loss, run outside the fit loop."""

    def loss(batch: Any) -> torch.Tensor:
        with logging_silenced(module):
            out = module.training_step(batch, 0)
        value = out["loss"] if isinstance(out, Mapping) else out
        if not isinstance(value, torch.Tensor):
            raise ZeroConfigError(f"{type(module).__name__}.training_step must return the loss.")
        return value

    return loss


def first_tensor(batch: Any) -> torch.Tensor | None:
    """The first tensor in a batch (a tensor, or a mapping/sequence holding tensors)."""
    if isinstance(batch, torch.Tensor):
        return batch
    values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
    for value in values:
        found = first_tensor(value)
        if found is not None:
            return found
    return None


def samples_in(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor."""
    tensor = first_tensor(batch)
    return int(tensor.shape[0]) if tensor is not None and tensor.dim() else 1


def tokens_in(batch: Any) -> int:
    """Tokens in a batch: ``input_ids`` elements when it has them, else the first tensor's first two dimensions."""
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    tensor = ids if isinstance(ids, torch.Tensor) else first_tensor(batch)
    if tensor is None or tensor.dim() == 0:
        return 1
    return int(tensor.shape[0] * (tensor.shape[1] if tensor.dim() > 1 else 1))


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocator running out of memory (CUDA, or the CPU allocator)."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)
