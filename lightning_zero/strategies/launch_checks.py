"""What a DeepSpeed run would refuse in every rank once started, checked once in the launching process, and the
launcher that checks it there for a Trainer built in Python."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.utilities import GradClipAlgorithmType

from lightning_zero.errors import ZeroConfigError
from lightning_zero.internals import SubprocessScriptLauncher
from lightning_zero.strategies.deepspeed_config import AUTO, TrainerValues
from lightning_zero.strategies.deepspeed_settings import DeepSpeedSettings

_FP16 = {"16", "16-mixed", "16-true", "fp16"}


def check_deepspeed_trainer(settings: DeepSpeedSettings | None, trainer: Any) -> None:
    """What Lightning's DeepSpeed strategy, and ours, would refuse in every rank once started: clipping by value,
    and (given lightning-zero's DeepSpeed ``settings``) a config that contradicts the Trainer (accumulation,
    clipping, precision) or leaves an ``"auto"`` that nothing fills."""
    if trainer.gradient_clip_algorithm == GradClipAlgorithmType.VALUE:
        raise ZeroConfigError(
            "DeepSpeed clips gradients only by norm, but `trainer.gradient_clip_algorithm` is 'value': set it to "
            "'norm' (`--trainer.gradient_clip_algorithm norm`), or use a strategy other than DeepSpeed."
        )
    if settings is not None:
        # The batch size comes from the dataloader, built only in the ranks: an explicit one is taken as given.
        micro_batch = settings.given.get("train_micro_batch_size_per_gpu", AUTO)
        values = TrainerValues(
            micro_batch_size=micro_batch if isinstance(micro_batch, int) else 1,
            accumulate_grad_batches=trainer.accumulate_grad_batches,
            gradient_clip_val=trainer.gradient_clip_val,
            precision=str(trainer.precision),
        )
        settings.with_trainer(values)


def check_zero_trainer(trainer: Any) -> None:
    """The checks of a Trainer whose strategy is lightning-zero's DeepSpeed one: fp16 on CPU, then
    :func:`check_deepspeed_trainer` with its settings."""
    if isinstance(trainer.accelerator, CPUAccelerator):
        check_cpu_precision(trainer.precision)
    check_deepspeed_trainer(trainer.strategy.settings, trainer)


class PreflightLauncher(SubprocessScriptLauncher):
    """Lightning's launcher of a script's ranks, which first checks a lightning-zero DeepSpeed Trainer (precision
    on CPU, clipping, the config against the Trainer), so that a Trainer built in Python fails with one line before
    the other ranks start, as the CLI does."""

    def launch(self, function: Callable[..., Any], *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        if trainer is not None:
            check_zero_trainer(trainer)
        return super().launch(function, *args, trainer=trainer, **kwargs)


def preflight_launcher(launcher: Any) -> Any:
    """``launcher`` as a :class:`PreflightLauncher` when it starts a script's ranks; any other is kept."""
    if type(launcher) is not SubprocessScriptLauncher:
        return launcher
    return PreflightLauncher(launcher.cluster_environment, launcher.num_processes, launcher.num_nodes)


def check_cpu_precision(precision: Any) -> None:
    """DeepSpeed refuses fp16 on CPU, but only from rank 0 after start-up: say so before launching (CPU runs)."""
    if str(precision) in _FP16:
        raise ZeroConfigError(
            f"Precision {precision!r} is fp16, which DeepSpeed does not support on CPU: "
            "use `--trainer.precision bf16-mixed` or `32-true` there (fp16 is for GPUs)."
        )
