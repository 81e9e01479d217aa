"""The Trainer that test runs build: quiet, on CPU, in 32-true, so each run states only what it is about."""

from __future__ import annotations

import sys
from typing import Any

import lightning as L

from lightning_zero.runtime.watchdog import end_process_groups
from lightning_zero.strategies.deepspeed import DeepSpeedZeroStrategy

QUIET_CPU: dict[str, Any] = {
    "accelerator": "cpu",
    "precision": "32-true",
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}


def quiet_trainer(**options: Any) -> L.Trainer:
    """A Trainer with :data:`QUIET_CPU`'s settings, overridden by ``options``."""
    return L.Trainer(**{**QUIET_CPU, **options})


def end_process_group() -> None:
    """End the process groups as our strategies do at exit (:class:`~lightning_zero.runtime.watchdog.WatchedRanks`),
    for runs of Lightning's own strategies too, once every result is written."""
    if "deepspeed.comm" in sys.modules:
        DeepSpeedZeroStrategy.end_process_groups()
    else:
        end_process_groups()
