"""A Fabric state under the Trainer's checkpoint keys, and back.

``fabric.save(path, {"model": model, "optimizer": optimizer, "scheduler": scheduler, "step": 4})`` names its
entries freely; the Trainer's checkpoints name them ``state_dict``, ``optimizer_states`` (one file) or
``optimizer_0``... (FSDP2's sharded directories) and ``lr_schedulers``. Each Fabric strategy writes the Trainer's
names, so one checkpoint resumes under either: the model, optimizers and LR schedulers are found by their type on
both sides, the other entries keep their names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from lightning_zero.checkpoint.weights_only import WEIGHTS_ONLY_KEY
from lightning_zero.errors import ZeroConfigError

#: What the Trainer's checkpoint loader requires of a checkpoint, with the value a Fabric save gives it when the
#: state has none: the Lightning version that wrote it, and the LR schedulers' states (a scheduler in the state
#: is saved here).
TRAINER_KEYS: dict[str, Any] = {"pytorch-lightning_version": lightning.__version__, "lr_schedulers": []}
SCHEDULERS = "lr_schedulers"
WEIGHTS = "state_dict"
OPTIMIZERS = "optimizer_states"


def with_trainer_keys(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with what the Trainer's loader requires, each LR scheduler's state under ``lr_schedulers``."""
    schedulers = [value for value in state.values() if isinstance(value, LRScheduler)]
    if schedulers and SCHEDULERS in state:
        raise ZeroConfigError(
            "The state holds LR schedulers and an `lr_schedulers` entry: pass the schedulers alone (they are saved"
            " under `lr_schedulers`)."
        )
    rest = {key: value for key, value in state.items() if not isinstance(value, LRScheduler)}
    saved = {SCHEDULERS: [scheduler.state_dict() for scheduler in schedulers]} if schedulers else {}
    return {**TRAINER_KEYS, **rest, **saved}


def load_with_schedulers(
    state: dict[str, Any], strict: bool, load: Callable[[dict[str, Any]], dict[str, Any]]
) -> dict[str, Any]:
    """``load(state without its LR schedulers)`` (a backend's load), then each scheduler from the checkpoint's
    ``lr_schedulers``, in order, and its optimizer's learning rates from it; returns what was not restored."""
    schedulers = [value for value in state.values() if isinstance(value, LRScheduler)]
    others = {key: value for key, value in state.items() if not isinstance(value, LRScheduler)}
    rest = load(others)
    state.update(others)  # the backend's load moves the requested entries into the dict it was given
    if not schedulers:
        return rest
    saved = rest.pop(SCHEDULERS, [])
    if strict and len(saved) != len(schedulers):
        raise ZeroConfigError(
            f"The checkpoint holds {len(saved)} LR scheduler state(s), the state passes {len(schedulers)}: pass as"
            " many schedulers as it was saved with, or `strict=False`."
        )
    for scheduler, scheduler_state in zip(schedulers, saved, strict=False):
        scheduler.load_state_dict(scheduler_state)
        # A weights-only resume left a fresh optimizer at its first rates (a carried one has these already).
        for group, rate in zip(scheduler.optimizer.param_groups, scheduler.get_last_lr(), strict=True):
            group["lr"] = rate
    return rest


def saved_optimizer_states(
    checkpoint: dict[str, Any], optimizers: list[tuple[str, Optimizer]], strict: bool
) -> list[tuple[Optimizer, Any]]:
    """Each optimizer of a state beside its state in a one-file checkpoint's ``optimizer_states`` (taken out of
    ``checkpoint``); a count that differs is one line unless not ``strict``."""
    saved = checkpoint.pop(OPTIMIZERS, [])
    if strict and len(saved) != len(optimizers):
        raise ZeroConfigError(
            f"The checkpoint holds {len(saved)} optimizer state(s), the state passes {len(optimizers)} optimizer(s):"
            " pass as many as it was saved with, or `strict=False`."
        )
    return [(optimizer, state) for (_, optimizer), state in zip(optimizers, saved, strict=False)]


def the_module(state: dict[str, Any]) -> tuple[str, nn.Module]:
    """The key and value of the one model in ``state``."""
    modules = [(key, value) for key, value in state.items() if isinstance(value, nn.Module)]
    if len(modules) != 1:
        raise ZeroConfigError(
            f"A checkpoint holds one model set up by `fabric.setup`, but the state has {len(modules)}: pass it as"
            " `{'model': model, 'optimizer': optimizer, ...}`."
        )
    return modules[0]


def optimizers_of(state: dict[str, Any]) -> list[tuple[str, Optimizer]]:
    """The key and value of each optimizer in ``state``, in order."""
    return [(key, value) for key, value in state.items() if isinstance(value, Optimizer)]


def sharded_keys(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with the model under ``state_dict`` and the optimizers under ``optimizer_0``, ``optimizer_1``...:
    the names of a Trainer's sharded (``torch.distributed.checkpoint``) directory."""
    module_key, module = the_module(state)
    optimizers = optimizers_of(state)
    taken = {module_key, *(key for key, _ in optimizers)}
    renamed = {f"optimizer_{index}": optimizer for index, (_, optimizer) in enumerate(optimizers)}
    rest = {key: value for key, value in state.items() if key not in taken}
    clash = sorted({WEIGHTS, *renamed} & rest.keys())
    if clash:
        raise ZeroConfigError(
            f"The state's entries {clash} are the Trainer's names for the model and optimizers: rename them."
        )
    return {WEIGHTS: module, **renamed, **rest}


def is_stateful(value: Any) -> bool:
    """Whether ``value`` saves and loads its state (``state_dict``, ``load_state_dict``), as Fabric's states do."""
    return hasattr(value, "state_dict") and hasattr(value, "load_state_dict")


def plain(entries: dict[str, Any]) -> dict[str, Any]:
    """``entries`` with each stateful value replaced by its state dict, as written to a checkpoint."""
    return {key: value.state_dict() if is_stateful(value) else value for key, value in entries.items()}


def restore_entries(checkpoint: dict[str, Any], state: dict[str, Any], strict: bool) -> dict[str, Any]:
    """Move the entries ``state`` asks for (other than its model and optimizers) from ``checkpoint`` into it, loading
    stateful ones in place; returns the rest of ``checkpoint`` (without the internal weights-only mark)."""
    checkpoint.pop(WEIGHTS_ONLY_KEY, None)
    for key, value in state.items():
        if isinstance(value, (nn.Module, Optimizer)):
            continue
        if key not in checkpoint:
            if strict:
                raise ZeroConfigError(
                    f"The checkpoint has no entry {key!r} that the state asks for: leave it out, or `strict=False`."
                )
            continue
        saved = checkpoint.pop(key)
        if is_stateful(value):
            value.load_state_dict(saved)
        else:
            state[key] = saved
    return checkpoint
