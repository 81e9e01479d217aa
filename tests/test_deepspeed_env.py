"""Lightning's ``PL_DEEPSPEED_CONFIG_PATH``: read when a ZeroStrategy is given no config, checked as a
``deepspeed_config=`` file is; a preset, which has its own settings, says in one warning that it is not read."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from lightning.pytorch.strategies import DeepSpeedStrategy

from lightning_zero import ZeroConfigError, ZeroStrategy, build_preset

VARIABLE = DeepSpeedStrategy.DEEPSPEED_ENV_VAR


def config_file(tmp_path: Path, content: dict) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(content))
    return str(path)


def test_the_variable_is_lightnings() -> None:
    assert VARIABLE == "PL_DEEPSPEED_CONFIG_PATH"


def test_a_strategy_given_no_config_runs_from_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VARIABLE, config_file(tmp_path, {"zero_optimization": {"stage": 3, "offload_param": {}}}))
    strategy = ZeroStrategy()
    assert strategy.zero.stage == 3  # the default is stage 2
    assert strategy.config["zero_optimization"]["stage"] == 3


def test_the_file_is_checked_like_a_deepspeed_config_argument(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VARIABLE, config_file(tmp_path, {"zero_optimisation": {"stage": 3}}))
    with pytest.raises(ZeroConfigError, match="did you mean `zero_optimization`"):
        ZeroStrategy()


def test_a_missing_file_is_one_error_naming_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VARIABLE, str(tmp_path / "missing.json"))
    with pytest.raises(ZeroConfigError, match=f"{VARIABLE} is .*missing.json', which is not a file: .* or unset it"):
        ZeroStrategy()


def test_a_preset_keeps_its_settings_and_warns_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VARIABLE, config_file(tmp_path, {"zero_optimization": {"stage": 1}}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        strategy = build_preset("zero3")
    messages = [str(warning.message) for warning in caught if VARIABLE in str(warning.message)]
    assert strategy.zero.stage == 3
    assert len(messages) == 1 and "ZeroStrategy(deepspeed_config=" in messages[0], messages


def test_without_the_variable_the_default_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ZeroStrategy().zero.stage == 2
