"""A Fabric state under the Trainer's checkpoint keys and back (lightning_zero.fabric.trainer_format), in one
process: the names each backend's Fabric save writes, the LR schedulers both ways, and one-line errors."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from lightning_zero import ZeroConfigError
from lightning_zero.fabric.trainer_format import (
    TRAINER_KEYS,
    load_with_schedulers,
    restore_entries,
    sharded_keys,
    with_trainer_keys,
)


def model_optimizer_scheduler() -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=0.5, total_iters=4)
    return model, optimizer, scheduler


def test_a_save_puts_the_schedulers_under_the_trainers_key_and_adds_what_its_loader_requires() -> None:
    model, optimizer, scheduler = model_optimizer_scheduler()
    optimizer.step()
    scheduler.step()
    saved = with_trainer_keys({"model": model, "optimizer": optimizer, "scheduler": scheduler, "step": 1})
    assert saved["lr_schedulers"] == [scheduler.state_dict()]
    assert "scheduler" not in saved and saved["step"] == 1 and saved["model"] is model
    assert saved["pytorch-lightning_version"] == TRAINER_KEYS["pytorch-lightning_version"]
    assert with_trainer_keys({"model": model})["lr_schedulers"] == []


def test_a_state_with_schedulers_and_its_own_lr_schedulers_entry_is_one_line() -> None:
    model, _, scheduler = model_optimizer_scheduler()
    with pytest.raises(ZeroConfigError) as error:
        with_trainer_keys({"model": model, "scheduler": scheduler, "lr_schedulers": []})
    assert "\n" not in str(error.value)


def test_a_load_gives_each_scheduler_its_saved_state_and_the_backend_the_rest() -> None:
    model, optimizer, scheduler = model_optimizer_scheduler()
    saved = {"last_epoch": 3, "_last_lr": [0.625]}
    given: list[dict[str, Any]] = []

    def backend_load(state: dict[str, Any]) -> dict[str, Any]:
        given.append(dict(state))
        state["step"] = 3  # a backend's load moves requested entries into the dict it was given
        return {"lr_schedulers": [{**scheduler.state_dict(), **saved}], "loops": {}}

    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "step": 0}
    rest = load_with_schedulers(state, True, backend_load)
    assert set(given[0]) == {"model", "optimizer", "step"}
    assert scheduler.last_epoch == 3 and scheduler.get_last_lr() == [0.625]
    assert state["step"] == 3 and rest == {"loops": {}}
    assert optimizer.param_groups[0]["lr"] == 0.625  # the backend's load left it at 1.0, as a weights-only one does


def test_a_load_with_more_schedulers_than_saved_is_one_line_unless_not_strict() -> None:
    model, optimizer, scheduler = model_optimizer_scheduler()
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
    with pytest.raises(ZeroConfigError) as error:
        load_with_schedulers(state, True, lambda _: {"lr_schedulers": []})
    assert "\n" not in str(error.value) and "`strict=False`" in str(error.value)
    assert load_with_schedulers(state, False, lambda _: {"lr_schedulers": []}) == {}
    assert scheduler.last_epoch == 0


def test_sharded_keys_are_the_trainers_names_for_the_model_and_optimizers() -> None:
    model, optimizer, _ = model_optimizer_scheduler()
    second = torch.optim.SGD(model.parameters(), lr=0.1)
    renamed = sharded_keys({"net": model, "opt": optimizer, "other": second, "step": 2})
    assert renamed == {"state_dict": model, "optimizer_0": optimizer, "optimizer_1": second, "step": 2}
    with pytest.raises(ZeroConfigError) as error:
        sharded_keys({"model": model, "state_dict": {}})
    assert "\n" not in str(error.value)
    with pytest.raises(ZeroConfigError, match="but the state has 2"):
        sharded_keys({"a": model, "b": nn.Linear(1, 1)})


def test_restore_entries_loads_stateful_entries_in_place_and_names_a_missing_one() -> None:
    model, optimizer, scheduler = model_optimizer_scheduler()
    state: dict[str, Any] = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "step": 0}
    rest = restore_entries({"scheduler": {**scheduler.state_dict(), "last_epoch": 2}, "step": 5, "x": 1}, state, True)
    assert scheduler.last_epoch == 2 and state["step"] == 5 and rest == {"x": 1}
    with pytest.raises(ZeroConfigError) as error:
        restore_entries({}, {"model": model, "step": 0}, True)
    assert "\n" not in str(error.value) and "'step'" in str(error.value)
    assert restore_entries({}, {"model": model, "step": 0}, False) == {}
