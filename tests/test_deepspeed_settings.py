"""One frozen value from a preset or a config file to the engine's config: the strategy holds it, and its typed
config and DeepSpeed config are that value's (no engine runs here)."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
from typing import Any

import pytest

from lightning_zero.errors import ZeroConfigError
from lightning_zero.presets import PRESETS, Preset
from lightning_zero.strategies.deepspeed import ZeroStrategy
from lightning_zero.strategies.deepspeed_config import DeepSpeedZeroConfig, TrainerValues
from lightning_zero.strategies.deepspeed_settings import DeepSpeedSettings, OptimizerValues

VALUES = TrainerValues(micro_batch_size=8, accumulate_grad_batches=2, precision="32-true")
MODULE_AUTOS: dict[str, Any] = {
    "zero_optimization": {"stage": 2},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto", "warmup_num_steps": 2}},
}
DEEPSPEED_PRESETS = [p for p in PRESETS if p.backend == "deepspeed" and "nvme" not in p.name]


def test_settings_are_frozen_and_hand_out_copies() -> None:
    section = {"stage": 3}
    settings = DeepSpeedSettings.from_deepspeed(
        {"zero_optimization": section, "train_micro_batch_size_per_gpu": "auto"}
    )
    section["stage"] = 1  # the caller's dict is not the settings' own
    handed = settings.deepspeed_dict()
    handed["zero_optimization"]["stage"] = 2  # nor is what they hand out
    assert settings.deepspeed_dict()["zero_optimization"]["stage"] == 3 and settings.zero.stage == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.zero = DeepSpeedZeroConfig()  # type: ignore[misc]
    with pytest.raises(ZeroConfigError, match="cannot be changed once built"):
        settings.given["zero_optimization"]["stage"] = 1


@pytest.mark.parametrize("preset", DEEPSPEED_PRESETS, ids=lambda p: p.name)
def test_a_presets_settings_read_back_from_its_deepspeed_config_are_the_same_run(preset: Preset) -> None:
    ours = DeepSpeedSettings.from_zero(DeepSpeedZeroConfig(**preset.fields)).with_trainer(VALUES)
    read_back = DeepSpeedSettings.from_deepspeed(ours.given).with_trainer(VALUES)
    assert read_back.deepspeed_dict() == ours.deepspeed_dict()
    placement = ("stage", "offload_optimizer", "offload_parameters", "bf16_optimizer_states", "zenflow")
    assert [getattr(read_back.zero, name) for name in placement] == [getattr(ours.zero, name) for name in placement]


def test_each_resolution_starts_from_what_was_given() -> None:
    settings = DeepSpeedSettings.from_zero(DeepSpeedZeroConfig())
    assert settings.deepspeed_dict()["train_micro_batch_size_per_gpu"] == "auto"  # nothing known yet
    first = settings.with_trainer(VALUES)
    # Resolving the first result again would find 8 explicit and refuse 4: resolution is from `given` each time.
    second = first.with_trainer(dataclasses.replace(VALUES, micro_batch_size=4, precision="bf16-mixed"))
    assert first.deepspeed_dict()["train_micro_batch_size_per_gpu"] == 8
    assert second.deepspeed_dict()["train_micro_batch_size_per_gpu"] == 4 and second.deepspeed_dict()["bf16"]
    assert "bf16" not in first.deepspeed_dict()


def test_the_optimizer_fills_its_sections_once_the_trainer_has_filled_the_rest() -> None:
    settings = DeepSpeedSettings.from_deepspeed(MODULE_AUTOS).with_trainer(VALUES)
    assert settings.needs_optimizer
    optimizer = OptimizerValues({"lr": 3e-4, "weight_decay": 0.1, "eps": 1e-8}, total_steps=100)
    done = settings.with_optimizer(optimizer)
    assert not done.needs_optimizer
    config = done.deepspeed_dict()
    assert config["optimizer"]["params"] == {"lr": 3e-4, "weight_decay": 0.1}
    assert config["scheduler"]["params"] == {"total_num_steps": 100, "warmup_num_steps": 2}
    assert config["train_micro_batch_size_per_gpu"] == 8
    with pytest.raises(ValueError, match="Trainer's values have filled first"):
        DeepSpeedSettings.from_deepspeed(MODULE_AUTOS).with_optimizer(optimizer)


def test_a_contradiction_is_refused_when_the_values_arrive() -> None:
    settings = DeepSpeedSettings.from_deepspeed({"gradient_accumulation_steps": 4})
    with pytest.raises(ZeroConfigError, match=r"gradient_accumulation_steps: 4.*accumulate_grad_batches=2"):
        settings.with_trainer(VALUES)


def test_the_strategys_typed_and_deepspeed_configs_are_its_settings() -> None:
    strategy = ZeroStrategy(zero=DeepSpeedZeroConfig(stage=3, offload_optimizer="cpu"))
    assert strategy.zero is strategy.settings.zero
    assert strategy.config == strategy.settings.deepspeed_dict() and isinstance(strategy.config, dict)
    strategy.settings = strategy.settings.with_trainer(VALUES)
    assert strategy.config["train_micro_batch_size_per_gpu"] == 8 and strategy.zero_stage_3


@pytest.mark.parametrize(
    "change",
    [
        lambda config: config.__setitem__("zero_force_ds_cpu_optimizer", True),
        lambda config: config["zero_optimization"].__setitem__("stage", 1),  # a section too
        lambda config: config["zero_optimization"]["offload_optimizer"].update(device="none"),
        lambda config: config.setdefault("optimizer", {}),
        lambda config: config.pop("bf16"),
    ],
    ids=["set", "set_in_a_section", "update_nested", "setdefault", "pop"],
)
def test_a_change_to_the_strategys_config_is_a_one_line_error_not_ignored(change: Any) -> None:
    strategy = ZeroStrategy(zero=DeepSpeedZeroConfig(stage=3, offload_optimizer="cpu"))
    before = strategy.settings
    with pytest.raises(ZeroConfigError, match=r"give the change when building it \(`deepspeed_config=`"):
        change(strategy.config)
    with pytest.raises(ZeroConfigError, match="cannot be changed once built"):
        strategy.config = {"zero_optimization": {"stage": 1}}
    assert strategy.settings is before


def test_setting_a_value_the_config_already_has_is_no_change() -> None:
    strategy = ZeroStrategy(zero=DeepSpeedZeroConfig(stage=2))
    strategy.config["zero_force_ds_cpu_optimizer"] = False  # as Lightning's own tests do; it is already False
    strategy.config["zero_optimization"].update(stage=2)
    strategy.config.setdefault("zero_allow_untested_optimizer", True)
    assert strategy.config == strategy.settings.deepspeed_dict()


def test_copies_of_the_strategys_config_are_plain_dicts_to_change() -> None:
    config = ZeroStrategy(zero=DeepSpeedZeroConfig(stage=3)).config
    for copied in (copy.copy(config), copy.deepcopy(config), pickle.loads(pickle.dumps(config))):
        assert type(copied) is dict and copied == config
        copied["zero_optimization"]["stage"] = 1  # sections included
    assert config["zero_optimization"]["stage"] == 3
    assert json.loads(json.dumps(config)) == config
