"""One ``zero_auto`` trial: build a copy of the model and its engine, time a few optimizer steps, and give back
every byte the trial took, on the device and on the host, before the next trial or the run starts.

A trial of an offload layout holds the model's fp32 master weights, gradients and Adam moments in host memory
(16 bytes a parameter: 54 GB for a 3.4B model), much of it page-locked. Unless all of it is given back, the trials'
memory adds up and the host's out-of-memory killer ends the search, or the run finds too little host memory left.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import ctypes.util
import gc
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from lightning.pytorch import LightningModule
from torch import nn

from lightning_zero.internals import empty_pinned_host_cache
from lightning_zero.runtime.batches import is_out_of_memory, training_loss
from lightning_zero.strategies.deepspeed import forget_zero3_modules, initialize_engine
from lightning_zero.strategies.onecard_optim import ReplacedOptimizer


class TrialRefused(Exception):
    """A candidate that cannot be tried with this module (the reason is the message)."""


@dataclass(frozen=True)
class TrialOutcome:
    """What a trial's steps gave: whether they ran, their seconds and count, and why not."""

    ran: bool
    seconds: float = 0.0
    steps: int = 0
    reason: str = ""


@dataclass(frozen=True)
class StepPlan:
    """How a trial steps: untimed steps, and timed steps wanted."""

    warmup_steps: int
    trial_steps: int


TrialBuilder = Callable[[], tuple[LightningModule, torch.optim.Optimizer]]


def copy_of(
    module: LightningModule, trainer: Any, dtype: torch.dtype | None = None, device: torch.device | None = None
) -> LightningModule:
    """A deep copy of ``module`` attached to the same Trainer (a copy drops its Trainer reference), its floating
    parameters and buffers in ``dtype`` and everything on ``device`` when given.

    Each parameter is converted as it is copied: the copy never holds the model a second time in fp32 on the host
    (13.6 GB for a 3.4B model) on its way to 16 bits. Inside :func:`~lightning_zero.internals.abstract_tensors` the
    copy is abstract: no memory.
    """

    def converted(tensor: torch.Tensor) -> torch.Tensor:
        target = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
        # A copy even where device and dtype are the same: a trial must never step the module's own tensors.
        return tensor.detach().to(device=device or tensor.device, dtype=target, copy=True)

    memo: dict[int, Any] = {id(buffer): converted(buffer) for buffer in module.buffers()}
    for parameter in module.parameters():
        memo[id(parameter)] = nn.Parameter(converted(parameter), requires_grad=parameter.requires_grad)
    duplicate = copy.deepcopy(module, memo)
    duplicate.trainer = trainer
    return duplicate


class TrialSteps(Protocol):
    """What a trial times: one optimizer step at a time of a built model, and what it leaves to close."""

    def step(self) -> None:
        """One optimizer step, its micro-batches' forwards and backwards included."""

    def skipped(self) -> int:
        """Optimizer steps skipped so far (fp16 overflow)."""

    def close(self) -> None:
        """Release what the steps hold beyond Python's reach (engines, hooks)."""


class EngineSteps:
    """A DeepSpeed engine's steps over ``accumulation`` micro-batches of ``samples``."""

    def __init__(self, engine: Any, trial: LightningModule, samples: Any, accumulation: int) -> None:
        self.engine, self.trial, self.samples, self.accumulation = engine, trial, samples, accumulation
        self.loss = training_loss(trial)

    def step(self) -> None:
        for _ in range(self.accumulation):
            self.engine.backward(self.loss(self.samples))
            self.engine.step()

    def skipped(self) -> int:
        return int(self.engine.skipped_steps)

    def close(self) -> None:
        self.engine.destroy()
        forget_zero3_modules(self.trial)


class OneCardSteps:
    """The one-card levers' steps: the forward under the run's context (autocast, activation offload), backward
    (which steps each parameter under ``optimizer_in_backward``), then the optimizer's step."""

    def __init__(
        self,
        trial: LightningModule,
        optimizer: ReplacedOptimizer,
        samples: Any,
        forward: Callable[[], contextlib.AbstractContextManager[Any]],
    ) -> None:
        self.optimizer, self.samples, self.forward = optimizer, samples, forward
        self.loss = training_loss(trial)

    def step(self) -> None:
        with self.forward():
            loss = self.loss(self.samples)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def skipped(self) -> int:
        return 0

    def close(self) -> None:
        self.optimizer.remove_hooks()


def engine_steps(
    build: TrialBuilder, ds_config: Mapping[str, Any], device_rank: int, samples: Any, accumulation: int
) -> Callable[[], TrialSteps]:
    """How a trial opens the steps of the engine ``ds_config`` makes of what ``build`` returns."""

    def open_steps() -> TrialSteps:
        trial, optimizer = build()
        try:
            engine, _ = initialize_engine(trial, ds_config, device_rank, optimizer)
        except BaseException:
            forget_zero3_modules(trial)
            raise
        return EngineSteps(engine, trial, samples, accumulation)

    return open_steps


def run_trial(open_steps: Callable[[], TrialSteps], steps: StepPlan, device: torch.device) -> TrialOutcome:
    """Time ``steps`` of what ``open_steps`` opens; out of memory is an outcome, :class:`TrialRefused` too.

    Everything the trial allocated is given back before this returns (:func:`give_back_memory`).
    """

    def timed() -> TrialOutcome:
        # The engine, the optimizer and the module live only in this frame: nothing of the trial outlives it.
        opened = None
        try:
            opened = open_steps()
            seconds, counted = timed_steps(opened, steps, device)
            return TrialOutcome(True, seconds, counted)
        except RuntimeError as error:
            if not is_out_of_memory(error):
                raise
            return TrialOutcome(False, reason="out of memory")
        finally:
            if opened is not None:
                opened.close()

    try:
        return timed()
    except TrialRefused as refused:
        return TrialOutcome(False, reason=str(refused))
    finally:
        give_back_memory(device)


def timed_steps(opened: TrialSteps, steps: StepPlan, device: torch.device) -> tuple[float, int]:
    """Seconds and count of the timed optimizer steps that fp16 did not skip for overflow.

    A skipped step leaves out the optimizer (under offload, most of the step) and would look fast: up to three
    times ``trial_steps`` steps are run to time ``trial_steps`` that were not skipped.
    """
    seconds, counted = 0.0, 0
    for step in range(steps.warmup_steps + 3 * steps.trial_steps):
        _synchronize(device)
        start, skipped_before = time.perf_counter(), opened.skipped()
        opened.step()
        _synchronize(device)
        if step >= steps.warmup_steps and opened.skipped() == skipped_before:
            seconds += time.perf_counter() - start
            counted += 1
            if counted == steps.trial_steps:
                break
    return seconds, counted


def give_back_memory(device: torch.device) -> None:
    """Free what no longer has an owner and return it to the system: device blocks the caching allocator holds,
    page-locked host blocks torch's host allocator holds, and heap pages the C library keeps."""
    gc.collect()  # a ZeRO optimizer and its module reach each other: only the collector frees them
    if device.type == "cuda":
        torch.cuda.empty_cache()
        empty_pinned_host_cache()
    _trim_host_heap()


def _trim_host_heap() -> None:
    # glibc keeps freed heap pages for reuse; a trial's hundreds of MB to GB of host tensors stay resident unless
    # malloc_trim returns them (measured: 370 MB of a 34M-parameter offload trial's 540 MB). Neither torch nor the
    # standard library offers this.
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim(0)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
