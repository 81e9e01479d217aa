"""Activation memory per sample, from a short forward of the actual model and batch (and, on CUDA, backward).

The probe counts the bytes autograd keeps for backward (saved-tensor hooks, each storage once, parameters
excluded) and attributes them to the transformer block running at the time. Without activation checkpointing
that is what is alive when backward starts; with it, what stays alive is everything saved outside the blocks,
each block's input, and one block's saved tensors while that block is recomputed. Two batch sizes (1 and 2
samples) give the per-sample slope and the fixed part.

On CUDA the peak allocation above the model states is measured as well (``torch.cuda.max_memory_allocated``,
once without and once with checkpointing), at ``n`` and ``2n`` samples, ``n`` saving about
:data:`PEAK_PROBE_BYTES`. At one or two samples that peak is set by transients that do not grow with the batch
(the weight gradient of GPT-2 XL's 50k-token output layer is 160 MB), so its slope can be near zero there (so
measured, the plan allowed GPT-2 XL 323 checkpointed samples on a 24 GiB card, and they did not fit). The
per-sample figure is the larger of the two slopes, and the fixed part is what the peak at ``n`` samples leaves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lightning_zero.precision import autocast
from lightning_zero.runtime.batches import LossFn, take_samples
from lightning_zero.runtime.blocks import enable_activation_checkpointing, transformer_blocks

#: On CUDA the smaller peak measurement takes as many samples as save about this many bytes ...
PEAK_PROBE_BYTES = 2**30
#: ... but no more than this many.
PEAK_PROBE_MAX_SAMPLES = 64


@dataclass(frozen=True)
class ActivationProbe:
    """Activation bytes of one micro-batch: ``fixed + per_sample * batch``, without and with checkpointing."""

    per_sample: int
    fixed: int
    per_sample_checkpointed: int
    fixed_checkpointed: int
    method: str

    def bytes_for(self, batch: int, checkpointed: bool) -> int:
        """Activation bytes of a micro-batch of ``batch`` samples."""
        if checkpointed:
            return self.fixed_checkpointed + self.per_sample_checkpointed * batch
        return self.fixed + self.per_sample * batch


@dataclass
class _SavedBytes:
    """Bytes saved for backward, split by the block that saved them.

    Storages are told apart by identity (torch gives every view of one storage the same storage object), not by
    address: abstract tensors (:func:`~lightning_zero.internals.abstract_tensors`) all have address 0. Each storage
    seen is held, so that no identity is reused while counting.
    """

    parameters: list[torch.UntypedStorage]
    blocks: list[nn.Module]
    outside: int = 0
    per_block: list[int] = field(default_factory=list)
    block_inputs: int = 0
    seen: dict[int, torch.UntypedStorage] = field(default_factory=dict)
    current: int | None = None

    def __post_init__(self) -> None:
        self.seen.update((id(storage), storage) for storage in self.parameters)

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if id(storage) not in self.seen and storage.nbytes():
            self.seen[id(storage)] = storage
            if self.current is None:
                self.outside += storage.nbytes()
            else:
                self.per_block[self.current] += storage.nbytes()
        return tensor

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        self.per_block = [0] * len(self.blocks)
        handles = []
        for index, block in enumerate(self.blocks):
            handles.append(block.register_forward_pre_hook(self._enter(index)))
            handles.append(block.register_forward_hook(self._leave))
        try:
            with torch.autograd.graph.saved_tensors_hooks(self.pack, lambda tensor: tensor):
                yield
        finally:
            for handle in handles:
                handle.remove()

    def _enter(self, index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            self.current = index
            self.block_inputs += sum(a.untyped_storage().nbytes() for a in args if isinstance(a, torch.Tensor))

        return hook

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        self.current = None

    def totals(self) -> tuple[int, int]:
        """``(without checkpointing, with checkpointing)`` bytes alive at the start of backward / at peak."""
        blocks = sum(self.per_block)
        return self.outside + blocks, self.outside + self.block_inputs + max(self.per_block, default=0)


def _saved_bytes(
    model: nn.Module, loss_fn: LossFn, batch: Any, precision: str, device: torch.device
) -> tuple[int, int]:
    parameters = [p.untyped_storage() for p in model.parameters()]
    counter = _SavedBytes(parameters=parameters, blocks=transformer_blocks(model))
    with counter.recording(), autocast(device, precision):
        loss = loss_fn(batch)
    totals = counter.totals()
    # The count is complete once the forward has run, so no backward (on abstract tensors it took as long as the
    # forward): dropping the loss and the counter frees the graph and every storage it saved.
    del loss, counter
    return totals


SavedLines = tuple[tuple[int, int], tuple[int, int]]


def saved_bytes_lines(
    model: nn.Module, loss_fn: LossFn, batch: Any, precision: str = "32-true", device: torch.device | None = None
) -> SavedLines:
    """``(per sample, fixed)`` of the bytes saved for backward, without and with checkpointing, from one and two
    samples of ``batch``. A model built inside :func:`~lightning_zero.internals.abstract_tensors` is counted with no
    memory at all."""
    device = device or next(model.parameters()).device
    counts = [_saved_bytes(model, loss_fn, take_samples(batch, n), precision, device) for n in (1, 2)]
    (plain_1, ckpt_1), (plain_2, ckpt_2) = counts
    return _line(plain_1, plain_2), _line(ckpt_1, ckpt_2)


def _cuda_peak(model: nn.Module, loss_fn: LossFn, batch: Any, precision: str, device: torch.device) -> int:
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    with autocast(device, precision):
        loss = loss_fn(batch)
    loss.backward()
    torch.cuda.synchronize(device)
    model.zero_grad(set_to_none=False)
    return max(0, torch.cuda.max_memory_allocated(device) - base)


def _line(small: int, large: int) -> tuple[int, int]:
    """``(per sample, fixed)`` through the measurements at 1 and 2 samples."""
    per_sample = max(0, large - small)
    return per_sample, max(0, small - per_sample)


def probe_activations(
    model: nn.Module,
    loss_fn: LossFn,
    batch: Any,
    precision: str = "32-true",
    device: torch.device | None = None,
    saved: SavedLines | None = None,
) -> ActivationProbe:
    """Measure activation bytes of ``loss_fn(batch)`` (a forward returning the loss) on samples of ``batch``.

    ``model`` holds the parameters ``loss_fn`` uses; on CUDA it is switched to activation checkpointing for
    the second measurement, so pass a model built for probing. ``saved``: the model's :func:`saved_bytes_lines`,
    when counted already (on an abstract copy: two samples of a 3B model at 2048 tokens save 19 GiB).
    """
    device = device or next(model.parameters()).device
    plain, ckpt = saved if saved is not None else saved_bytes_lines(model, loss_fn, batch, precision, device)
    if device.type != "cuda":
        return ActivationProbe(*plain, *ckpt, method="saved tensors")
    one = take_samples(batch, 1)
    try:
        _cuda_peak(model, loss_fn, one, precision, device)  # gradients allocated once, outside the measurement
        plain = per_sample_from_peaks(plain[0], _peaks(model, loss_fn, batch, precision, device, plain[0]))
        unchecked_fit = True
    except torch.OutOfMemoryError:  # not one sample fits without checkpointing: the saved bytes stand
        model.zero_grad(set_to_none=False)
        torch.cuda.empty_cache()
        unchecked_fit = False
    if enable_activation_checkpointing(model) == 0:
        return ActivationProbe(*plain, *plain, method="saved tensors + cuda peak")
    if not unchecked_fit:
        _cuda_peak(model, loss_fn, one, precision, device)  # the gradients the failed pass left unallocated
    ckpt = per_sample_from_peaks(ckpt[0], _peaks(model, loss_fn, batch, precision, device, ckpt[0]))
    return ActivationProbe(*plain, *ckpt, method="saved tensors + cuda peak")


def peak_probe_sizes(saved_per_sample: int) -> tuple[int, int]:
    """The batch sizes of the two CUDA peak measurements: ``n`` samples saving about :data:`PEAK_PROBE_BYTES`
    (1 to :data:`PEAK_PROBE_MAX_SAMPLES`), and ``2n``."""
    small = max(1, min(PEAK_PROBE_MAX_SAMPLES, PEAK_PROBE_BYTES // max(1, saved_per_sample)))
    return small, 2 * small


Peaks = tuple[tuple[int, int], tuple[int, int]]


def _peaks(
    model: nn.Module, loss_fn: LossFn, batch: Any, precision: str, device: torch.device, saved_per_sample: int
) -> Peaks:
    """The peaks at ``n`` and ``2n`` samples; ``n`` halves while the device runs out of memory."""
    small = peak_probe_sizes(saved_per_sample)[0]
    while small > 1:
        try:
            return _measure_peaks(model, loss_fn, batch, precision, device, small)
        except torch.OutOfMemoryError:
            pass
        model.zero_grad(set_to_none=False)  # the failed backward left partial gradients; its memory is freed now
        torch.cuda.empty_cache()
        small //= 2
    return _measure_peaks(model, loss_fn, batch, precision, device, 1)  # out of memory at 1 sample: raised


def _measure_peaks(
    model: nn.Module, loss_fn: LossFn, batch: Any, precision: str, device: torch.device, small: int
) -> Peaks:
    low, high = (_cuda_peak(model, loss_fn, take_samples(batch, n), precision, device) for n in (small, 2 * small))
    return (small, low), (2 * small, high)


def per_sample_from_peaks(saved_per_sample: int, peaks: Peaks) -> tuple[int, int]:
    """``(per sample, fixed)`` from the saved-bytes slope and the peaks at ``n`` and ``2n`` samples."""
    (small, low), (large, high) = peaks
    per_sample = max(saved_per_sample, max(0, high - low) // (large - small))
    return per_sample, max(0, low - per_sample * small)
