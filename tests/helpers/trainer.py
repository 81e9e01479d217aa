"""The Trainer that test runs build: quiet, on CPU, in 32-true, so each run states only what it is about."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

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
    """Shut the process group down before Python exits: once, with every result written, both ranks of a run
    aborted at interpreter exit with it still up ("terminate called without an active exception", exit -6)."""
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
