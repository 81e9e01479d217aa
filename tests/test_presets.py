"""Every preset resolves by name through Lightning's own registry; bad names are one-line errors."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
from lightning.pytorch.strategies import StrategyRegistry

from lightning_zero import ZeroStrategy, build_preset, preset_names
from lightning_zero.errors import ZeroConfigError
from lightning_zero.presets import PRESETS, Preset, check_strategy_name, get_preset, register_presets

DEEPSPEED = [p for p in PRESETS if p.backend == "deepspeed"]


@pytest.mark.parametrize("preset", [p for p in DEEPSPEED if "nvme" not in p.name], ids=lambda p: p.name)
def test_trainer_resolves_each_deepspeed_preset(preset: Preset) -> None:
    trainer = L.Trainer(strategy=preset.name, accelerator="cpu", devices=2, logger=False)
    strategy = trainer.strategy
    assert isinstance(strategy, ZeroStrategy)
    for field, value in preset.fields.items():
        assert getattr(strategy.zero, field) == value
    assert strategy.config is not None
    assert strategy.config["zero_optimization"]["stage"] == preset.fields["stage"]


def test_all_presets_are_registered() -> None:
    assert set(preset_names()) <= set(StrategyRegistry)
    assert {"zero1", "zero2", "zero2_offload", "zero3", "zero3_offload", "zero3_offload_nvme"} <= set(preset_names())


def test_nvme_preset_by_name_needs_a_path(tmp_path: Path) -> None:
    with pytest.raises(ZeroConfigError, match="nvme_path"):
        L.Trainer(strategy="zero3_offload_nvme", accelerator="cpu", devices=2, logger=False)
    strategy = build_preset("zero3_offload_nvme", nvme_path=str(tmp_path))
    offload = strategy.config["zero_optimization"]["offload_param"]
    assert offload == {**offload, "device": "nvme", "nvme_path": str(tmp_path)}


def test_preset_overrides_are_validated() -> None:
    assert build_preset("zero3", prefetch_bucket_size=1000).zero.prefetch_bucket_size == 1000
    with pytest.raises(ZeroConfigError, match="'prefetch'"):
        build_preset("zero3", prefetch=1000)


def test_unknown_names_suggest_the_closest() -> None:
    with pytest.raises(ZeroConfigError, match="did you mean 'zero3'") as error:
        check_strategy_name("zreo3")
    assert "\n" not in str(error.value)
    with pytest.raises(ZeroConfigError, match="did you mean 'zero2_offload'"):
        build_preset("zero2_ofload")
    check_strategy_name("ddp")


def test_zero_and_deepspeed_config_together_is_an_error() -> None:
    with pytest.raises(ZeroConfigError, match="not both"):
        ZeroStrategy(zero={"stage": 2}, deepspeed_config={"zero_optimization": {"stage": 2}})  # type: ignore[arg-type]


def test_strategy_takes_a_deepspeed_config_dict() -> None:
    strategy = ZeroStrategy(deepspeed_config={"zero_optimization": {"stage": 1}})
    assert strategy.config == {"zero_optimization": {"stage": 1}}


def test_a_name_registered_by_another_package_is_not_shadowed() -> None:
    from lightning.fabric.strategies.registry import _StrategyRegistry

    registry = _StrategyRegistry()

    def theirs() -> None: ...

    registry.register("zero2", theirs, description="someone else's")
    with pytest.warns(UserWarning, match=r"'zero2' is already registered by another package"):
        register_presets(registry)
    assert registry["zero2"]["strategy"] is theirs
    register_presets(registry)  # again: our own entries are replaced without a word
    assert registry["zero3"]["description"] == get_preset("zero3").description
