"""One accelerator without sharding, and the levers that beat offloading there: the optimizer step in backward,
low-memory or offloaded optimizer states (torchao, bitsandbytes), activations kept in host memory.

A thin layer over Lightning's ``SingleDeviceStrategy``: the module's own optimizer is replaced once Lightning has
built it (:func:`~lightning_zero.strategies.onecard_optim.replace_optimizer`), and the forward runs inside
``torch.autograd.graph.save_on_cpu`` when activations are offloaded.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.plugins.precision import DoublePrecision, HalfPrecision, MixedPrecision, Precision
from lightning.pytorch.strategies import SingleDeviceStrategy

from lightning_zero.checkpoint.manifest import checkpoint_manifest
from lightning_zero.checkpoint.validate import check_checkpoint
from lightning_zero.checkpoint.weights_only import weights_only_of_another_backend
from lightning_zero.errors import ZeroConfigError
from lightning_zero.internals import init_optimizers_and_schedulers
from lightning_zero.memory.allocator import restore_allocator, use_expandable_segments
from lightning_zero.memory.budget import cap_device_memory
from lightning_zero.runtime.blocks import prepare_blocks
from lightning_zero.strategies.onecard_config import OneCardConfig
from lightning_zero.strategies.onecard_optim import ReplacedOptimizer, replace_optimizer

if TYPE_CHECKING:
    import lightning.pytorch as pl


def lever_device(device: str | torch.device | None) -> torch.device:
    """The device asked for, the current CUDA device for ``"cuda"`` without an index (CUDA's memory calls need one)."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    chosen = torch.device(device)
    return torch.device("cuda", torch.cuda.current_device()) if chosen == torch.device("cuda") else chosen


class OneCardStrategy(SingleDeviceStrategy):
    """Train on one device with the levers of ``zero`` (a :class:`OneCardConfig` or its fields)."""

    zero_backend = "onecard"

    def __init__(
        self,
        zero: OneCardConfig | Mapping[str, Any] | None = None,
        device: str | torch.device | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(device=lever_device(device), **kwargs)
        self.zero = OneCardConfig.coerce(zero)
        self._allocator_before: str | None = None

    @property
    def replaces_optimizer(self) -> bool:
        """Whether a lever replaces the module's optimizer."""
        return replaces_optimizer(self.zero)

    def setup(self, trainer: pl.Trainer) -> None:
        assert self.model is not None
        self._allocator_before = set_up_device(self.zero, self.root_device)
        prepare_blocks(self.model, self.zero.activation_checkpointing, self.zero.compile_blocks)
        super().setup(trainer)

    def setup_optimizers(self, trainer: pl.Trainer) -> None:
        super().setup_optimizers(trainer)
        if not self.replaces_optimizer:
            return
        check_trainer_for_levers(self.zero, trainer, len(self.optimizers))
        offload_gradients = trainer.accumulate_grad_batches == 1
        self.optimizers = [replace_optimizer(self.optimizers[0], self.zero, offload_gradients)]

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        with saved_tensors_context(self.zero, self.root_device):
            return super().training_step(*args, **kwargs)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """A one-card file as Lightning loads it; a ZeRO preset's checkpoint (it has a manifest) weights only, with
        one warning: no route carries its sharded optimizer state into the replaced optimizer."""
        path = Path(checkpoint_path)
        check_checkpoint(path, self.lightning_module)
        if checkpoint_manifest(path) is not None:
            return weights_only_of_another_backend(path, self.zero_backend, self.zero.stage)
        return super().load_checkpoint(checkpoint_path, weights_only)

    def teardown(self) -> None:
        tear_down_levers(self.zero, self.root_device, self.optimizers, self._allocator_before)
        self._allocator_before = None
        super().teardown()


def replaces_optimizer(config: OneCardConfig) -> bool:
    """Whether a lever of ``config`` replaces the module's optimizer."""
    return config.optimizer_in_backward or config.low_memory_optimizer != "none" or config.offload_optimizer == "cpu"


def gradients_leave_in_backward(config: OneCardConfig, offload_gradients: bool) -> bool:
    """Whether each gradient is gone once backward completes it (stepped and freed, or copied to the host)."""
    return config.optimizer_in_backward or (config.offload_optimizer == "cpu" and offload_gradients)


def check_device_for_levers(config: OneCardConfig, device: torch.device) -> None:
    """Raise one line when a lever of ``config`` cannot run on ``device``."""
    if config.offload_optimizer == "cpu" and device.type != "cuda":
        raise ZeroConfigError(
            f"`offload_optimizer: cpu` (torchao's CPUOffloadOptimizer) runs on CUDA GPUs only, got {device.type}: run"
            " on a GPU, or use `onecard_step_in_backward`."
        )


def set_up_device(config: OneCardConfig, device: torch.device) -> str | None:
    """``config``'s memory budget cap and expandable segments on ``device``, after checking its levers run there;
    the allocator settings for :func:`tear_down_levers` to give back."""
    check_device_for_levers(config, device)
    if config.memory_budget_gib is not None:
        cap_device_memory(device, config.memory_budget_gib)
    return use_expandable_segments(device, "one card") if config.expandable_segments else None


def tear_down_levers(
    config: OneCardConfig, device: torch.device, optimizers: Iterable[Any], allocator_before: str | None
) -> None:
    """Undo :func:`set_up_device` and take the replaced optimizers' hooks off the parameters."""
    for optimizer in optimizers:
        if isinstance(optimizer, ReplacedOptimizer):
            optimizer.remove_hooks()
    if config.memory_budget_gib is not None and device.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(1.0, device)  # the cap is process-wide
    if allocator_before is not None:
        restore_allocator(allocator_before)


def saved_tensors_context(config: OneCardConfig, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Where the forward keeps what backward needs: in (pinned) host memory under ``activation_offload``."""
    if not config.activation_offload:
        return contextlib.nullcontext()
    return torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda")


def precision_plugin(precision: str, device: torch.device) -> Precision:
    """Lightning's precision plugin of a single-device strategy for a Trainer ``precision`` string."""
    if precision.endswith("-mixed"):
        return MixedPrecision(precision, device=device.type)  # type: ignore[arg-type]
    if precision in ("16-true", "bf16-true"):
        return HalfPrecision(precision)  # type: ignore[arg-type]
    return DoublePrecision() if precision == "64-true" else Precision()


def lever_optimizer(module: LightningModule, config: OneCardConfig) -> ReplacedOptimizer:
    """The optimizer the levers of ``config`` make of ``module.configure_optimizers()``'s one optimizer, without a
    Trainer's checks (``zero_auto``'s trials: one micro-batch a step, no clipping)."""
    optimizers, _ = init_optimizers_and_schedulers(module)
    if len(optimizers) != 1:
        raise ZeroConfigError(f"The one-card levers replace one optimizer, got {len(optimizers)}.")
    return replace_optimizer(optimizers[0], config, offload_gradients=True)


@dataclasses.dataclass(frozen=True)
class LeverFixes:
    """How a loop's user takes back what a lever cannot give, in that loop's words (the Trainer's or Fabric's)."""

    one_optimizer: str
    no_clipping: str
    no_accumulation: str


TRAINER_FIXES = LeverFixes(
    one_optimizer="return one from configure_optimizers",
    no_clipping="unset `gradient_clip_val`",
    no_accumulation="set `accumulate_grad_batches: 1` (a larger micro-batch)",
)


def check_trainer_for_levers(config: OneCardConfig, trainer: pl.Trainer, optimizers: int) -> None:
    """Raise one line when the Trainer asks for what the chosen levers cannot give."""
    refuse_lever_conflicts(
        config,
        TRAINER_FIXES,
        optimizers=optimizers,
        clipping=bool(trainer.gradient_clip_val),
        accumulating=trainer.accumulate_grad_batches > 1,
        manual_optimization=not trainer.lightning_module.automatic_optimization,
        offload_gradients=trainer.accumulate_grad_batches == 1,
        precision=str(trainer.precision),
    )


def refuse_lever_conflicts(
    config: OneCardConfig,
    fixes: LeverFixes,
    optimizers: int = 1,
    clipping: bool = False,
    accumulating: bool = False,
    manual_optimization: bool = False,
    offload_gradients: bool = True,
    precision: str = "32-true",
) -> None:
    """Raise one line, naming ``fixes``, when a loop asks for what the levers of ``config`` cannot give: more than
    one optimizer, clipping, accumulated gradients or fp16 loss scaling where each gradient leaves backward as soon
    as it is complete."""
    if precision == "16-mixed" and gradients_leave_in_backward(config, offload_gradients):
        raise ZeroConfigError(
            "`16-mixed` unscales the gradients (and skips a step that overflowed) at the optimizer step, but these"
            " levers take each gradient in backward, still scaled: use `bf16-mixed`."
        )
    if optimizers != 1:
        raise ZeroConfigError(
            f"The one-card optimizer levers replace one optimizer, got {optimizers}: {fixes.one_optimizer}."
        )
    if config.optimizer_in_backward:
        if clipping:
            raise ZeroConfigError(
                "`optimizer_in_backward` steps each parameter before the others' gradients exist, so their norm"
                f" cannot be clipped: {fixes.no_clipping} or set `optimizer_in_backward: false`."
            )
        if accumulating:
            raise ZeroConfigError(
                "`optimizer_in_backward` frees each gradient as soon as it steps, so none can accumulate:"
                f" {fixes.no_accumulation} or set `optimizer_in_backward: false`."
            )
        if manual_optimization:
            raise ZeroConfigError(
                "`optimizer_in_backward` steps inside backward, which manual optimization calls itself: set"
                " `optimizer_in_backward: false`."
            )
    if config.offload_optimizer == "cpu" and clipping:
        raise ZeroConfigError(
            "`offload_optimizer: cpu` copies each gradient to the host as it completes, before any clipping could"
            f" touch it: {fixes.no_clipping}, or use `zero2_offload`."
        )
    if accumulating and gradients_leave_in_backward(config, offload_gradients):
        raise ZeroConfigError(
            "`offload_optimizer: cpu` moves each gradient to the host as soon as it is complete, so none can"
            f" accumulate: {fixes.no_accumulation}, or use `zero2_offload`."
        )
