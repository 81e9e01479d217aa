"""Checks and defaults applied to a parsed trainer config before anything is built or launched.

Bad input found here is a :class:`~lightning_zero.errors.ZeroConfigError` in the launching process, before
any rank starts, instead of a traceback from inside Lightning, DeepSpeed or a rank.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info

from lightning_zero.errors import ZeroConfigError
from lightning_zero.hardware import cpu_precision

_FP16 = {"16", "16-mixed", "16-true", "fp16"}


def default_cpu_precision(trainer: Any) -> None:
    """Fill ``trainer.precision`` for a CPU run that leaves it unset, and say which precision and why, once."""
    if trainer.get("precision") is not None or not runs_on_cpu(trainer.get("accelerator")):
        return
    choice = cpu_precision()
    trainer["precision"] = choice.precision
    rank_zero_info(f"Precision {choice.precision}: {choice.reason}. Set `trainer.precision` to choose another.")


def runs_on_cpu(accelerator: Any) -> bool:
    """Whether a trainer ``accelerator`` value (a name, ``None``, or a ``class_path`` namespace) means the CPU."""
    if accelerator is None or accelerator == "auto":
        return not (torch.cuda.is_available() or torch.backends.mps.is_available())
    if isinstance(accelerator, str):
        return accelerator == "cpu"
    class_path = getattr(accelerator, "class_path", "")
    return isinstance(class_path, str) and class_path.endswith("CPUAccelerator")


def check_trainer_config(trainer: Any) -> None:
    """Raise on trainer values Lightning would reject with a traceback, or only after the ranks started."""
    _check_devices(trainer.get("devices"))
    _check_accelerator_available(trainer.get("accelerator"))
    _check_num_nodes(trainer.get("num_nodes"))


def check_strategy_precision(strategy: Any, on_cpu: bool, precision: Any) -> None:
    """DeepSpeed refuses fp16 on CPU, but only from rank 0 after start-up: say so before launching."""
    from lightning.pytorch.strategies import DeepSpeedStrategy

    if on_cpu and isinstance(strategy, DeepSpeedStrategy) and str(precision) in _FP16:
        raise ZeroConfigError(
            f"Precision {precision!r} is fp16, which DeepSpeed does not support on CPU: "
            "use `--trainer.precision bf16-mixed` or `32-true` there (fp16 is for GPUs)."
        )


def _check_devices(devices: Any) -> None:
    if isinstance(devices, int) and not isinstance(devices, bool) and devices < 1 and devices != -1:
        raise ZeroConfigError(
            f"`trainer.devices` is {devices}: give a number of devices of at least 1, a list of device indices, "
            "-1 for all, or 'auto'."
        )
    if isinstance(devices, str) and devices.strip() in ("0", ""):
        raise ZeroConfigError(
            f"`trainer.devices` is {devices!r}: give a number of devices of at least 1, a list of device indices, "
            "-1 for all, or 'auto'."
        )
    if isinstance(devices, (list, tuple)) and not devices:
        raise ZeroConfigError("`trainer.devices` is an empty list: list at least one device index, or give a count.")


def _check_accelerator_available(accelerator: Any) -> None:
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ZeroConfigError(
            f"`trainer.accelerator` is {accelerator!r} but this machine has no CUDA GPU that torch can use: "
            "use `--trainer.accelerator cpu` (or 'auto'), or install a CUDA build of torch on a GPU machine."
        )
    if accelerator == "mps" and not torch.backends.mps.is_available():
        raise ZeroConfigError(
            "`trainer.accelerator` is 'mps' but this machine has no Apple GPU: use `--trainer.accelerator cpu`."
        )


def _check_num_nodes(num_nodes: Any) -> None:
    if isinstance(num_nodes, int) and num_nodes < 1:
        raise ZeroConfigError(f"`trainer.num_nodes` is {num_nodes}: give 1 or more (the number of machines).")
