"""Validation of the typed config: every bad value is a one-line error that names the fix."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from lightning_zero.errors import ZeroConfigError
from lightning_zero.strategies import DeepSpeedZeroConfig


def one_line_error(callable_: Callable[..., object], *args: object, **kwargs: object) -> str:
    with pytest.raises(ZeroConfigError) as error:
        callable_(*args, **kwargs)
    message = str(error.value)
    assert "\n" not in message
    return message


def test_stage_4_is_refused() -> None:
    assert "set `stage` to one of them" in one_line_error(DeepSpeedZeroConfig, stage=4)


def test_parameter_offload_needs_stage_3() -> None:
    assert "stage: 3" in one_line_error(DeepSpeedZeroConfig, stage=2, offload_parameters="cpu")


def test_unknown_offload_device() -> None:
    assert "offload_optimizer" in one_line_error(DeepSpeedZeroConfig, offload_optimizer="gpu")


def test_nvme_offload_needs_an_existing_path(tmp_path: Path) -> None:
    assert "nvme_path" in one_line_error(DeepSpeedZeroConfig, stage=3, offload_parameters="nvme")
    missing = tmp_path / "nope"
    assert str(missing) in one_line_error(
        DeepSpeedZeroConfig, stage=3, offload_parameters="nvme", nvme_path=str(missing)
    )
    config = DeepSpeedZeroConfig(stage=3, offload_parameters="nvme", nvme_path=str(tmp_path))
    assert config.nvme_path == str(tmp_path)


def test_unknown_key_lists_the_valid_ones() -> None:
    message = one_line_error(DeepSpeedZeroConfig.from_dict, {"stage": 2, "stagee": 3})
    assert "'stagee'" in message and "'stage'" in message


def test_coerce_accepts_mapping_instance_and_none() -> None:
    assert DeepSpeedZeroConfig.coerce(None) == DeepSpeedZeroConfig()
    assert DeepSpeedZeroConfig.coerce({"stage": 3}).stage == 3
    config = DeepSpeedZeroConfig(stage=1)
    assert DeepSpeedZeroConfig.coerce(config) is config


def test_replace_validates_again() -> None:
    assert DeepSpeedZeroConfig().replace(stage=3).stage == 3
    one_line_error(DeepSpeedZeroConfig().replace, stage=7)
    one_line_error(DeepSpeedZeroConfig().replace, bucket=1)
