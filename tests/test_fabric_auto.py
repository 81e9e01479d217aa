"""``zero_auto`` under Lightning Fabric (:mod:`lightning_zero.fabric.auto`): the layout chosen from the memory plan,
pure on CPU (its 2-process run is in the shared Fabric launch: tests/test_fabric.py)."""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest

from lightning_zero.errors import ZeroConfigError
from lightning_zero.fabric.auto import TRIAL_FIELDS, FabricAutoZeroConfig, FabricZeroAutoStrategy, plan_choice
from lightning_zero.memory.states import ParameterShapes
from tests.helpers.tiny import TinyLM

#: The tiny GPT-2's model states per device on 2 processes (fp32, Adam): about 0.34 MiB under ZeRO-2, 0.22 MiB
#: under ZeRO-3, 0.06 MiB under ZeRO-3 offload. These budgets leave 75% of themselves for them.
ROOMY, ZERO3, OFFLOAD, TOO_SMALL = 1e-3, 5e-4, 2e-4, 1e-4
HOST = 10**11
TRIAL_VALUES: dict[str, Any] = {
    "batch_size": 8,
    "batch_arg_name": "bs",
    "max_micro_batch": 4,
    "max_trials": 2,
    "trial_steps": 5,
    "warmup_steps": 2,
    "cache_file": "choices.json",
    "approximate": True,
}


def _choice(budget: float, host: int = HOST, **fields: Any) -> str:
    shapes = ParameterShapes.of(TinyLM())
    candidate, _ = plan_choice(shapes, FabricAutoZeroConfig(**fields), budget, 2, 1, "32-true", False, host)
    return candidate.layout.name


def test_the_choice_is_the_least_memory_saving_layout_whose_model_states_fit() -> None:
    assert [_choice(budget) for budget in (ROOMY, ZERO3, OFFLOAD)] == ["zero2", "zero3", "zero3_offload"]


def test_the_share_left_for_activations_moves_the_choice() -> None:
    assert _choice(ROOMY, activation_share=0.5) == "zero3"
    assert _choice(ZERO3, activation_share=0.3) == "zero3_offload_opt"  # optimizer offloaded, parameters kept


def test_activation_checkpointing_is_kept_in_the_layout_chosen() -> None:
    assert _choice(ROOMY, activation_checkpointing=True) == "zero2+ckpt"


def test_offload_is_not_chosen_when_the_host_lacks_the_memory() -> None:
    with pytest.raises(ZeroConfigError):
        _choice(OFFLOAD, host=0)


def test_no_layout_that_fits_is_one_line_naming_the_fixes() -> None:
    with pytest.raises(ZeroConfigError) as error:
        _choice(TOO_SMALL)
    message = str(error.value)
    assert "\n" not in message and "raise the budget, lower `activation_share`, or add devices" in message


@pytest.mark.parametrize("name", TRIAL_FIELDS)
def test_a_field_of_the_trials_is_one_line_naming_the_trainer(name: str) -> None:
    assert TRIAL_VALUES.keys() == set(TRIAL_FIELDS)
    with pytest.raises(ZeroConfigError) as error:
        FabricAutoZeroConfig(**{name: TRIAL_VALUES[name]})
    assert "\n" not in str(error.value) and f"`{name}`" in str(error.value) and "the Trainer" in str(error.value)


@pytest.mark.parametrize("share", [-0.1, 1.0])
def test_a_share_outside_zero_to_one_is_one_line(share: float) -> None:
    with pytest.raises(ZeroConfigError, match="activation_share"):
        FabricAutoZeroConfig(activation_share=share)


def test_zero_auto_by_name_is_the_fabric_strategy() -> None:
    assert isinstance(L.Fabric(accelerator="cpu", devices=2, strategy="zero_auto").strategy, FabricZeroAutoStrategy)
